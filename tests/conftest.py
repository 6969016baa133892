"""Backends for the contract suite: SQLite files, PostgreSQL and MariaDB over real connections.

PostgreSQL (``SCHEDULER_TEST_PG``, default database ``test`` on 127.0.0.1:5432) and MariaDB
(``SCHEDULER_TEST_MYSQL``, database ``test`` on 127.0.0.1:3306) are skipped with a reason when
unreachable on a developer's machine; with ``CI=true`` an unreachable server fails the run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, delete, text

from scheduler import Scheduler
from scheduler._handlers import Registry
from scheduler._migrate import VERSION_TABLE
from scheduler._store import Store
from scheduler._tables import metadata

PG_URL = os.environ.get("SCHEDULER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("SCHEDULER_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

_reachable: dict[str, str | None] = {}


def server_problem(url: str) -> str | None:
    """None if the server answers, else why not (cached)."""
    if url not in _reachable:
        try:
            engine = create_engine(url, connect_args={"connect_timeout": 3})
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            engine.dispose()
            _reachable[url] = None
        except Exception as exc:  # any driver error means "not here"
            _reachable[url] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return _reachable[url]


def require_server(url: str, label: str) -> None:
    problem = server_problem(url)
    if problem is None:
        return
    message = f"{label} at {url} is not reachable ({problem})"
    if IN_CI:
        pytest.fail(f"{message}; CI requires it", pytrace=False)
    pytest.skip(message)


def _reset_tables(url: str) -> None:
    """Migrate once per session (Alembic), then empty the tables before each test."""
    store = Store(url)
    try:
        with store.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(delete(table))
    finally:
        store.dispose()


_migrated: set[str] = set()


def _fresh_server_db(url: str) -> None:
    if url not in _migrated:
        store = Store(url)
        try:
            with store.begin() as conn:
                for table in reversed(metadata.sorted_tables):
                    conn.execute(text(f"DROP TABLE IF EXISTS {table.name}"))
                conn.execute(text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))
            Scheduler(engine=store.engine, registry=Registry()).migrate()
        finally:
            store.dispose()
        _migrated.add(url)
    _reset_tables(url)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    app = Scheduler(f"sqlite:///{path}", registry=Registry())
    app.migrate()
    app.close()
    return path


def make_url(backend: str, tmp_path: Path, sqlite_template: Path) -> str:
    if backend == "sqlite":
        path = tmp_path / "scheduler.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite:///{path}"
    url, label = (PG_URL, "PostgreSQL") if backend == "postgresql" else (MYSQL_URL, "MariaDB")
    require_server(url, label)
    _fresh_server_db(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A migrated, empty database on each engine."""
    return make_url(request.param, tmp_path, sqlite_template)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url_sp(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A migrated, empty database on SQLite and PostgreSQL (the process-race backends)."""
    return make_url(request.param, tmp_path, sqlite_template)


@pytest.fixture
def pg_url(tmp_path: Path, sqlite_template: Path) -> str:
    return make_url("postgresql", tmp_path, sqlite_template)


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    """A Scheduler with its own handler registry on each engine."""
    scheduler = Scheduler(db_url, registry=Registry())
    yield scheduler
    scheduler.close()
