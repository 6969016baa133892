"""A PostgreSQL database of this pytest process's own for the tests of shards
(``[database] shards``): the shard schemas have fixed names (``scheduler_shard_0`` …), so two
pytest processes (xdist) or sessions on one server would share them in one database. Each
process has two, dropped at the end (:func:`drop`):

- ``sched_<pid>_shards`` (:data:`NAME`), emptied of the scheduler's schemas and tables before
  each test that asks for it (:func:`fresh`): what a database is before ``scheduler migrate``,
  for the tests of ``migrate`` and ``--reshard`` themselves and of what a layout refuses;
- ``sched_<pid>_sharded`` (:data:`MIGRATED`), migrated with :data:`SHARDS` shards once and kept
  for the next test that asks for it (:func:`migrated`), emptied of every shard's rows, each
  shard's sequences set back to its first id (``i - 1 = k`` modulo the shards, as
  ``migrate``'s :func:`scheduler._store.shards.start_sequences` leaves them) and the day
  partitions a test added dropped: what ``migrate`` makes, without its seconds per test. A
  test that changed its layout (a reshard, a schema dropped) has it migrated anew.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, make_url

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store import partitions as _partitions
from scheduler._store import shards as _shards
from scheduler._store.tables import metadata

NAME = f"sched_{os.getpid()}_shards"
MIGRATED = f"sched_{os.getpid()}_sharded"
SHARDS = 4
"""The shards of :func:`migrated`'s database."""

_made: list[tuple[str, str]] = []  # (server, database) created
_migrated: list[str] = []  # the server whose MIGRATED holds SHARDS migrated shards, if one does


def url(server: str, database: str = NAME) -> str:
    """This process's shards `database` on `server` (a PostgreSQL URL of any database)."""
    return make_url(server).set(database=database).render_as_string(hide_password=False)


def fresh(server: str, database: str = NAME) -> str:
    """This process's shards `database`, created on first use, with no shard schema and none of
    the scheduler's tables in ``public``: what a database is before ``scheduler migrate``."""
    if database == MIGRATED:
        _migrated.clear()
    if (server, database) not in _made:
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            conn.execute(text(f"CREATE DATABASE {database}"))
        engine.dispose()
        _made.append((server, database))
    engine = create_engine(url(server, database), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        schemas = conn.execute(
            text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'scheduler\\_shard\\_%'")
        ).scalars()
        for schema in list(schemas):
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    return url(server, database)


def migrated(server: str) -> str:
    """This process's :data:`MIGRATED` database: :data:`SHARDS` migrated shards with no rows
    (migrated on first use, and again when a test changed its layout)."""
    found = url(server, MIGRATED)
    if _migrated == [server]:
        engine = create_engine(found)
        try:
            with engine.begin() as conn:
                if _intact(conn):
                    _empty(conn)
                    return found
        finally:
            engine.dispose()
    fresh(server, MIGRATED)
    app = Scheduler(found, shards=SHARDS, registry=Registry())
    try:
        app.migrate()
    finally:
        app.close()
    _migrated.append(server)
    return found


_LAYOUT = text(
    "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
    " AND (n.nspname = 'public' OR n.nspname LIKE 'scheduler\\_shard\\_%')"
)


def _intact(conn: Connection) -> bool:
    """Whether the database still holds exactly the :data:`SHARDS` shards' tables (a test may
    have resharded, or dropped or added a schema or table): else it is migrated anew."""
    wanted = {t.name for t in metadata.sorted_tables} | {_shards.VERSION_TABLE}
    found: dict[str, set[str]] = {}
    for schema, table in conn.execute(_LAYOUT).all():
        found.setdefault(str(schema), set()).add(str(table))
    if found != {_shards.schema_name(index): wanted for index in range(SHARDS)}:
        return False
    steps = conn.execute(_STEPS, {"step": SHARDS}).scalar()
    return steps == 0  # every shard's sequences still step by SHARDS


_STEPS = text(
    "SELECT count(*) FROM pg_sequences WHERE schemaname LIKE 'scheduler\\_shard\\_%'"
    " AND increment_by <> :step"
)


def _empty(conn: Connection) -> None:
    """Every shard's rows deleted (after a test of many rows: one ``TRUNCATE`` of every
    shard's tables instead, as :func:`conftest._reset_tables` does; ``CONTINUE IDENTITY``, since
    a restart would set every shard's sequences to 1), then each shard's sequences at its first
    id and its day partitions those of a freshly migrated database. (A ``DELETE`` of a test's
    few rows takes a few milliseconds a table, a ``TRUNCATE`` of the 40 tables about a
    second.)"""
    if conn.execute(_MANY).scalar():
        names = ", ".join(
            f"{_shards.schema_name(index)}.{table.name}"
            for index in range(SHARDS)
            for table in metadata.sorted_tables
        )
        conn.execute(text(f"TRUNCATE {names}"))
    else:
        for index in range(SHARDS):
            for table in reversed(metadata.sorted_tables):
                conn.execute(text(f"DELETE FROM {_shards.schema_name(index)}.{table.name}"))
    today = datetime.now(UTC).date()
    kept = {today + timedelta(days=n) for n in range(_partitions.DAYS_AHEAD + 1)}
    for index in range(SHARDS):
        schema = _shards.schema_name(index)
        conn.execute(text(f"SET LOCAL search_path TO {schema}"))
        for name in _partitions.PARTITIONED:
            for day, child in _partitions.days(conn, name).items():
                if day not in kept:
                    conn.execute(text(f"DROP TABLE {child}"))
        conn.execute(
            text(
                "SELECT setval(format('%I.%I', schemaname, sequencename), :first, false)"
                " FROM pg_sequences WHERE schemaname = :schema"
            ),
            {"first": _shards.next_id(0, index, SHARDS), "schema": schema},
        )


_MANY = text(
    "SELECT "
    + " + ".join(
        f"(SELECT count(*) FROM (SELECT 1 FROM {_shards.schema_name(index)}.{table}"
        " LIMIT 501) AS r)"
        for index in range(SHARDS)
        for table in ("scheduler_jobs", "scheduler_runs")
    )
    + " > 500"
)


def drop() -> None:
    """Drop this process's shards databases (at the end of the session)."""
    _migrated.clear()
    while _made:
        server, database = _made.pop()
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        engine.dispose()
