"""A PostgreSQL database of this pytest process's own for the tests of shards
(``[database] shards``): the shard schemas have fixed names (``scheduler_shard_0`` …), so two
pytest processes (xdist) or sessions on one server would share them in one database. Each
process has its database, ``sched_<pid>_shards``, emptied of the scheduler's schemas and tables
before each test that asks for it (:func:`fresh`) and dropped at the end (:func:`drop`).
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

NAME = f"sched_{os.getpid()}_shards"
_made: list[str] = []


def url(server: str) -> str:
    """This process's shards database on `server` (a PostgreSQL URL of any database)."""
    return make_url(server).set(database=NAME).render_as_string(hide_password=False)


def fresh(server: str) -> str:
    """This process's shards database, created on first use, with no shard schema and none of
    the scheduler's tables in ``public``: what a database is before ``scheduler migrate``."""
    if not _made:
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {NAME} WITH (FORCE)"))
            conn.execute(text(f"CREATE DATABASE {NAME}"))
        engine.dispose()
        _made.append(server)
    engine = create_engine(url(server), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        schemas = conn.execute(
            text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'scheduler\\_shard\\_%'")
        ).scalars()
        for schema in list(schemas):
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
    return url(server)


def drop() -> None:
    """Drop this process's shards database (at the end of the session)."""
    while _made:
        server = _made.pop()
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {NAME} WITH (FORCE)"))
        engine.dispose()
