"""Revision 0011: the workers' ``stuck_attempts`` and the jobs' ``cancel_requested_at``, down
to 0010 and up again with rows in both tables (every engine)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import inspect, select, update

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.migrate import current_revision, head_revision
from scheduler._store.status import health
from scheduler._store.tables import jobs, workers

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    scheduler = Scheduler(db_url, registry=Registry())
    yield scheduler
    scheduler.close()


def columns(app: Scheduler, table: str) -> set[str]:
    return {c["name"] for c in inspect(app.store.engine).get_columns(table)}


def test_0011_down_and_up_keeps_the_jobs_and_the_workers(app: Scheduler) -> None:
    job_id = app.enqueue("h")
    health.touch(app.store, "w1", NOW, None, stuck=2)
    with app.store.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(cancel_requested_at=NOW))
    app.migrate("0010")
    assert current_revision(app.store) == "0010"
    assert "cancel_requested_at" not in columns(app, "scheduler_jobs")
    assert "stuck_attempts" not in columns(app, "scheduler_workers")
    app.migrate()
    assert current_revision(app.store) == head_revision()
    with app.store.read() as conn:
        assert conn.execute(select(jobs.c.id, jobs.c.cancel_requested_at)).all() == [(job_id, None)]
        assert conn.execute(select(workers.c.id, workers.c.stuck_attempts)).all() == [("w1", None)]
