"""The ``[database]`` settings take effect: the statement timeout on each server, and
behind a transaction pooler (PgBouncer, ``pooler = "transaction"``) no session state and no
server-side prepared statement, while every transaction still gets its lock and statement
timeouts.

The pooler cases run through this pytest process's PgBouncer (``tests/conftest.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SERVERS
from sqlalchemy import create_engine, select, text, update
from sqlalchemy.exc import DBAPIError

from scheduler import ConfigError, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store import engine as _engine
from scheduler._store import locks as _locks
from scheduler._store.pipeline import Spread
from scheduler._store.tables import jobs
from scheduler.tenancy import SchemaPerTenant

SLEEP = {
    "postgresql": "SELECT pg_sleep(3)",
    "mysql": "SELECT SLEEP(3)",
}


@pytest.fixture
def server_app(db_url: str) -> Iterator[Scheduler]:
    app = Scheduler(db_url, registry=Registry(), statement_timeout=0.5)
    yield app
    app.close()


# SQLite has no statement timeout: the server engines only.
ON_SERVERS = pytest.mark.parametrize("db_url", SERVERS, indirect=True)


@ON_SERVERS
def test_a_statement_of_ours_is_stopped_at_the_statement_timeout(server_app: Scheduler) -> None:
    store = server_app.store
    began = time.monotonic()
    with pytest.raises(DBAPIError) as stopped:
        with store.begin() as conn:
            found = conn.execute(text(SLEEP[store.caps.dialect])).scalar()
            if found == 1:  # MariaDB's SLEEP() returns 1 when interrupted, on some versions
                raise DBAPIError("SLEEP", {}, RuntimeError("interrupted"))
    assert time.monotonic() - began < 2.5
    if store.caps.dialect == "postgresql":
        assert getattr(stopped.value.orig, "sqlstate", None) == _locks.PG_QUERY_CANCELED
    # the queue goes on: the timeout ended one statement, not the connection
    job_id = server_app.enqueue("h")
    assert server_app.get_job(job_id) is not None


@ON_SERVERS
def test_the_statement_timeout_is_off_by_default(db_url: str) -> None:
    app = Scheduler(db_url, registry=Registry())
    try:
        with app.store.begin() as conn:
            if app.store.caps.dialect == "postgresql":
                assert conn.execute(text("SHOW statement_timeout")).scalar() == "0"
            else:
                found = conn.execute(text("SELECT @@session.max_statement_time")).scalar()
                assert float(found) == 0
    finally:
        app.close()


# -- behind a transaction pooler -------------------------------------------------------------
@pytest.fixture
def pooled_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """PostgreSQL through PgBouncer (the pooler setting is in the test's environment)."""
    from conftest import backend_url

    return backend_url(request, "pgbouncer", tmp_path, sqlite_template)


def _other_client_sees(url: str) -> list[tuple[str, str]]:
    """What a plain client of the same pooler finds in the sessions it is handed (its
    statements in autocommit: each on whichever server connection is free)."""
    plain = create_engine(
        url, isolation_level="AUTOCOMMIT", connect_args={"prepare_threshold": None}
    )
    try:
        with plain.connect() as conn:
            return [
                tuple(
                    conn.execute(
                        text(
                            "SELECT current_setting('lock_timeout'),"
                            " current_setting('statement_timeout')"
                        )
                    ).one()
                )
                for _ in range(20)
            ]
    finally:
        plain.dispose()


def test_behind_the_pooler_every_transaction_has_its_settings_and_no_session_keeps_them(
    pooled_url: str,
) -> None:
    app = Scheduler(pooled_url, registry=Registry(), statement_timeout=2.5)

    @app.handler("h", retry_safe=True)
    def h(job: Any) -> None:
        pass

    try:
        app.sync([TaskSpec(f"t{n:02}", "* * * * * *", "h", {}, "UTC") for n in range(20)])
        for _ in range(3):  # every server connection of the pool serves some of these
            app.enqueue("h")
            app.tick()
            app.work()
        with app.store.begin() as conn:
            found = conn.execute(
                text("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')")
            ).one()
        assert tuple(found) == ("5s", "2500ms")
        # A statement sent in its own implicit transaction (the tick's spread dispatches)
        # carries the settings too: settings, statement and Sync in one pipeline.
        spread = Spread(
            text(
                "SELECT (extract(epoch FROM current_setting('statement_timeout')::interval)"
                " * 1000)::int"
            ),
            app.store.engine.dialect,
        )
        with app.store.engine.connect() as a, app.store.engine.connect() as b:
            assert spread.run([a, b], [{}] * 6) == [2500] * 6
            assert not a.in_transaction()
    finally:
        app.close()
    assert set(_other_client_sees(pooled_url)) == {("0", "0")}  # nothing leaked
    plain = create_engine(
        pooled_url, isolation_level="AUTOCOMMIT", connect_args={"prepare_threshold": None}
    )
    try:
        with plain.connect() as conn:  # no server-side prepared statement on any connection
            prepared = "SELECT count(*) FROM pg_prepared_statements"
            counts = {conn.execute(text(prepared)).scalar() for _ in range(12)}
    finally:
        plain.dispose()
    assert counts == {0}


def test_behind_the_pooler_a_lock_wait_is_still_bounded(
    pooled_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC's "no lock waits": the lock timeout set per transaction holds behind a pooler
    (a session setting would have landed on another server connection)."""
    monkeypatch.setattr(_engine, "LOCK_TIMEOUT_SECONDS", 1)
    app = Scheduler(pooled_url, registry=Registry())
    holder = create_engine(pooled_url, connect_args={"prepare_threshold": None})
    try:
        job_id = app.enqueue("h")
        with holder.connect() as conn, conn.begin():
            conn.execute(select(jobs.c.id).where(jobs.c.id == job_id).with_for_update())
            began = time.monotonic()
            with pytest.raises(DBAPIError) as waited, app.store.begin() as mine:
                mine.execute(update(jobs).where(jobs.c.id == job_id).values(priority=1))
            assert time.monotonic() - began < 4
        assert _locks.timed_out(waited.value)
    finally:
        holder.dispose()
        app.close()


def test_behind_the_pooler_tenants_search_path_is_per_transaction(pooled_url: str) -> None:
    admin = create_engine(
        pooled_url, isolation_level="AUTOCOMMIT", connect_args={"prepare_threshold": None}
    )
    names = ("tenant_pgb_a", "tenant_pgb_b")
    with admin.connect() as conn:
        for name in names:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {name} CASCADE"))
            conn.execute(text(f"CREATE SCHEMA {name}"))
            conn.execute(text(f"CREATE TABLE {name}.who (name text)"))
            conn.execute(text(f"INSERT INTO {name}.who VALUES ('{name}')"))
    tenants = SchemaPerTenant(pooled_url)
    assert tenants.unprepared  # from SCHEDULER_DATABASE_POOLER
    try:
        seen = []
        for n in range(12):  # past psycopg's prepare threshold (5), on every server connection
            schema = names[n % 2]
            with tenants.context(schema), tenants.connect() as conn:
                seen.append(conn.execute(text("SELECT name FROM who")).scalar())
        assert seen == [names[n % 2] for n in range(12)]
        with admin.connect() as conn:  # the search_path did not stay on a server connection
            paths = {conn.execute(text("SHOW search_path")).scalar() for _ in range(12)}
        assert not any("tenant_pgb" in path for path in paths), paths
    finally:
        tenants.dispose()
        with admin.connect() as conn:
            for name in names:
                conn.execute(text(f"DROP SCHEMA IF EXISTS {name} CASCADE"))
        admin.dispose()


@pytest.mark.parametrize(
    "url", ["sqlite:///nowhere.db", "mysql+pymysql://root@127.0.0.1:3306/test"]
)
def test_pooler_transaction_is_refused_off_postgresql(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pooler = 'transaction' is for PostgreSQL"):
        Scheduler(url, registry=Registry(), pooler="transaction")


def test_the_settings_sql(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _engine.DatabaseSettings(statement_timeout=1.25, pooler="transaction")
    local = _engine.local_settings(settings)
    assert "set_config('statement_timeout', '1250ms', true)" in local
    assert "'lock_timeout'" in local and local.count(", true)") == 2
    assert "statement_timeout" not in _engine.local_settings(_engine.DatabaseSettings())
    session = _engine._session_settings("postgresql", settings, "postgresql")
    assert session.endswith("SET statement_timeout = '1250ms'")
    maria = _engine._session_settings("mysql", settings, "mariadb")
    assert maria.endswith("max_statement_time = 1.25")
    mysql = _engine._session_settings("mysql", settings, "mysql")
    assert mysql.endswith("max_execution_time = 1250")
