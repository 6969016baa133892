"""The tick's hot path runs on the driver's cursor (scheduler/_driver.py): the same values, the
same events and the same exceptions as ``Connection.execute``, on every engine."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.job_statements import INSERT, NOW
from sqlalchemy import bindparam, create_engine, event, literal, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from scheduler import Scheduler
from scheduler._store.driver import Prepared, PreparedSet
from scheduler._store.tables import UTCDateTime, jobs

VALUES = {
    "p_handler": "h",
    "p_payload": "{}",
    "p_queue": "default",
    "p_priority": 0,
    "p_now": NOW,
    "p_state": "queued",
    "p_attempts": 1,
}


def test_values_go_through_the_column_types_and_events_fire(app: Scheduler) -> None:
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement)

    event.listen(app.store.engine, "before_cursor_execute", before)
    try:
        with app.store.engine.connect() as conn, conn.begin():
            PreparedSet(lambda _dialect: INSERT, Prepared).on(conn).run(conn, VALUES)
    finally:
        event.remove(app.store.engine, "before_cursor_execute", before)
    assert [s for s in seen if s.lstrip().upper().startswith("INSERT")] != []
    with app.store.read() as conn:
        [(run_at, created_at, max_attempts)] = conn.execute(
            select(jobs.c.run_at, jobs.c.created_at, jobs.c.max_attempts)
        ).all()
    # the same instant back, microseconds kept, aware UTC: what Core's execute would store
    assert run_at == created_at == NOW
    assert max_attempts == 1
    with app.store.read() as conn:  # stored as Core stores it: Core's own comparison finds it
        found = conn.execute(select(jobs.c.id).where(jobs.c.run_at == NOW)).scalars().all()
    assert len(found) == 1


def test_a_shared_cursor_and_listeners_taken_once_run_and_report_alike(app: Scheduler) -> None:
    """Two statements on one cursor with the listeners taken once (a fresh dispatch's way):
    both rows written, each statement seen before and after with its own arguments, as
    without; a listener added after the snapshot is not called for them."""
    from scheduler._store.driver import cursor_events

    seen: list[tuple[str, str, Any]] = []

    def before(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        seen.append(("before", statement, parameters))

    def after(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        seen.append(("after", statement, parameters))

    def late(*_args: Any) -> None:
        seen.append(("late", "", None))

    engine = app.store.engine
    prepared = PreparedSet(lambda _dialect: INSERT, Prepared)
    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        with engine.connect() as conn, conn.begin():
            statement = prepared.on(conn)
            events = cursor_events(conn)
            event.listen(engine, "before_cursor_execute", late)
            cursor = statement.run(conn, VALUES, None, events)
            assert statement.run(conn, {**VALUES, "p_attempts": 2}, cursor, events) is cursor
            expected = [
                statement.arguments(VALUES),
                statement.arguments({**VALUES, "p_attempts": 2}),
            ]
    finally:
        for name, fn in (("before", before), ("after", after), ("before", late)):
            event.remove(engine, f"{name}_cursor_execute", fn)
    assert [(when, args) for when, _sql, args in seen] == [
        ("before", expected[0]),
        ("after", expected[0]),
        ("before", expected[1]),
        ("after", expected[1]),
    ]
    with app.store.read() as conn:
        attempts = conn.execute(select(jobs.c.max_attempts).order_by(jobs.c.id)).scalars()
        assert list(attempts) == [1, 2]


def test_driver_errors_are_sqlalchemys_and_the_connection_recovers(app: Scheduler) -> None:
    prepared = PreparedSet(lambda _dialect: INSERT, Prepared)
    with app.store.engine.connect() as conn:
        with pytest.raises(IntegrityError), conn.begin():  # NOT NULL handler
            prepared.on(conn).run(conn, {**VALUES, "p_handler": None})
        assert not conn.invalidated
        with conn.begin():
            prepared.on(conn).run(conn, VALUES)
    with app.store.read() as conn:
        assert conn.execute(select(jobs.c.handler)).scalars().all() == ["h"]


def test_a_lost_connection_invalidates_it(direct_pg_url: str) -> None:
    pg_url = direct_pg_url  # a backend of one's own to terminate: never through PgBouncer
    app = Scheduler(pg_url)
    try:
        prepared = PreparedSet(lambda _dialect: INSERT, Prepared)
        with app.store.engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            conn.commit()
            killer = create_engine(pg_url)
            with killer.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            killer.dispose()
            with pytest.raises(DBAPIError) as info, conn.begin():
                prepared.on(conn).run(conn, VALUES)
            assert info.value.connection_invalidated
            assert conn.invalidated
        assert app.enqueue("h", {}) > 0  # the pool hands out a fresh connection
    finally:
        app.close()


def test_only_plain_named_parameters_are_accepted() -> None:
    from sqlalchemy.dialects import sqlite

    with pytest.raises(ValueError, match="plain required bindparam"):
        Prepared(select(jobs.c.id).where(jobs.c.id == 5), sqlite.dialect())


def test_literal_values_are_sent_as_fixed_parameters_where_asked(app: Scheduler) -> None:
    """``literals=True`` (a batch of successes, _store/outcomes.py): a statement's literal
    values are sent as parameters of fixed value, through their types, and the row written is
    the one Connection.execute writes; a positional paramstyle (SQLite's) still refuses them.
    It relies on ``compiled.bind_names`` (each bind parameter's name in the SQL) and a literal's
    ``effective_value``, pinned here."""
    statement = jobs.insert().values(
        handler=bindparam("p_handler"),
        payload="{}",
        queue="default",
        priority=literal(7),
        run_at=bindparam("p_now"),
        created_at=NOW,  # a literal datetime: through UTCDateTime, as Core converts it
        state="queued",
        attempts=0,
        max_attempts=bindparam("p_attempts"),
    )
    dialect = app.store.engine.dialect
    if dialect.positional:
        with pytest.raises(ValueError, match="plain required bindparam"):
            Prepared(statement, dialect, literals=True)
        return
    compiled = statement.compile(dialect=dialect)
    names = set(compiled.bind_names.values())
    assert {"p_handler", "p_now", "p_attempts"} < names
    assert all(f"%({name})s" in compiled.string for name in names)
    assert 7 in {b.effective_value for b in compiled.bind_names if not b.required}
    with pytest.raises(ValueError, match="plain required bindparam"):
        Prepared(statement, dialect)  # without literals=True: refused as before
    prepared = Prepared(statement, dialect, literals=True)
    params = {"p_handler": "lit", "p_now": NOW, "p_attempts": 2}
    with app.store.engine.connect() as conn, conn.begin():
        prepared.run(conn, params).close()
        conn.execute(statement, {**params, "p_handler": "core"})
    with app.store.read() as conn:
        rows = conn.execute(
            select(
                jobs.c.handler,
                jobs.c.payload,
                jobs.c.queue,
                jobs.c.priority,
                jobs.c.run_at,
                jobs.c.created_at,
                jobs.c.state,
                jobs.c.attempts,
                jobs.c.max_attempts,
            ).order_by(jobs.c.handler)
        ).all()
    assert [row[0] for row in rows] == ["core", "lit"]
    assert rows[0][1:] == rows[1][1:] == ("{}", "default", 7, NOW, NOW, "queued", 0, 2)


# -- pooled connections: pinged only after they sat idle -----------------------------------
@pytest.fixture(params=["postgresql", "mariadb"])
def server_url(request: pytest.FixtureRequest, tmp_path: Any, sqlite_template: Any) -> str:
    from conftest import make_url

    return make_url(request.param, tmp_path, sqlite_template)


def _kill_pooled_backends(app: Scheduler, url: str) -> None:
    """End, from another session, the server side of the connection the app's pool holds."""
    postgres = app.store.engine.dialect.name == "postgresql"
    with app.store.engine.connect() as conn:
        me = conn.execute(
            text("SELECT pg_backend_pid()" if postgres else "SELECT CONNECTION_ID()")
        ).scalar_one()
    killer = create_engine(url)
    try:
        with killer.connect() as other:
            if postgres:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": me})
            else:
                other.execute(text(f"KILL {int(me)}"))
    finally:
        killer.dispose()


def test_an_idle_pooled_connection_is_pinged_and_replaced(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler._store import engine as _store

    monkeypatch.setattr(_store, "IDLE_PING_SECONDS", 0.0)  # every checkout counts as idle
    app = Scheduler(server_url)
    try:
        app.enqueue("h", {})
        _kill_pooled_backends(app, server_url)
        assert app.enqueue("h", {}) > 0  # the ping found it dead; the pool connected anew
    finally:
        app.close()


def test_a_recently_used_connection_is_not_pinged_and_fails_once(server_url: str) -> None:
    """The trade against pinging every checkout: a connection back in the pool for under
    IDLE_PING_SECONDS is handed out unchecked. If the server dropped it meanwhile, that one
    operation fails with a disconnect error, the whole pool is invalidated, the next works."""
    from sqlalchemy.exc import OperationalError

    app = Scheduler(server_url)
    try:
        app.enqueue("h", {})
        _kill_pooled_backends(app, server_url)
        with pytest.raises(OperationalError) as info:
            app.enqueue("h", {})
        assert info.value.connection_invalidated
        assert app.enqueue("h", {}) > 0
    finally:
        app.close()


def test_a_value_converted_last_time_is_reused_only_for_the_same_object(app: Scheduler) -> None:
    """The processors keep their last input: the same `now` for every row of a tick is
    converted once, and any other value, equal or not, is converted on its own."""
    from datetime import timedelta

    later = NOW + timedelta(microseconds=1)
    equal_copy = NOW.replace()  # equal, another object
    with app.store.engine.connect() as conn:
        prepared = PreparedSet(lambda _dialect: INSERT, Prepared).on(conn)
        for when in (NOW, NOW, later, equal_copy, NOW):
            with conn.begin():
                prepared.run(conn, {**VALUES, "p_now": when})
    with app.store.read() as conn:
        stored = conn.execute(select(jobs.c.run_at).order_by(jobs.c.id)).scalars().all()
    assert stored == [NOW, NOW, later, NOW, NOW]


def test_the_sqlalchemy_behaviour_this_adapter_relies_on(app: Scheduler) -> None:
    """What scheduler/_store/driver.py takes from SQLAlchemy beyond its public API, pinned
    here on every engine: an upgrade that changes any of it fails this test."""
    from sqlalchemy.sql.compiler import SQLCompiler

    from scheduler._store.driver import after_cursor, before_cursor, with_paramstyle

    dialect = app.store.engine.dialect
    # A compiled statement lists its bind parameters by name in `binds` (with `required` and
    # `expanding`), its positional order in `positiontup`, its SQL in `string`.
    compiled = INSERT.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    assert set(compiled.binds) == set(VALUES)
    assert all(b.required and not b.expanding for b in compiled.binds.values())
    numbered = with_paramstyle(dialect, "numeric_dollar")
    assert type(numbered) is type(dialect) and numbered.positional
    by_position = INSERT.compile(dialect=numbered)
    assert isinstance(by_position, SQLCompiler)
    assert "$1" in by_position.string and set(by_position.positiontup or ()) == set(VALUES)
    # A bind type's processor for the dialect is what Connection.execute applies.
    processor = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    assert processor is not None

    # Cursor listeners take what Connection.execute passes them, in the same order and kinds;
    # the adapter's calls look the same to them.
    calls: dict[str, list[tuple[Any, ...]]] = {"before": [], "after": []}

    def before(*args: Any) -> None:
        calls["before"].append(args)

    def after(*args: Any) -> None:
        calls["after"].append(args)

    engine = app.store.engine
    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        with engine.connect() as conn:
            conn.execute(select(bindparam("t", NOW, type_=UTCDateTime())))
            public = {k: v[-1] for k, v in calls.items()}
            cursor = conn.connection.cursor()
            before_cursor(conn, cursor, "SELECT 2", ())
            after_cursor(conn, cursor, "SELECT 2", ())
            ours = {k: v[-1] for k, v in calls.items()}
            cursor.close()
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)
    for when in ("before", "after"):
        assert len(ours[when]) == len(public[when]) == 6  # conn, cursor, statement, parameters,
        assert ours[when][0] is public[when][0]  # context, executemany
        assert isinstance(ours[when][2], str) and isinstance(public[when][2], str)
        assert ours[when][5] is public[when][5] is False
    sent = public["before"][3]
    assert processor(NOW) in (list(sent.values()) if isinstance(sent, dict) else list(sent))

    # DBAPIError.instance wraps a driver error in SQLAlchemy's class of the same name.
    dbapi: Any = dialect.loaded_dbapi
    wrapped = DBAPIError.instance(
        "SELECT 1", (), dbapi.IntegrityError("x"), dbapi.Error, dialect=dialect
    )
    assert isinstance(wrapped, IntegrityError)
