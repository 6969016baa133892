"""PostgreSQL: one statement run for many parameter sets over several connections at once, from
one thread, each set its own transaction (scheduler/_pgspread.py, the tick's fresh dispatch)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from helpers.job_statements import INSERT as INSERT_JOB
from sqlalchemy import Connection, create_engine, event, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.pipeline import Spread
from scheduler._store.tables import jobs

NOW = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

INSERT = INSERT_JOB.returning(jobs.c.id)  # returning the new id


def values(i: int, **changes: Any) -> dict[str, Any]:
    return {
        "p_handler": f"h{i}",
        "p_payload": '{"n": "é"}',
        "p_queue": "default",
        "p_priority": i,
        "p_now": NOW,
        "p_state": "queued",
        "p_attempts": 1,
        **changes,
    }


@pytest.fixture
def app(pg_url: str) -> Iterator[Scheduler]:
    scheduler = Scheduler(pg_url, registry=Registry())
    scheduler.migrate()
    yield scheduler
    scheduler.close()


@pytest.fixture
def direct_app(direct_pg_url: str) -> Iterator[Scheduler]:
    """Never through PgBouncer: a backend of one's own to terminate, statements prepared."""
    scheduler = Scheduler(direct_pg_url, registry=Registry())
    yield scheduler
    scheduler.close()


def spread(app: Scheduler) -> Spread:
    return Spread(INSERT, app.store.engine.dialect)


def backend(conn: Connection) -> int:
    return int(conn.connection.driver_connection.info.backend_pid)  # type: ignore[union-attr]


def terminate(url: str, pid: int) -> None:
    killer = create_engine(url)
    try:
        with killer.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    finally:
        killer.dispose()


def stored(app: Scheduler) -> list[tuple[str, datetime, str]]:
    with app.store.read() as conn:
        found = conn.execute(select(jobs.c.handler, jobs.c.run_at, jobs.c.payload))
        return sorted((h, r, p) for h, r, p in found)


def test_each_set_commits_on_its_own_over_every_connection(app: Scheduler) -> None:
    seen: list[tuple[int, str]] = []

    def before(conn: Connection, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append((backend(conn), statement))

    event.listen(app.store.engine, "before_cursor_execute", before)
    try:
        with app.store.engine.connect() as a, app.store.engine.connect() as b:
            with app.store.engine.connect() as c:
                ids = spread(app).run([a, b, c], [values(i) for i in range(20)])
                backends = {backend(a), backend(b), backend(c)}
    finally:
        event.remove(app.store.engine, "before_cursor_execute", before)
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == 20
    with app.store.read() as conn:  # each set returned its own row's id
        found = dict(conn.execute(select(jobs.c.id, jobs.c.handler)).all())
    assert [found[i] for i in ids] == [f"h{i}" for i in range(20)]
    # the values went through the column types: the same instant back, microseconds kept
    assert stored(app) == sorted((f"h{i}", NOW, '{"n": "é"}') for i in range(20))
    assert len(seen) == 20 and {pid for pid, _ in seen} == backends  # events, all 3 sessions


def test_a_failing_set_fails_alone(app: Scheduler) -> None:
    sets = [values(i) for i in range(10)]
    sets[4] = values(4, p_handler=None)  # NOT NULL
    with app.store.engine.connect() as a, app.store.engine.connect() as b:
        results = spread(app).run([a, b], sets)
        assert not a.invalidated and not b.invalidated
        assert isinstance(results[4], IntegrityError)
        assert [type(r) for i, r in enumerate(results) if i != 4] == [int] * 9
        # the sessions are still usable, outside any transaction
        assert spread(app).run([a, b], [values(10)])[0] > 0
    assert [h for h, _, _ in stored(app)] == sorted(f"h{i}" for i in range(11) if i != 4)


def test_a_lost_connection_fails_its_set_and_the_others_run_elsewhere(
    direct_app: Scheduler, direct_pg_url: str
) -> None:
    app = direct_app
    with app.store.engine.connect() as a, app.store.engine.connect() as b:
        spread(app).run([a, b], [values(0), values(1)])  # both prepared
        terminate(direct_pg_url, backend(b))
        results = spread(app).run([a, b], [values(i) for i in range(2, 12)])
        failed = [r for r in results if isinstance(r, BaseException)]
        assert len(failed) <= 1  # the set in flight on b, if b was sent one before it broke
        for error in failed:
            assert isinstance(error, DBAPIError) and error.connection_invalidated
        assert b.invalidated and not a.invalidated
        done = [i for i in range(2, 12) if isinstance(results[i - 2], int)]
    assert [h for h, _, _ in stored(app)] == sorted(f"h{i}" for i in [0, 1, *done])
    assert len(done) >= 9


def test_when_every_connection_is_lost_every_set_fails(
    direct_app: Scheduler, direct_pg_url: str
) -> None:
    app = direct_app
    with app.store.engine.connect() as a:
        spread(app).run([a], [values(0)])
        terminate(direct_pg_url, backend(a))
        results = spread(app).run([a], [values(i) for i in range(1, 4)])
        assert all(isinstance(r, DBAPIError) and r.connection_invalidated for r in results)
        assert a.invalidated
    assert app.enqueue("h", {}) > 0  # the pool replaced the connection


def test_a_session_that_lost_its_prepared_statements_prepares_again(
    direct_app: Scheduler, direct_pg_url: str
) -> None:
    app = direct_app
    engine = create_engine(direct_pg_url)
    try:
        one = Spread(INSERT, engine.dialect)
        with engine.connect() as conn:
            assert one.run([conn], [values(0)])[0] > 0
            conn.exec_driver_sql("DEALLOCATE ALL")  # as DISCARD ALL or a pooler would
            conn.commit()
            assert one.run([conn], [values(1)])[0] > 0  # sent again after preparing again
            names = conn.execute(text("SELECT name FROM pg_prepared_statements")).scalars()
            assert one.name.decode() in set(names)
            conn.commit()
    finally:
        engine.dispose()
    assert [h for h, _, _ in stored(app)] == ["h0", "h1"]


def test_behind_a_transaction_pooler_nothing_is_prepared(app: Scheduler, pg_url: str) -> None:
    """prepare_threshold=None (PgBouncer in transaction mode): unnamed statements only."""
    engine = create_engine(pg_url, connect_args={"prepare_threshold": None})
    try:
        with engine.connect() as a, engine.connect() as b:
            results = Spread(INSERT, engine.dialect).run([a, b], [values(i) for i in range(6)])
            assert [type(r) for r in results] == [int] * 6
            for conn in (a, b):
                prepared = conn.execute(text("SELECT count(*) FROM pg_prepared_statements"))
                assert prepared.scalar_one() == 0
                conn.commit()
    finally:
        engine.dispose()


class _Interrupt(BaseException):
    pass


def test_an_interrupted_run_invalidates_the_connections_with_a_statement_in_flight(
    app: Scheduler,
) -> None:
    calls: list[int] = []

    def before(*_args: Any) -> None:
        calls.append(1)
        if len(calls) == 2:  # the first set is in flight on `a`
            raise _Interrupt

    with app.store.engine.connect() as a, app.store.engine.connect() as b:
        event.listen(app.store.engine, "before_cursor_execute", before)
        try:
            with pytest.raises(_Interrupt):
                spread(app).run([a, b], [values(i) for i in range(4)])
        finally:
            event.remove(app.store.engine, "before_cursor_execute", before)
        assert a.invalidated  # its result was never read: the session cannot be reused
        assert not b.invalidated


def test_connections_are_taken_lazily_and_no_more_than_needed(app: Scheduler) -> None:
    """The first connection has its statement in flight before the second is taken from the
    pool; two items take two connections of the three offered."""
    from psycopg import pq

    taken: list[tuple[str, Any]] = []

    def connections() -> Iterator[Connection]:
        engine = app.store.engine
        with engine.connect() as a:
            taken.append(("a", None))
            yield a
            first = a.connection.driver_connection.pgconn.transaction_status  # type: ignore[union-attr]
            with engine.connect() as b:
                taken.append(("b", first))
                yield b
                with engine.connect() as c:
                    taken.append(("c", None))
                    yield c

    offered = connections()
    try:
        results = spread(app).run(offered, [values(0), values(1)])
    finally:
        offered.close()
    assert [type(r) for r in results] == [int, int]
    assert [name for name, _ in taken] == ["a", "b"]
    assert taken[1][1] == pq.TransactionStatus.ACTIVE  # a's statement was running
    assert spread(app).run([], []) == []


def test_connections_inside_a_transaction_are_refused(app: Scheduler) -> None:
    with app.store.engine.connect() as conn, conn.begin():
        with pytest.raises(RuntimeError, match="outside a transaction"):
            spread(app).run([conn], [values(0)])


def test_values_are_sent_as_postgresqls_text_input() -> None:
    import enum

    from scheduler._store.pipeline import _text

    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        pass

    sent = [None, True, False, 7, Level.HIGH, 1.5, "é", Name("n"), datetime(2030, 1, 2, 3, 4, 5, 6)]
    assert [_text(v, "utf-8") for v in sent] == [
        None,
        b"t",
        b"f",
        b"7",
        b"3",
        b"1.5",
        "é".encode(),
        b"n",
        b"2030-01-02 03:04:05.000006",
    ]
    with pytest.raises(TypeError, match="no text form for a bytes parameter"):
        _text(b"raw", "utf-8")


def test_with_stop_on_none_nothing_is_sent_after_a_set_returned_no_row(app: Scheduler) -> None:
    """The tick's lost race (the dispatch returned no row) stops the rest of the batch: the sets
    in flight finish, the others are never sent and come back as UNSENT."""
    from sqlalchemy import Integer, bindparam, literal_column

    from scheduler._store.pipeline import UNSENT

    n = bindparam("p_n", type_=Integer)
    positive = Spread(select(n).where(n >= literal_column("0")), app.store.engine.dialect)
    sent: list[str] = []

    def before(_conn: Connection, _cursor: Any, statement: str, *_rest: Any) -> None:
        sent.append(statement)

    sets = [{"p_n": v} for v in (0, 1, -1, 3, 4)]
    event.listen(app.store.engine, "before_cursor_execute", before)
    try:
        with app.store.engine.connect() as conn:
            assert positive.run([conn], sets) == [0, 1, None, 3, 4]
            assert len(sent) == 5
            sent.clear()
            assert positive.run([conn], sets, stop_on_none=True) == [0, 1, None, UNSENT, UNSENT]
            assert len(sent) == 3
    finally:
        event.remove(app.store.engine, "before_cursor_execute", before)
