"""MariaDB's fresh dispatch: one query (the job, the row's swap, its ``dispatched`` entry) where
the connection accepts several statements, its swap refusing to wait for a row lock, and the
separate statements where not (a connection without ``MULTI_STATEMENTS``, MySQL). Every path
writes the same rows, and a stale snapshot writes nothing on any of them. Real MariaDB."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, select, text

from scheduler import Scheduler, TaskSpec
from scheduler import _tick as tick_loop
from scheduler import _tick as tick_module
from scheduler._model.handlers import Registry
from scheduler._model.rows import DueRow
from scheduler._model.slots import next_slot
from scheduler._store import make_engine
from scheduler._store.driver import Prepared
from scheduler._store.due import due
from scheduler._store.engine import CLIENT_MULTI_STATEMENTS
from scheduler._store.tables import decisions, jobs, rows
from scheduler._store.writers import Work
from scheduler._store.writers.portable import PortableWriter
from scheduler.testing import ManualClock

T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
SLOT = T0 + timedelta(minutes=10)
FOUND_ROWS = 2  # the MySQL protocol's CLIENT_FOUND_ROWS
PATHS = [(True, True), (False, True), (True, False), (False, False)]
PATH_IDS = ["one-query-nowait", "one-query", "statements-nowait", "statements"]


@pytest.fixture
def maria_url(tmp_path: Path, sqlite_template: Path) -> str:
    from conftest import make_url

    return make_url("mariadb", tmp_path, sqlite_template)


@pytest.fixture
def app(maria_url: str) -> Iterator[Scheduler]:
    registry = Registry()
    registry.handler("h", retry_safe=True)(lambda job: None)
    scheduler = Scheduler(maria_url, registry=registry, clock=ManualClock(T0))
    yield scheduler
    scheduler.close()


def snapshot(app: Scheduler, now: datetime) -> DueRow:
    with app.store.engine.connect() as conn:
        [row] = due(app.store, conn, now, 10, None)
    return row


def carry(
    app: Scheduler, row: DueRow, now: datetime, nowait: bool, multi: bool
) -> tuple[tick_module.TickReport, list[str]]:
    """`row` decided and carried out by the portable writer on the path given; the report
    and the statements sent."""
    decision = tick_module.decide(row, now, max_consecutive_failures=0, next_slot=next_slot)
    work = Work(
        now=now,
        job_defaults=app._job_defaults,
        connections=1,
        nowait=nowait,
        multi_statements=multi,
    )
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        sent.append(statement)

    report = tick_module.TickReport()
    event.listen(app.store.engine, "before_cursor_execute", seen)
    try:
        with app.store.engine.connect() as conn:
            carried = PortableWriter(single_writer=False).carry_out(
                app.store, conn, [(row, decision)], work
            )
            tick_loop._settle(conn, [row], carried, report)
    finally:
        event.remove(app.store.engine, "before_cursor_execute", seen)
    return report, sent


def written(app: Scheduler) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], Any]:
    with app.store.read() as conn:
        job_rows = conn.execute(
            select(jobs.c.id, jobs.c.task_name, jobs.c.slot, jobs.c.created_at, jobs.c.state)
        ).all()
        entries = conn.execute(
            select(
                decisions.c.task_name,
                decisions.c.slot,
                decisions.c.decided_at,
                decisions.c.decision,
                decisions.c.job_id,
                decisions.c.reason,
                decisions.c.detail,
            ).order_by(decisions.c.id)
        ).all()
        row = conn.execute(select(rows).where(rows.c.name == "r")).one()
    return [tuple(j) for j in job_rows], [tuple(e) for e in entries], row


def test_the_connections_accept_several_statements_and_mariadb_refuses_waits(
    app: Scheduler,
) -> None:
    app.store.engine.connect().close()
    assert app.store.caps.multi_statements and app.store.caps.nowait
    url = app.store.engine.url
    # A host's own engine, made without MULTI_STATEMENTS: the separate statements.
    plain = Scheduler(engine=create_engine(url), registry=Registry())
    try:
        plain.store.engine.connect().close()
        assert not plain.store.caps.multi_statements and plain.store.caps.nowait
    finally:
        plain.close()
    # One made with it (FOUND_ROWS kept, as the runbook says), connected before it is handed
    # over or after: the one query.
    flags = {"client_flag": CLIENT_MULTI_STATEMENTS | FOUND_ROWS}
    for connected_first in (False, True):
        own = create_engine(url, connect_args=flags)
        if connected_first:
            own.connect().close()
        given = Scheduler(engine=own, registry=Registry())
        try:
            given.store.engine.connect().close()
            assert given.store.caps.multi_statements and given.store.caps.nowait
        finally:
            given.close()


@pytest.mark.parametrize(("nowait", "multi"), PATHS, ids=PATH_IDS)
def test_a_fresh_dispatch_writes_the_same_on_every_path(
    app: Scheduler, nowait: bool, multi: bool
) -> None:
    app.sync([TaskSpec("r", "*/10 * * * *", "h", {}, "UTC")])
    now = SLOT + timedelta(seconds=3)
    before = snapshot(app, now)
    report, sent = carry(app, before, now, nowait, multi)
    assert report.dispatched == ["r"] and report.dispatched_slots == [SLOT]
    [(job_id, task, slot, created, state)], entries, row = written(app)
    assert (task, slot, created, state) == ("r", SLOT, now, "queued")
    assert entries == [("r", SLOT, now, "dispatched", job_id, None, None)]
    assert (row.last_job_id, row.version, row.next_run_at) == (
        job_id,
        before.version + 1,
        SLOT + timedelta(minutes=10),
    )
    # One query and the COMMIT, or three statements; no SKIP LOCKED probe where the swap
    # refuses to wait; MariaDB's SET STATEMENT on the swap then.
    writes = [s for s in sent if not s.startswith(("SELECT", "COMMIT"))]
    assert len(writes) == (1 if multi else 3)
    assert any("SKIP LOCKED" in s for s in sent) is (not nowait)
    assert any("SET STATEMENT innodb_lock_wait_timeout = 0 FOR UPDATE" in s for s in sent) is (
        nowait
    )


@pytest.mark.parametrize(("nowait", "multi"), PATHS, ids=PATH_IDS)
def test_a_tick_that_coalesces_writes_both_entries_on_every_path(
    app: Scheduler, nowait: bool, multi: bool
) -> None:
    """Three slots passed: the dispatched entry (the one query's, where it is one) and the
    coalesced one after it, with the job's id."""
    app.sync([TaskSpec("r", "*/10 * * * *", "h", {}, "UTC")])
    app.store.engine.connect().close()
    app.store.caps = dataclasses.replace(app.store.caps, nowait=nowait, multi_statements=multi)
    report = app.tick(now=SLOT + timedelta(minutes=25))
    assert report.dispatched == ["r"]
    [(job_id, *_job)], entries, _row = written(app)
    assert [(e[3], e[4]) for e in entries] == [("dispatched", job_id), ("coalesced", job_id)]


@pytest.mark.parametrize(("nowait", "multi"), PATHS, ids=PATH_IDS)
def test_a_stale_snapshot_writes_nothing_on_every_path(
    app: Scheduler, maria_url: str, nowait: bool, multi: bool
) -> None:
    app.sync([TaskSpec("r", "*/10 * * * *", "h", {}, "UTC")])
    now = SLOT + timedelta(seconds=3)
    stale = snapshot(app, now)
    other = Scheduler(maria_url, registry=Registry())
    try:
        assert other.tick(now=now).dispatched == ["r"]  # the row moves on: version + 1
    finally:
        other.close()
    job_rows, entries, _row = written(app)
    report, _sent = carry(app, stale, now, nowait, multi)
    assert report.lost_race == ["r"] and report.dispatched == []
    assert written(app)[:2] == (job_rows, entries)  # the loser's job and entry rolled back


# -- the driver's joined query ------------------------------------------------------------------
def test_a_joined_query_reports_each_statement_and_a_failure_leaves_the_connection_usable(
    app: Scheduler,
) -> None:
    engine = app.store.engine
    with engine.connect() as conn:
        conn.execute(text("CREATE TEMPORARY TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v INT)"))
        conn.commit()
        add = text("INSERT INTO t (v) VALUES (:p_v)")
        bump = text("UPDATE t SET v = v + 1 WHERE id = :p_id")
        joined = Prepared.joined(*(Prepared(s, conn.dialect) for s in (add, add, bump)))
        with conn.begin():
            results = joined.run_all(conn, {"p_v": 5, "p_id": 1})
        # per statement: (rows, generated id); a shared name is one value
        assert results == [(1, 1), (1, 2), (1, 0)]
        assert conn.execute(text("SELECT v FROM t ORDER BY id")).scalars().all() == [6, 5]
        conn.commit()
        failing = Prepared.joined(
            Prepared(add, conn.dialect),
            Prepared(text("INSERT INTO missing (v) VALUES (:p_v)"), conn.dialect),
            Prepared(add, conn.dialect),
        )
        with pytest.raises(Exception) as raised, conn.begin():
            failing.run_all(conn, {"p_v": 7})
        assert "missing" in str(raised.value)
        assert type(raised.value).__module__.startswith("sqlalchemy")
        # rolled back, and the connection answers the next query
        assert conn.execute(text("SELECT count(*) FROM t")).scalar() == 2


def test_only_statements_of_one_dialect_and_paramstyle_are_joined(app: Scheduler) -> None:
    from sqlalchemy.dialects import postgresql, sqlite

    one = text("SELECT :p_a")
    with pytest.raises(ValueError, match="one dialect"):
        Prepared.joined(Prepared(one, sqlite.dialect()), Prepared(one, postgresql.dialect()))
    maria = make_engine(str(app.store.engine.url.render_as_string(False)))
    try:
        positional = Prepared(one, maria.dialect, compile_as=sqlite.dialect())
        with pytest.raises(ValueError, match="paramstyle"):
            Prepared.joined(Prepared(one, maria.dialect), positional)
    finally:
        maria.dispose()
