"""The worker side of lateness_memory.py: handlers and a ``job_dispatched`` receiver.

The worker imports this module through ``[worker] imports``. Every dispatch and every start of
the every-second task is appended to ``$BENCH_LATENESS_LOG`` as ``dispatch JOB SLOT AT`` and
``start JOB AT`` (Unix seconds): lateness is AT - SLOT.

Run as a script (``python _lateness_app.py``) it is the worker itself, for a checkout without
``scheduler/cli.py``: tick every ``tick_interval``, and in between run ready jobs through the
public API.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from scheduler import Scheduler, signals

app = Scheduler.from_toml(os.environ["SCHEDULER_CONFIG"])
_log = open(os.environ["BENCH_LATENESS_LOG"], "a", buffering=1)  # open for the process's life


@app.handler("bench.every_second", retry_safe=True)
def every_second(job: Any) -> None:
    _log.write(f"start {job.id} {time.time():.6f}\n")


@app.handler("bench.noop", retry_safe=True)
def noop(job: Any) -> None:
    pass


@signals.job_dispatched.connect
def dispatched(sender: str, **kw: Any) -> None:
    _log.write(f"dispatch {kw['job_id']} {kw['slot'].timestamp():.6f} {time.time():.6f}\n")


def _loop() -> None:
    stopping = False

    def stop(*_args: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    interval = app.settings.tick_interval
    next_tick = time.monotonic()
    while not stopping:
        now = time.monotonic()
        if now >= next_tick:
            next_tick = max(next_tick + interval, now)
            app.tick()
        if app.work(limit=100) == 0:
            time.sleep(max(0.0, next_tick - time.monotonic()))
    app.close()


if __name__ == "__main__":
    _loop()
