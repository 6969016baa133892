"""``raise scheduler.Snooze(seconds)``: the job is queued again at now + seconds, its attempt
given back and no failure counted; the run history records ``snoozed`` (every engine)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler import RunningJob, Scheduler, Snooze, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker
from scheduler.testing import ManualClock

START = datetime(2030, 1, 1, 12, 0, 0, 500000, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def app(db_url: str, clock: ManualClock) -> Iterator[Scheduler]:
    scheduler = Scheduler(db_url, registry=Registry(), clock=clock)
    yield scheduler
    scheduler.close()


def test_a_snoozed_job_is_queued_again_without_using_an_attempt(
    app: Scheduler, clock: ManualClock
) -> None:
    calls: list[int] = []

    @app.handler("s.later", max_attempts=2)
    def later(job: RunningJob) -> None:
        calls.append(job.attempt)
        if len(calls) < 3:
            raise Snooze(30)

    job_id = app.enqueue("s.later")
    assert app.work() == 1
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.attempts, job.last_error_code) == ("queued", 0, None)
    assert job.run_at == START + timedelta(seconds=30)
    assert app.work() == 0  # not before its time

    clock.advance(seconds=30)
    assert app.work() == 1  # snoozed again: still not one attempt used
    clock.advance(seconds=30)
    assert app.work() == 1
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.attempts) == ("succeeded", 1)  # 2 snoozes, max_attempts 2: ran
    assert calls == [1, 1, 1]
    runs = [(r["attempt"], r["outcome"], r["error_code"]) for r in app.history(job_id)]
    assert runs == [(1, "snoozed", None), (1, "snoozed", None), (1, "succeeded", None)]


def test_a_snooze_after_a_failure_keeps_the_attempt_count(
    app: Scheduler, clock: ManualClock
) -> None:
    calls: list[int] = []

    @app.handler("s.flaky", retry_safe=True, max_attempts=3)
    def flaky(job: RunningJob) -> None:
        calls.append(job.attempt)
        if len(calls) == 1:
            raise RuntimeError("boom")
        if len(calls) == 2:
            raise Snooze(5)

    job_id = app.enqueue("s.flaky")
    app.work()
    clock.advance(minutes=5)
    app.work()
    job = app.get_job(job_id)
    assert job is not None
    # the failed attempt counts, the snoozed one is given back; the last error is kept
    assert (job.state, job.attempts, job.last_error_code) == ("queued", 1, "RuntimeError")
    clock.advance(seconds=5)
    app.work()
    assert calls == [1, 2, 2]
    job = app.get_job(job_id)
    assert job is not None and (job.state, job.attempts) == ("succeeded", 2)


def test_a_task_job_snoozed_counts_no_failure(app: Scheduler, clock: ManualClock) -> None:
    snoozes: list[Any] = []

    @app.handler("s.task")
    def task(job: RunningJob) -> None:
        if not snoozes:
            snoozes.append(job.id)
            raise Snooze(10)

    app.tasks = (TaskSpec("minutely", "* * * * *", "s.task"),)
    app.sync()
    clock.set(datetime(2030, 1, 1, 12, 1, 0, tzinfo=UTC))
    app.tick()
    app.work()
    row = app.get_row("minutely")
    assert row is not None and row.consecutive_failures == 0
    job = app.get_job(snoozes[0])
    assert job is not None and (job.state, job.attempts) == ("queued", 0)
    clock.advance(seconds=10)
    app.work()
    job = app.get_job(snoozes[0])
    assert job is not None and job.state == "succeeded"
    clock.set(datetime(2030, 1, 1, 12, 2, 0, tzinfo=UTC))
    app.tick()
    row = app.get_row("minutely")
    assert row is not None and row.consecutive_failures == 0


def test_the_worker_snoozes_too(app: Scheduler, clock: ManualClock) -> None:
    @app.handler("s.worker")
    def worker_job(job: RunningJob) -> None:
        raise Snooze(60)

    job_id = app.enqueue("s.worker")
    Worker(app, serve_metrics=False).run(once=True)
    job = app.get_job(job_id)
    assert job is not None and (job.state, job.attempts) == ("queued", 0)
    assert [r["outcome"] for r in app.history(job_id)] == ["snoozed"]


@pytest.mark.parametrize(("seconds", "error"), [(-1, ValueError), ("5", TypeError)])
def test_a_bad_snooze_is_refused(seconds: Any, error: type) -> None:
    with pytest.raises(error, match="Snooze"):
        Snooze(seconds)
