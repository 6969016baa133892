"""A scheduler process over a database of 4 shards (``[database] shards = 4``), for the tests of
shards on Citus (``tests/store/test_citus_shards.py``).

Usage::

    python shard_process.py tick URL DIR INDEX PROCESSES STEPS BASE_ISO
    python shard_process.py work URL DIR INDEX TENANTS

``tick``: one of several tickers racing over the same rows, as ``tick_race_worker.py`` does (a
file barrier in DIR keeps them in step: every process ticks the simulated instant
``BASE + i minutes`` before any ticks the next, so all of them contend for every slot); each
dispatch it made (its ``job_dispatched`` signal: task, slot, job id) is appended to
``DIR/dispatched-INDEX.jsonl``.

``work``: a worker of every shard (two threads) whose handler ``count`` appends its job's id to
``DIR/ran-INDEX``, and a thread that enqueues ``count`` jobs for the tenants ``t0`` ..
``t{TENANTS-1}`` in turn (so over every shard), each id appended to ``DIR/enqueued-INDEX`` once
the enqueue returned, an enqueue that raised to ``DIR/failed-INDEX``, until ``DIR/stop`` exists;
then the worker drains what is left and stops once ``DIR/drain`` exists and no job is ready.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tick_race_worker import wait_for_all, write_progress

from scheduler import Scheduler, signals
from scheduler._model.handlers import Registry
from scheduler._worker.shards import ShardedWorker
from scheduler.testing import ManualClock

SHARDS = 4


def append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def tick(url: str, directory: Path, index: int, processes: int, steps: int, base: datetime) -> None:
    clock = ManualClock(base)
    app = Scheduler(
        url, shards=SHARDS, registry=Registry(), clock=clock, worker_id=f"ticker-{index}"
    )
    app.handler("ok")(lambda job: None)
    out = directory / f"dispatched-{index}.jsonl"

    def on_dispatched(sender: str, **kw: Any) -> None:
        slot = kw["slot"].isoformat()
        append_line(out, json.dumps({"row": sender, "job_id": kw["job_id"], "slot": slot}))

    with signals.job_dispatched.connected_to(on_dispatched):
        app.check_schema()  # connect before the start line
        write_progress(directory, index, 0)
        for i in range(1, steps + 1):
            wait_for_all(directory, processes, i - 1)
            app.tick(now=clock.set(base + timedelta(minutes=i)))
            write_progress(directory, index, i)
    app.close()


def work(url: str, directory: Path, index: int, tenants: int) -> None:
    app = Scheduler(url, shards=SHARDS, registry=Registry(), worker_id=f"worker-{index}")
    ran = directory / f"ran-{index}"

    @app.handler("count")
    def count(job: Any) -> None:
        append_line(ran, str(job.id))

    def enqueue() -> None:
        n = 0
        while not (directory / "stop").exists():
            tenant = f"t{(n + index) % tenants}"
            n += 1
            try:
                job_id = app.enqueue("count", tenant=tenant)
            except Exception:
                append_line(
                    directory / f"failed-{index}", traceback.format_exc().replace("\n", " ")
                )
                continue
            append_line(directory / f"enqueued-{index}", str(job_id))
            time.sleep(0.002)

    worker = ShardedWorker(app, concurrency=2, serve_metrics=False)
    enqueuer = threading.Thread(target=enqueue, name="enqueuer")
    enqueuer.start()

    def stop_when_drained() -> None:
        while not (directory / "drain").exists():
            time.sleep(0.05)
        enqueuer.join()
        while any(shard.jobs(state="queued", limit=1) for shard in app.shards):
            time.sleep(0.1)
        worker.stop()

    threading.Thread(target=stop_when_drained, name="stopper", daemon=True).start()
    write_progress(directory, index, 1)
    worker.run()
    app.close()


if __name__ == "__main__":
    mode, url_arg, dir_arg, index_arg = sys.argv[1:5]
    if mode == "tick":
        procs_arg, steps_arg, base_arg = sys.argv[5:8]
        tick(
            url_arg,
            Path(dir_arg),
            int(index_arg),
            int(procs_arg),
            int(steps_arg),
            datetime.fromisoformat(base_arg),
        )
    else:
        work(url_arg, Path(dir_arg), int(index_arg), int(sys.argv[5]))
