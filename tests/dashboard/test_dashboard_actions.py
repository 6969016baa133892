"""``app.retry_job`` and ``app.cancel_job`` (SPEC §10) on SQLite, PostgreSQL and MariaDB.

The dashboard's retry and cancel buttons call these; each is one conditional UPDATE whose row
count decides, so a job that changed state meanwhile is refused and left as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from scheduler import PermanentError, Scheduler, TaskSpec
from scheduler._errors import JobStateError
from scheduler._model.handlers import Registry
from scheduler._store import jobs as _jobs
from scheduler._store.tables import jobs, rows

T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def ops(db_url: str, clock: Clock) -> Iterator[Scheduler]:
    app = Scheduler(db_url, registry=Registry(), clock=clock)

    @app.handler("fails", max_attempts=1)
    def fails(job: object) -> None:
        raise PermanentError("bad_input")

    @app.handler("works")
    def works(job: object) -> None:
        return None

    yield app
    app.close()


def test_retry_requeues_an_aborted_job_with_attempts_reset(ops: Scheduler, clock: Clock) -> None:
    job_id = ops.enqueue("fails", {"n": 1})
    assert ops.work() == 1
    assert ops.get_job(job_id).state == "aborted"  # type: ignore[union-attr]
    clock.now += timedelta(minutes=5)
    job = ops.retry_job(job_id)
    assert (job.state, job.attempts, job.last_error_code, job.run_at) == (
        "queued",
        0,
        None,
        clock.now,
    )
    assert job.finished_at is None and job.lease_owner is None
    ops.work()  # it runs again (and fails again): one more attempt in the history
    assert [r["error_code"] for r in ops.history(job_id)] == ["bad_input", "bad_input"]


@pytest.mark.parametrize("state", ["queued", "claimed", "succeeded"])
def test_retry_refuses_every_other_state_and_changes_nothing(ops: Scheduler, state: str) -> None:
    job_id = ops.enqueue("works")
    with ops.store.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(state=state, attempts=2))
    with pytest.raises(JobStateError, match=f"job {job_id} is {state}: only an aborted job"):
        ops.retry_job(job_id)
    after = ops.get_job(job_id)
    assert after is not None and (after.state, after.attempts) == (state, 2)


def test_retry_and_cancel_of_an_unknown_job_say_so(ops: Scheduler) -> None:
    with pytest.raises(JobStateError, match="no job 999"):
        ops.retry_job(999)
    with pytest.raises(JobStateError, match="no job 999"):
        ops.cancel_job(999)


def test_retry_of_a_tasks_job_is_a_fresh_run_of_its_current_definition(
    ops: Scheduler, clock: Clock
) -> None:
    spec = TaskSpec(
        name="nightly", cron="0 3 * * *", handler="fails", payload={"v": 1}, timezone="UTC"
    )
    ops.sync([spec])
    ops.trigger("nightly")
    ops.tick()
    ops.work()
    row = ops.get_row("nightly")
    assert row is not None and row.last_job_state == "aborted"
    ops.sync([TaskSpec(**{**spec.__dict__, "handler": "works", "payload": {"v": 2}})])
    job = ops.retry_job(row.last_job_id)  # type: ignore[arg-type]
    assert (job.id, job.state, job.attempts, job.handler, job.payload) == (
        row.last_job_id,
        "queued",
        0,
        "works",
        {"v": 2},
    )
    assert ops.work() == 1
    assert ops.get_job(job.id).state == "succeeded"  # type: ignore[union-attr]


def test_retry_refuses_a_tasks_job_that_is_no_longer_its_current_one(ops: Scheduler) -> None:
    ops.sync([TaskSpec(name="t", cron="0 3 * * *", handler="fails", payload={}, timezone="UTC")])
    ops.trigger("t")
    ops.tick()
    ops.work()
    old = ops.get_row("t").last_job_id  # type: ignore[union-attr]
    newer = ops.enqueue("works")
    with ops.store.begin() as conn:
        conn.execute(update(rows).where(rows.c.name == "t").values(last_job_id=newer))
    with pytest.raises(JobStateError, match=f"not the current job of task 't' \\(job {newer}\\)"):
        ops.retry_job(old)  # type: ignore[arg-type]
    assert ops.get_job(old).state == "aborted"  # type: ignore[arg-type, union-attr]


def test_cancel_aborts_a_queued_job_with_code_cancelled(ops: Scheduler, clock: Clock) -> None:
    job_id = ops.enqueue("works", dedupe_key="once")
    job = ops.cancel_job(job_id)
    assert (job.state, job.last_error_code, job.finished_at, job.dedupe_key) == (
        "aborted",
        "cancelled",
        clock.now,
        None,
    )
    assert ops.work() == 0  # nothing left to run
    assert ops.enqueue("works", dedupe_key="once") != job_id  # its key was released


@pytest.mark.parametrize("state", ["succeeded", "aborted"])
def test_cancel_refuses_every_other_state_and_changes_nothing(ops: Scheduler, state: str) -> None:
    job_id = ops.enqueue("works")
    with ops.store.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(state=state))
    refused = f"job {job_id} is {state}: only a queued or running job"
    with pytest.raises(JobStateError, match=refused):
        ops.cancel_job(job_id)
    after = ops.get_job(job_id)
    assert after is not None and (after.state, after.last_error_code) == (state, None)


def _race_claim_and_cancel(ops: Scheduler, db_url: str, clock: Clock) -> tuple[bool, object]:
    """One queued job, claimed and cancelled at once on two connections: (claimed, cancel's
    result or its error)."""
    job_id = ops.enqueue("works")
    other = Scheduler(db_url, registry=Registry(), clock=clock)
    results: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def claim() -> None:
        barrier.wait()
        with other.store.begin() as conn:
            results["claimed"] = _jobs.claim(
                other.store, conn, owner="w", now=clock.now, lease=timedelta(seconds=60)
            )

    def cancel() -> None:
        barrier.wait()
        try:
            results["cancelled"] = ops.cancel_job(job_id)
        except JobStateError as exc:
            results["cancelled"] = exc

    threads = [threading.Thread(target=claim), threading.Thread(target=cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.close()
    final = ops.get_job(job_id)
    assert final is not None
    claimed = bool(results["claimed"])
    assert final.state == ("claimed" if claimed else "aborted")
    with ops.store.begin() as conn:  # leave nothing claimable for the next round
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="succeeded"))
    return claimed, results["cancelled"]


def test_cancel_racing_a_claim_has_one_winner(ops: Scheduler, db_url: str, clock: Clock) -> None:
    """The claim and the cancel on their own connections at once: the job ends either claimed
    (the cancel then a request to its worker to stop it) or aborted with code cancelled
    (nothing claimed), never both."""
    for _ in range(5):
        claimed, cancelled = _race_claim_and_cancel(ops, db_url, clock)
        assert not isinstance(cancelled, JobStateError)
        assert getattr(cancelled, "state", None) == ("claimed" if claimed else "aborted")
        if not claimed:
            assert getattr(cancelled, "last_error_code", None) == "cancelled"
