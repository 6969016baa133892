"""Cancel a running job (``app.cancel_job`` / ``scheduler cancel`` on a ``claimed`` job): its
worker learns of it within about 2 s and stops it as a timeout does; the job ends ``aborted``
with code ``cancelled``, not counted as a failure of its task. Real worker, real time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from helpers.worker_thread import Running, wait_until

from scheduler import Cancelled, RunningJob, Scheduler, TaskSpec
from scheduler._model.handlers import Registry

GRACE = 0.5
REACHES_WITHIN = 2.0  # seconds from the cancel until the running handler is told


@pytest.fixture
def quick(db_url: str) -> Iterator[Scheduler]:
    app = Scheduler(db_url, registry=Registry(), concurrency=2, cancel_grace=GRACE)
    yield app
    app.close()


def state(app: Scheduler, job_id: int) -> tuple[str, str | None]:
    job = app.get_job(job_id)
    assert job is not None
    return job.state, job.last_error_code


def cancel_and_time(app: Scheduler, job_id: int) -> float:
    """Cancel the running job and wait until it has ended; returns when it was asked
    (``time.monotonic()``: the handlers note when they are told)."""
    assert state(app, job_id)[0] == "claimed"
    asked = time.monotonic()
    assert app.cancel_job(job_id, reason="test").state == "claimed"
    wait_until(lambda: state(app, job_id)[0] != "claimed")
    return asked


def test_a_running_sync_job_that_checks_is_stopped(quick: Scheduler) -> None:
    started, seen = threading.Event(), []

    @quick.handler("s.loop", retry_safe=True)
    def loop(job: RunningJob) -> None:
        started.set()
        try:
            while True:
                time.sleep(0.02)
                job.check()
        except Cancelled:
            seen.append(job.cancel_requested)
            told.append(time.monotonic())
            raise

    told: list[float] = []
    job_id = quick.enqueue("s.loop")
    with Running(quick):
        assert started.wait(10)
        asked = cancel_and_time(quick, job_id)
    assert told[0] - asked < REACHES_WITHIN
    assert seen == [True]
    assert state(quick, job_id) == ("aborted", "cancelled")  # retry-safe, yet not retried
    assert [(r["outcome"], r["error_code"]) for r in quick.history(job_id)] == [
        ("aborted", "cancelled")
    ]


def test_a_running_async_job_is_cancelled(quick: Scheduler) -> None:
    started = threading.Event()

    @quick.handler("a.sleep")
    async def sleeps(job: RunningJob) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            told.append(time.monotonic())
            raise

    told: list[float] = []
    job_id = quick.enqueue("a.sleep")
    with Running(quick):
        assert started.wait(10)
        asked = cancel_and_time(quick, job_id)
    assert told[0] - asked < REACHES_WITHIN
    assert state(quick, job_id) == ("aborted", "cancelled")


def test_a_cancelled_run_of_a_task_is_not_a_failure(quick: Scheduler) -> None:
    runs: list[int] = []
    first = threading.Event()

    @quick.handler("s.task")
    def task(job: RunningJob) -> None:
        runs.append(job.id)
        if len(runs) == 1:
            first.set()
            while True:
                time.sleep(0.02)
                job.check()

    quick.tasks = (TaskSpec("every-second", "* * * * * *", "s.task", max_consecutive_failures=1),)
    quick.sync()
    with Running(quick):
        assert first.wait(10)
        job_id = runs[0]
        cancel_and_time(quick, job_id)
        # The every-second task may rerun the same job in place before its state is read:
        # the cancelled attempt's end is read from its history, which the rerun leaves alone.
        wait_until(lambda: len(runs) >= 2 and state(quick, job_id)[0] == "succeeded")
        ended = [(r["outcome"], r["error_code"]) for r in quick.history(job_id)]
        assert ended == [("aborted", "cancelled"), ("succeeded", None)]
    row = quick.get_row("every-second")
    assert row is not None
    assert row.enabled  # one failure would have disabled it (max_consecutive_failures 1)
    assert row.consecutive_failures == 0
    assert runs[1] == job_id  # rerun in place


def test_cancel_refuses_a_finished_job(quick: Scheduler) -> None:
    from scheduler import JobStateError

    @quick.handler("s.ok")
    def ok(job: RunningJob) -> None:
        pass

    job_id = quick.enqueue("s.ok")
    quick.work()
    with pytest.raises(JobStateError, match="is succeeded: only a queued or running job"):
        quick.cancel_job(job_id)
