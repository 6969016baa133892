"""Paused queues in the database, on each engine: pause and resume are durable and audited,
a refused name writes nothing, ticks still dispatch into a paused queue, and ``status`` shows
it paused without calling its waiting jobs overdue or stalled."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler import Scheduler, TaskSpec
from scheduler._config import WorkerSettings
from scheduler._model.handlers import Registry
from scheduler._store.tables import audit, paused_queues
from scheduler.testing import ManualClock

T0 = datetime(2026, 12, 5, 10, 30, tzinfo=UTC)


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    found = Scheduler(
        db_url,
        registry=Registry(),
        clock=ManualClock(T0),
        worker=WorkerSettings(queues=("default", "reports")),
    )

    @found.handler("works")
    def works(job: Any) -> None:
        return None

    @found.handler("reports", queue="reports")
    def reports(job: Any) -> None:
        return None

    yield found
    found.close()


def counts(app: Scheduler) -> tuple[int, int]:
    with app.store.read() as conn:
        entries = conn.execute(select(func.count()).select_from(audit)).scalar_one()
        paused = conn.execute(select(func.count()).select_from(paused_queues)).scalar_one()
    return int(entries), int(paused)


def test_pause_and_resume_are_durable_and_audited(app: Scheduler, db_url: str) -> None:
    assert app.paused_queues() == []
    assert app.pause_queue("reports", reason="vendor outage", actor="ann") is True
    assert app.pause_queue("reports", actor="bob") is False  # already: nothing audited
    other = Scheduler(db_url, registry=Registry())  # another process's view: the database's
    try:
        (found,) = other.paused_queues()
    finally:
        other.close()
    assert (found.queue, found.paused_at, found.paused_by, found.reason) == (
        "reports",
        T0,
        "ann",
        "vendor outage",
    )
    assert app.resume_queue("reports", reason="back") is True
    assert app.resume_queue("reports") is False
    assert app.paused_queues() == []
    entries = [(e.action, e.target, e.actor, e.reason) for e in app.audit()]
    assert entries[0][:2] == ("resume", "queue reports") and entries[0][3] == "back"
    assert entries[1] == ("pause", "queue reports", "ann", "vendor outage")
    assert len(entries) == 2


def test_a_new_reason_replaces_the_old_one(app: Scheduler) -> None:
    app.pause_queue("reports", reason="first")
    app.pause_queue("reports", reason="second")
    assert [p.reason for p in app.paused_queues()] == ["second"]


@pytest.mark.parametrize(
    ("queue", "problem"),
    [
        ("", "must be a non-empty string"),
        (" reports", "must not have leading or trailing whitespace or control characters"),
        ("q" * 101, "longer than 100 characters"),
        (7, "must be a non-empty string"),
    ],
)
def test_a_bad_queue_name_is_refused_and_nothing_written(
    app: Scheduler, queue: Any, problem: str
) -> None:
    for call in (app.pause_queue, app.resume_queue):
        with pytest.raises(ValueError) as refused:
            call(queue)
        assert str(refused.value) == f"queue {queue!r}: {problem}"
    assert counts(app) == (0, 0)


def test_a_too_long_reason_is_refused_and_nothing_written(app: Scheduler) -> None:
    with pytest.raises(ValueError, match="reason is 501 characters"):
        app.pause_queue("reports", reason="r" * 501)
    assert counts(app) == (0, 0)


def test_ticks_still_dispatch_into_a_paused_queue(app: Scheduler) -> None:
    app.put_task(TaskSpec(name="hourly", cron="0 * * * *", handler="reports"))
    app.pause_queue("reports")
    slot = T0.replace(minute=0) + timedelta(hours=1)
    assert isinstance(app.clock, ManualClock)
    app.clock.set(slot)
    report = app.tick(now=slot)
    assert report.dispatched == ["hourly"]
    (job,) = app.jobs(task="hourly")
    assert (job.queue, job.state) == ("reports", "queued")
    assert app.work() == 0  # nobody claims it
    app.resume_queue("reports")
    assert app.work() == 1


def test_status_shows_it_paused_and_its_waiting_jobs_are_not_stalled(app: Scheduler) -> None:
    an_hour_ago = T0 - timedelta(hours=1)
    app.enqueue("reports", run_at=an_hour_ago)
    health = app.status()["health"]
    assert (health["waiting"], health["overdue"], health["stalled"]) == (1, 1, True)
    assert health["paused_queues"] == []
    app.pause_queue("reports", reason="vendor outage", actor="ann")
    health = app.status()["health"]
    assert (health["waiting"], health["overdue"], health["stalled"]) == (1, 0, False)
    assert health["paused_queues"] == [
        {
            "queue": "reports",
            "paused_at": "2026-12-05T10:30:00Z",
            "paused_by": "ann",
            "reason": "vendor outage",
        }
    ]
    assert not [w for w in health["warnings"] if "overdue" in w or "stalled" in w]
    # A job of another queue still counts.
    app.enqueue("works", run_at=an_hour_ago)
    health = app.status()["health"]
    assert (health["waiting"], health["overdue"], health["stalled"]) == (2, 1, True)


def test_a_workers_presence_write_brings_the_paused_queues_back(app: Scheduler) -> None:
    """A worker learns of pauses from the write of its presence: one statement where the
    engine has ``UPDATE … RETURNING`` (PostgreSQL, SQLite), a read in the same transaction
    (MariaDB); the registering write (no row yet) too."""
    from sqlalchemy import event

    from scheduler._store.status import health

    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    store = app.store
    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        registered = health.touch(store, "w-1", T0, None, paused=True)  # no row yet: inserted
        app.pause_queue("reports")
        app.pause_queue("night shift")
        statements.clear()
        found = health.touch(store, "w-1", T0 + timedelta(seconds=1), None, paused=True)
        writes = list(statements)
        app.resume_queue("reports")
        after = health.touch(store, "w-1", T0 + timedelta(seconds=2), None, paused=True)
        plain = health.touch(store, "w-1", T0 + timedelta(seconds=3), None)
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    assert registered is not None and registered.paused == frozenset()
    assert found is not None and found.paused == {"reports", "night shift"}
    assert after is not None and after.paused == {"night shift"}
    assert plain is None
    expected = 1 if store.caps.update_returning else 2
    assert len(writes) == expected, writes
