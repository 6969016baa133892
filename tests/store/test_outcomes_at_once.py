"""A batch of successes on PostgreSQL is one statement (``scheduler/_store/outcomes.py``): the
jobs' ends under their leases and their run history, in the driver's autocommit when nothing
sits between the worker and the server (one round trip, no BEGIN or COMMIT). Real PostgreSQL;
what the history holds is checked against the general path's, in a session whose time zone is
not UTC."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from helpers.queue_worker import Clock
from sqlalchemy import event
from sqlalchemy.engine import make_url

from scheduler import Scheduler
from scheduler._model.handlers import Registry

T0 = datetime(2030, 1, 7, 12, 0, 0, 250000, tzinfo=UTC)


@pytest.fixture
def zoned_app(direct_pg_url: str) -> Iterator[tuple[Scheduler, Clock]]:
    url = make_url(direct_pg_url)
    options = f"{url.query.get('options', '')} -ctimezone=America/New_York".strip()
    zoned = url.set(query={**url.query, "options": options})
    clock = Clock(T0)
    app = Scheduler(zoned.render_as_string(hide_password=False), registry=Registry(), clock=clock)
    app.registry.handler("ok", retry_safe=True)(lambda job: None)
    yield app, clock
    app.close()


def sent(app: Scheduler) -> tuple[list[str], Any]:
    statements: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split())[:40])

    event.listen(app.store.engine, "before_cursor_execute", note)
    return statements, note


def test_a_batch_of_successes_is_one_statement_with_its_history(
    zoned_app: tuple[Scheduler, Clock],
) -> None:
    app, clock = zoned_app
    ids = [app.enqueue("ok", {"n": n}) for n in range(3)]
    runner = app.runner()
    running = runner.claim(10)
    assert [j.id for j in running] == ids
    clock.now = T0 + timedelta(seconds=2)
    endings = [runner.execute(job) for job in running]
    statements, note = sent(app)
    try:
        assert runner.record(endings) == ["succeeded"] * 3
    finally:
        event.remove(app.store.engine, "before_cursor_execute", note)
    assert len(statements) == 1 and statements[0].startswith("WITH done AS"), statements
    for job_id in ids:
        job = app.get_job(job_id)
        assert job is not None and (job.state, job.lease_owner) == ("succeeded", None)
        [run] = app.history(job_id)
        assert run["outcome"] == "succeeded" and run["attempt"] == 1
        assert run["finished_at"] == T0 + timedelta(seconds=2)  # UTC, not the session's zone
        assert run["started_at"] == T0 + timedelta(seconds=2)  # as the attempt measured it
        assert run["worker"] == runner.owner and run["error_code"] is None


def test_a_lost_lease_writes_nothing_for_that_job(zoned_app: tuple[Scheduler, Clock]) -> None:
    app, clock = zoned_app
    ids = [app.enqueue("ok", {"n": n}) for n in range(2)]
    runner = app.runner()
    running = runner.claim(10)
    endings = [runner.execute(job) for job in running]
    clock.now = T0 + timedelta(hours=1)  # past the lease: taken over meanwhile
    second = Scheduler(app.store.engine.url, registry=app.registry, clock=clock, worker_id="w2")
    other = second.runner()
    taken = other.take_over(limit=10)
    assert sorted(j.id for j in taken) == ids
    assert runner.record(endings) == ["lease_lost", "lease_lost"]
    for job_id in ids:
        job = app.get_job(job_id)
        assert job is not None and job.state == "claimed" and job.lease_owner == other.owner
        assert [r["worker"] for r in app.history(job_id) if r["outcome"] == "succeeded"] == []
    assert other.record([other.execute(job) for job in taken]) == ["succeeded"] * 2
    for job_id in ids:
        runs = [r for r in app.history(job_id) if r["outcome"] == "succeeded"]
        assert [r["worker"] for r in runs] == [other.owner]
    second.close()
