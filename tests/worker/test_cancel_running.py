"""Cancel a running job (``app.cancel_job`` / ``scheduler cancel`` on a ``claimed`` job): its
worker learns of it within about 2 s and stops it as a timeout does; the job ends ``aborted``
with code ``cancelled``, not counted as a failure of its task. Real worker, real time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler import Cancelled, RunningJob, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker

GRACE = 0.5
REACHES_WITHIN = 2.0  # seconds from the cancel to the job's end, for a handler that checks


@pytest.fixture
def quick(db_url: str) -> Iterator[Scheduler]:
    app = Scheduler(db_url, registry=Registry(), concurrency=2, cancel_grace=GRACE)
    yield app
    app.close()


def wait_until(test: Callable[[], Any], seconds: float = 10.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = test()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"not within {seconds}s: {test}")


class Running:
    """A worker serving on a thread of its own, stopped at the end."""

    def __init__(self, app: Scheduler) -> None:
        self.worker = Worker(app, serve_metrics=False)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        assert self.worker.started.wait(10)
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop(force=True)
        self.thread.join(15)
        assert not self.thread.is_alive()


def state(app: Scheduler, job_id: int) -> tuple[str, str | None]:
    job = app.get_job(job_id)
    assert job is not None
    return job.state, job.last_error_code


def cancel_and_time(app: Scheduler, job_id: int) -> float:
    """Cancel the running job; seconds until it has ended."""
    assert state(app, job_id)[0] == "claimed"
    asked = time.monotonic()
    assert app.cancel_job(job_id, reason="test").state == "claimed"
    wait_until(lambda: state(app, job_id)[0] != "claimed")
    return time.monotonic() - asked


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
            raise

    job_id = quick.enqueue("s.loop")
    with Running(quick):
        assert started.wait(10)
        took = cancel_and_time(quick, job_id)
    assert took < REACHES_WITHIN
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
        await asyncio.sleep(30)

    job_id = quick.enqueue("a.sleep")
    with Running(quick):
        assert started.wait(10)
        took = cancel_and_time(quick, job_id)
    assert took < REACHES_WITHIN
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
        assert state(quick, job_id) == ("aborted", "cancelled")
        wait_until(lambda: len(runs) >= 2 and state(quick, job_id)[0] == "succeeded")
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
