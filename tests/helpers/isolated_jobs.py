"""Handlers for ``isolation = "process"`` tests and benchmarks: module-level functions, which a
spawned child imports by name. Each writes what it saw to ``payload["out"]`` (a JSON file)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from scheduler import PermanentError


def _write(job: Any, **seen: Any) -> None:
    Path(job.payload["out"]).write_text(json.dumps({"pid": os.getpid(), **seen}))


def busy(job: Any) -> None:
    """A pure-Python loop that never checks: only a signal stops it."""
    _write(job)
    n = 0
    while True:
        n += 1


def stubborn(job: Any) -> None:
    """Ignores SIGTERM, then blocks in C (``time.sleep``): only SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _write(job)
    time.sleep(120)


def reports(job: Any) -> None:
    """Writes the job API it sees; heartbeats; checks."""
    job.heartbeat()
    job.check()
    _write(
        job,
        id=job.id,
        handler=job.handler,
        payload=job.payload,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        queue=job.queue,
        slot=None if job.slot is None else job.slot.isoformat(),
        cancel_requested=job.cancel_requested,
    )


def refuses(job: Any) -> None:
    raise PermanentError("bad_input")


def cpu(job: Any) -> None:
    """CPU-bound work: ``payload["n"]`` rounds of a pure-Python loop (the benchmark's job)."""
    total = 0
    for i in range(job.payload["n"]):
        total += i * i % 7
    job.payload["total"] = total


IMPORTED_IN = os.getpid()  # the process that imported this module: the fork server, preloaded


def where_imported(job: Any) -> None:
    """Writes the child's pid, the pid that imported this module, and whether the scheduler's
    worker module was imported before the child ran (the fork server's preload)."""
    import sys

    _write(job, imported_in=IMPORTED_IN, worker_module="scheduler._worker.runner" in sys.modules)
