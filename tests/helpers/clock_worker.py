"""A real worker process for the clock and lock tests, run as a script::

    [faketime -f +5m] python clock_worker.py URL OUT_DIR WORKER_ID SECONDS [CLOCK [TICK]]

It runs :class:`scheduler._worker.Worker` (tick every ``TICK`` seconds, default 0.25; 4
threads, 5 s leases) for ``SECONDS`` seconds, on the clock ``CLOCK`` names (``database`` or
``local``; ``-`` or nothing: the default). Its handlers:

- ``clk.job`` (not retry-safe: a job taken over from it would be abandoned): sleeps 0.2-0.8 s;
- ``clk.fast`` (retry-safe): returns at once.

Every ``job_dispatched`` signal it sends is appended to ``OUT_DIR/dispatched.jsonl`` as
``{"worker", "row", "job_id", "slot"}``, every handler call to ``OUT_DIR/runs.jsonl``, one
``os.write`` per line. At the end it prints its measured clock offset and how many ticks it
ran as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
from datetime import datetime
from typing import Any

from scheduler import Scheduler, signals
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker


def append(path: str, record: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(threadName)s %(message)s")
    url, out, worker_id, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None
    tick = float(sys.argv[6]) if len(sys.argv) > 6 else 0.25
    registry = Registry()
    app = Scheduler(
        url,
        registry=registry,
        worker_id=worker_id,
        clock=mode,
        tick_interval=tick,
        lease_seconds=5.0,
        concurrency=4,
        shutdown_grace_seconds=5.0,
    )

    @registry.handler("clk.job", retry_safe=False)
    def slow(job: Any) -> None:
        append(f"{out}/runs.jsonl", {"worker": worker_id, "job_id": job.id})
        # Not time.sleep: under faketime its clock_nanosleep fails (EINVAL).
        threading.Event().wait(random.uniform(0.2, 0.8))

    @registry.handler("clk.fast", retry_safe=True)
    def fast(job: Any) -> None:
        append(f"{out}/runs.jsonl", {"worker": worker_id, "job_id": job.id})

    def dispatched(sender: str, *, job_id: int, slot: datetime, **_kw: Any) -> None:
        record = {"worker": worker_id, "row": sender, "job_id": job_id, "slot": slot.isoformat()}
        append(f"{out}/dispatched.jsonl", record)

    signals.job_dispatched.connect(dispatched)
    worker = Worker(app)
    ticks = [0]  # the ticks it ran (which host wins a slot's dispatch is a race)
    tick = worker._tick

    def counted() -> bool:
        ticks[0] += 1
        return tick()

    worker._tick = counted  # type: ignore[method-assign]
    threading.Timer(seconds, worker.stop).start()
    worker.run()
    found = {"worker": worker_id, "offset": app.clock_offset(), "mode": app.clock_mode}
    print(json.dumps({**found, "ticks": ticks[0]}))
    app.close()


if __name__ == "__main__":
    main()
