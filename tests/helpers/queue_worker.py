"""Real worker processes for the race and crash tests, plus a settable clock.

As a script, a worker that gets killed mid-job::

    python queue_worker.py crash URL HANDLER RETRY_SAFE MARKER_DIR LEASE_SECONDS

It registers ``HANDLER`` (``RETRY_SAFE`` is ``1`` or ``0``) whose body appends ``run <pid>`` to
``MARKER_DIR/HANDLER.runs``, creates ``MARKER_DIR/HANDLER.started``, then sleeps for a minute:
the test kills it with SIGKILL long before that. The process's worker id is ``victim``.

Imported, :func:`race_worker` is a ``multiprocessing`` (spawn) target that calls ``work()`` on
a shared job set and records every handler call in an append-only file.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from scheduler import Scheduler
from scheduler._model.handlers import Registry

RACE_HANDLER = "race.job"


class Clock:
    """A settable clock for ``Scheduler(clock=...)``: aware UTC, moved by the test only."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> datetime:
        self.now += timedelta(**kwargs)
        return self.now


def append_line(path: Path | str, line: str) -> None:
    """One ``write`` on an ``O_APPEND`` descriptor: lines from many processes never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def race_worker(url: str, out: str, start: Any, worker_id: str) -> None:
    """Wait at the start line (``start``: a barrier of every racer and the test), then run
    ready jobs until none is left."""
    app = Scheduler(url, registry=Registry(), worker_id=worker_id)

    @app.handler(RACE_HANDLER)
    def run(job: Any) -> None:
        append_line(out, f"{job.id} {worker_id}")
        time.sleep(0.01)  # long enough for the other processes to reach the same jobs

    app.check_schema()  # connect before the start line so all processes begin together
    start.wait(120)  # BrokenBarrierError if the others never came
    app.work()
    app.close()


def crash_worker(
    url: str, handler: str, retry_safe: bool, marker_dir: Path, lease_seconds: float
) -> None:
    app = Scheduler(url, registry=Registry(), worker_id="victim", lease_seconds=lease_seconds)

    def abandoned(job: Any) -> None:  # never reached here: the process dies first
        append_line(marker_dir / f"{handler}.abandoned", f"victim {os.getpid()}")

    @app.handler(handler, retry_safe=retry_safe, abandoned=abandoned)
    def body(job: Any) -> None:
        append_line(marker_dir / f"{handler}.runs", f"run {os.getpid()}")
        (marker_dir / f"{handler}.started").touch()
        time.sleep(60)

    app.work()


if __name__ == "__main__":
    if len(sys.argv) != 7 or sys.argv[1] != "crash":
        sys.exit(__doc__)
    _, _, url, name, safe, marker, lease = sys.argv
    crash_worker(url, name, safe == "1", Path(marker), float(lease))
