"""One of several scheduler processes racing over the same rows (run by test_tick_race.py).

Usage: ``python tick_race_worker.py URL DIR INDEX PROCESSES STEPS BASE_ISO``

Every process ticks the same simulated instants ``BASE + i minutes`` (i = 1 .. STEPS), each
followed by ``work()`` with its clock at that instant. A file barrier in DIR keeps them in step:
nobody ticks instant i + 1 before every process has ticked and worked instant i, so all of them
contend for every slot, and no slot is coalesced. Handler ``race.never`` is on a queue nobody
serves, so its job stays queued (overlap skip drops every later slot). Each process appends the
signals it sent to
``DIR/signals-INDEX.jsonl`` (a ``row_disabled`` receiver also reads the row back through a
new engine) and prints its summed tick report as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from scheduler import PermanentError, Scheduler, signals
from scheduler._model.handlers import Registry
from scheduler._model.report import TickReport
from scheduler.testing import ManualClock

BARRIER_TIMEOUT = 60.0
GLOBAL_LIMIT = 4


def write_progress(directory: Path, index: int, done: int) -> None:
    tmp = directory / f".progress-{index}.tmp"
    tmp.write_text(str(done))
    os.replace(tmp, directory / f"progress-{index}")


def wait_for_all(directory: Path, processes: int, done: int) -> None:
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while True:
        seen = []
        for i in range(processes):
            try:
                seen.append(int((directory / f"progress-{i}").read_text()))
            except (FileNotFoundError, ValueError):
                seen.append(-1)
        if min(seen) >= done:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"barrier {done} timed out: {seen}")
        time.sleep(0.001)


def main(url: str, directory: Path, index: int, processes: int, steps: int, base: datetime) -> None:
    clock = ManualClock(base)
    app = Scheduler(
        url,
        registry=Registry(),
        clock=clock,
        worker_id=f"racer-{index}",
        max_consecutive_failures=GLOBAL_LIMIT,
    )

    @app.handler("race.ok")
    def ok(job: Any) -> None:
        return None

    @app.handler("race.fail")
    def fail(job: Any) -> None:
        raise PermanentError("race_failure")

    @app.handler("race.never", queue="unserved")  # no racer claims it: its job stays queued
    def never(job: Any) -> None:
        raise AssertionError("the queue 'unserved' has no worker")

    out = os.open(directory / f"signals-{index}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def record(kind: str, **fields: Any) -> None:
        line = json.dumps({"signal": kind, "process": index, **fields}, default=str)
        os.write(out, (line + "\n").encode())

    def on_dispatched(sender: str, **kw: Any) -> None:
        record("dispatched", row=sender, job_id=kw["job_id"], slot=kw["slot"].isoformat())

    def on_skipped(sender: str, **kw: Any) -> None:
        record("skipped", row=sender, slot=kw["slot"].isoformat(), decision=kw["decision"])

    def on_rerun(sender: str, **kw: Any) -> None:
        record("rerun", row=sender, job_id=kw["job_id"], failures=kw["consecutive_failures"])

    def on_disabled(sender: str, **kw: Any) -> None:
        fresh = Scheduler(url, registry=Registry())
        try:
            seen = fresh.get_row(sender)
            assert seen is not None
            committed = (seen.enabled, seen.disabled_reason)
        finally:
            fresh.close()
        record(
            "row_disabled",
            row=sender,
            failures=kw["consecutive_failures"],
            code=kw["last_error_code"],
            alert_id=kw["alert_id"],
            seen_enabled=committed[0],
            seen_reason=committed[1],
        )

    totals = dict.fromkeys(TickReport().as_dict(), 0)
    with (
        signals.job_dispatched.connected_to(on_dispatched),
        signals.slot_skipped.connected_to(on_skipped),
        signals.job_rerun.connected_to(on_rerun),
        signals.row_disabled.connected_to(on_disabled),
    ):
        app.check_schema()  # connect before the start line
        write_progress(directory, index, 0)
        for i in range(1, steps + 1):
            wait_for_all(directory, processes, i - 1)
            now = clock.set(base + timedelta(minutes=i))
            report = app.tick(now=now)
            for outcome, names in report.as_dict().items():
                totals[outcome] += len(names)
            app.work()
            write_progress(directory, index, i)
    os.close(out)
    app.close()
    print(json.dumps(totals))


if __name__ == "__main__":
    url_arg, dir_arg, index_arg, procs_arg, steps_arg, base_arg = sys.argv[1:7]
    main(
        url_arg,
        Path(dir_arg),
        int(index_arg),
        int(procs_arg),
        int(steps_arg),
        datetime.fromisoformat(base_arg),
    )
