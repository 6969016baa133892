"""Overlap ``replace``: a slot that finds the task's last job running asks it to cancel and
runs once it has stopped (decision ``replaced``, naming the job); never two runs at once.
A real worker on a thread ticks a task due every 2 seconds whose handler blocks until
stopped; real time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.worker_thread import Running, wait_until
from sqlalchemy import select

from scheduler import Cancelled, RunningJob, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.tables import decisions

ROW = "replaced"


@pytest.fixture
def quick(db_url: str) -> Iterator[Scheduler]:
    app = Scheduler(db_url, registry=Registry(), concurrency=2, cancel_grace=0.5)
    yield app
    app.close()


def logged(app: Scheduler) -> list[tuple[str, int | None, str | None]]:
    with app.store.read() as conn:
        stmt = (
            select(decisions.c.decision, decisions.c.job_id, decisions.c.detail)
            .where(decisions.c.task_name == ROW)
            .order_by(decisions.c.id)
        )
        return [tuple(r) for r in conn.execute(stmt)]  # type: ignore[misc]


def test_a_running_job_is_cancelled_and_the_slot_runs_after_it(quick: Scheduler) -> None:
    lock = threading.Lock()
    running: list[int] = []
    most: list[int] = [0]
    runs: list[tuple[int, int]] = []  # (job id, fence) of each run that started

    @quick.handler("blocks", retry_safe=True)
    def blocks(job: RunningJob) -> None:
        with lock:
            running.append(job.id)
            most[0] = max(most[0], len(running))
            runs.append((job.id, job.fence))
        try:
            while True:  # blocks until asked to stop
                time.sleep(0.02)
                job.check()
        except Cancelled:
            raise
        finally:
            with lock:
                running.remove(job.id)

    quick.sync([TaskSpec(ROW, "* * * * * */2", "blocks", overlap="replace")])
    with Running(quick):
        wait_until(lambda: len(runs) >= 3, seconds=30)
    entries = logged(quick)
    replaced = [e for e in entries if e[0] == "replaced"]
    assert replaced, entries
    job_id = runs[0][0]
    assert replaced[0][1] == job_id  # names the job it cancelled
    assert f"job {job_id} (claimed) cancelled" in (replaced[0][2] or "")
    assert most[0] == 1  # never two runs of the task at once
    # each replacement ran the job again in place, a larger fence each time
    assert [j for j, _f in runs[:3]] == [job_id] * 3
    fences = [f for _j, f in runs[:3]]
    assert fences == sorted(set(fences))
    history = quick.history(job_id)
    assert ("aborted", "cancelled") in [(r["outcome"], r["error_code"]) for r in history]
    row: Any = quick.get_row(ROW)
    assert row.consecutive_failures == 0  # a replaced run is not a failure of the task
