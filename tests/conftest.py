"""Backends for the contract suite: SQLite files, PostgreSQL and MariaDB over real connections.

PostgreSQL (``SCHEDULER_TEST_PG``, default database ``test`` on 127.0.0.1:5432) and MariaDB
(``SCHEDULER_TEST_MYSQL``, database ``test`` on 127.0.0.1:3306) are skipped with a reason when
unreachable on a developer's machine; with ``CI=true`` an unreachable server fails the run.

``citus``: a Citus coordinator and two worker nodes of the pytest process's own, with the 4
shard schemas of a sharded scheduler as distributed schemas, 2 on each worker node, each test
working in one of them in turn (``tests/helpers/citus_cluster.py``), for the tests marked
``citus`` (the core of the suite); the other tests' ``citus`` cases are deselected. Skipped with the
reason without Citus; required with ``CI=true``.

``pgbouncer``: the PostgreSQL cases once more (but those of the few tests marked ``direct``;
all with ``SCHEDULER_TEST_POOLER=all``), through a PgBouncer in transaction mode with a
small pool (``reliability/_pgbouncer.py``), one per pytest process, started on first use on a
free port and stopped at the end; the test runs with ``SCHEDULER_DATABASE_POOLER=transaction``
(so every Scheduler and Store it makes, and every worker process it starts, knows). Skipped
with the reason without Debian's ``pgbouncer``; required with ``CI=true``.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, delete, text
from sqlalchemy.engine import make_url as make_sa_url

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store import Connection, Store
from scheduler._store import partitions as _partitions
from scheduler._store.migrate import VERSION_TABLE
from scheduler._store.tables import metadata

PG_SERVER = os.environ.get("SCHEDULER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MYSQL_SERVER = os.environ.get("SCHEDULER_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Each pytest session works in its own PostgreSQL schema and MariaDB database, so two
# sessions on one machine never empty each other's tables. Subprocesses get the full URL.
_SESSION = f"sched_{os.getpid()}"
PG_URL = f"{PG_SERVER}?options=-csearch_path%3D{_SESSION}"
MYSQL_URL = MYSQL_SERVER.rsplit("/", 1)[0] + f"/{_SESSION}"

_reachable: dict[str, str | None] = {}

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "reliability"))
import _pgbouncer  # noqa: E402
from helpers import citus_cluster, shard_db  # noqa: E402

PGBOUNCER_POOL = 4  # server connections the pooler keeps for this pytest process
_bouncer: list[_pgbouncer.PgBouncer] = []
_bouncer_problem: list[str] = []


def pgbouncer_url() -> str:
    """The URL of this pytest process's PgBouncer (started on first use) in front of the
    PostgreSQL server, whose connections use this session's schema; skips (fails under CI)
    without pgbouncer."""
    if not _bouncer and not _bouncer_problem:
        server = make_sa_url(PG_SERVER)
        bouncer = _pgbouncer.PgBouncer(
            {
                _SESSION: (server.database or "test", _SESSION),
                shard_db.NAME: (shard_db.NAME, None),
                shard_db.MIGRATED: (shard_db.MIGRATED, None),
            },
            server_host=server.host or "127.0.0.1",
            server_port=server.port or 5432,
            pool_size=PGBOUNCER_POOL,
        )
        try:
            _bouncer.append(bouncer.start())
            atexit.register(bouncer.stop)  # also if the session never finishes cleanly
        except (FileNotFoundError, RuntimeError) as exc:
            _bouncer_problem.append(str(exc))
    if _bouncer_problem:
        message = f"PgBouncer: {_bouncer_problem[0]}"
        if IN_CI:
            pytest.fail(f"{message}; CI requires it", pytrace=False)
        pytest.skip(message)
    return _bouncer[0].url(_SESSION)


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
    server = PG_SERVER if url == PG_URL else MYSQL_SERVER
    problem = server_problem(server)
    if problem is None:
        return
    message = f"{label} at {url} is not reachable ({problem})"
    if IN_CI:
        pytest.fail(f"{message}; CI requires it", pytrace=False)
    pytest.skip(message)


_MANY = text(
    "SELECT (SELECT count(*) FROM (SELECT 1 FROM scheduler_jobs LIMIT 501) j)"
    " + (SELECT count(*) FROM (SELECT 1 FROM scheduler_runs LIMIT 501) r) > 500"
)


def _reset_tables(url: str) -> None:
    """Migrate once per session (Alembic), then empty the tables before each test.
    On PostgreSQL, after a test of many jobs, the tables are truncated instead: a DELETE
    leaves every row dead until a vacuum, and with autovacuum off (or behind) the session's
    next tests would read through them. (TRUNCATE costs more than a DELETE of a few rows.)"""
    store = Store(url)
    try:
        with store.begin() as conn:
            if store.engine.dialect.name == "postgresql":
                _drop_stray_partitions(conn)
            if store.engine.dialect.name == "postgresql" and conn.execute(_MANY).scalar():
                names = ", ".join(table.name for table in metadata.sorted_tables)
                conn.execute(text(f"TRUNCATE {names}"))
                return
            for table in reversed(metadata.sorted_tables):
                conn.execute(delete(table))
    finally:
        store.dispose()


def _drop_stray_partitions(conn: Connection) -> None:
    """Drop the day partitions of the history and the decision log (PostgreSQL) that a test's
    purge made for its own clock's days (2030, say), so that the next test's rows of those days
    go to the default partition as on a freshly migrated database: only today's and the next
    days' are kept, the migration's."""
    today = datetime.now(UTC).date()
    kept = {today + timedelta(days=n) for n in range(_partitions.DAYS_AHEAD + 1)}
    for name in _partitions.PARTITIONED:
        for day, child in _partitions.days(conn, name).items():
            if day not in kept:
                conn.execute(text(f"DROP TABLE {child}"))


_migrated: set[str] = set()


def _create_namespace(url: str) -> None:
    if url not in (PG_URL, MYSQL_URL):  # Citus: the cluster's, made by cluster()
        citus_cluster.cluster().distributed_schema(citus_cluster.schema_of(url))
        return
    if url == PG_URL:
        ddl = f"CREATE SCHEMA IF NOT EXISTS {_SESSION}"
        server = PG_SERVER
    else:
        ddl = f"CREATE DATABASE IF NOT EXISTS {_SESSION}"
        server = MYSQL_SERVER
    engine = create_engine(server, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(ddl))
    engine.dispose()


def _drop_namespaces() -> None:
    for url, server, ddl in (
        (PG_URL, PG_SERVER, f"DROP SCHEMA IF EXISTS {_SESSION} CASCADE"),
        (MYSQL_URL, MYSQL_SERVER, f"DROP DATABASE IF EXISTS {_SESSION}"),
    ):
        if url in _migrated:
            engine = create_engine(server, isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                conn.execute(text(ddl))
            engine.dispose()


# Tests run in parallel processes (pytest-xdist). A test marked ``exclusive`` (it restarts the
# shared PostgreSQL server) must run alone. Every test holds a shared lock on one file while it
# runs, an exclusive test an exclusive one; all of them pass through a gate first, which the
# exclusive test keeps closed while it waits, so the others' next tests cannot starve it.
# The files are the machine's, not the run's: a second checkout's test run on the same machine
# (and the same server) waits for the restart too, instead of failing in the middle of it.
_LOCK_PATH = Path(tempfile.gettempdir()) / "scheduler-tests.lock"
_GATE_PATH = Path(tempfile.gettempdir()) / "scheduler-tests.gate"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    exclusive = item.get_closest_marker("exclusive") is not None
    with _GATE_PATH.open("a") as gate, _LOCK_PATH.open("a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one and a half test processes per CPU (at least 2; ``--maxprocesses`` caps
    it): most tests wait on worker processes, servers and sockets more than they compute."""
    return max(2, (os.cpu_count() or 1) * 3 // 2)


# Every PostgreSQL case runs once more through PgBouncer, but for the few tests marked
# ``direct``: their subject is the server or the host (vacuum, clocks), not the connection,
# and each takes many seconds. SCHEDULER_TEST_POOLER=all runs those through it too.
# A ``citus`` case runs for the tests marked ``citus`` only (the suite's core);
# SCHEDULER_TEST_CITUS=all runs every test's (to find what else Citus refuses).
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    every_pooled = os.environ.get("SCHEDULER_TEST_POOLER", "").lower() == "all"
    every_citus = os.environ.get("SCHEDULER_TEST_CITUS", "").lower() == "all"
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        engines = callspec.params.values() if callspec is not None else ()
        through_pooler = "pgbouncer" in engines and not every_pooled
        direct = item.get_closest_marker("direct") is not None
        on_citus = CITUS in engines and not every_citus and not item.get_closest_marker("citus")
        (drop if (through_pooler and direct) or on_citus else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    while _bouncer:
        _bouncer.pop().stop()
    citus_cluster.stop()
    _drop_namespaces()
    shard_db.drop()


def _fresh_server_db(url: str) -> None:
    if url not in _migrated:
        _create_namespace(url)
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


def make_url(backend: str, tmp_path: Path, sqlite_template: Path, shard: int | None = None) -> str:
    """A migrated, empty database for `backend`. For ``pgbouncer`` the caller also sets
    ``SCHEDULER_DATABASE_POOLER=transaction`` for the test (:func:`backend_url` does)."""
    if backend == "sqlite":
        path = tmp_path / "scheduler.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite:///{path}"
    if backend == CITUS:  # a shard's schema: `shard`'s, else the next in turn
        url = citus_cluster.url(shard)
        _fresh_server_db(url)
        return url
    if backend == "pgbouncer":
        require_server(PG_URL, "PostgreSQL")
        url = pgbouncer_url()
        _fresh_server_db(PG_URL)
        return url
    url, label = (PG_URL, "PostgreSQL") if backend == "postgresql" else (MYSQL_URL, "MariaDB")
    require_server(url, label)
    _fresh_server_db(url)
    return url


def backend_url(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, template: Path
) -> str:
    """:func:`make_url`; through PgBouncer, the test runs with the pooler setting and a direct
    ``listen_url`` in its environment (worker processes it starts inherit them)."""
    if backend == "pgbouncer":
        monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
        monkeypatch.setenv("SCHEDULER_DATABASE_POOLER", "transaction")
        # As in production behind a pooler: wake-ups LISTEN on a direct connection.
        monkeypatch.setenv("SCHEDULER_DATABASE_LISTEN_URL", PG_URL)
    return make_url(backend, tmp_path, template)


CITUS = "citus"
"""The engine id of a Citus cluster (:mod:`helpers.citus_cluster`), for the tests marked
``citus``."""

SERVERS = ("postgresql", "pgbouncer", "mariadb")
"""The server engines of :func:`db_url`: ``pytest.mark.parametrize("db_url", SERVERS,
indirect=True)`` for a test that does not apply to SQLite."""


@pytest.fixture(params=["sqlite", *SERVERS, CITUS])
def db_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A migrated, empty database on each engine (PostgreSQL also through PgBouncer; Citus for
    the tests marked ``citus``)."""
    return backend_url(request, request.param, tmp_path, sqlite_template)


@pytest.fixture(params=["sqlite", "postgresql", "pgbouncer"])
def db_url_sp(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A migrated, empty database on SQLite and PostgreSQL (the process-race backends),
    PostgreSQL also through PgBouncer."""
    return backend_url(request, request.param, tmp_path, sqlite_template)


@pytest.fixture(params=["postgresql", "pgbouncer", CITUS])
def pg_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A migrated, empty PostgreSQL database, directly and through PgBouncer (and on Citus for
    the tests marked ``citus``)."""
    return backend_url(request, request.param, tmp_path, sqlite_template)


@pytest.fixture(params=["postgresql", "pgbouncer"])
def shards_url(request: pytest.FixtureRequest) -> str:
    """An empty PostgreSQL database of this pytest process's own, not migrated, for the tests of
    ``[database] shards`` (:mod:`helpers.shard_db`), directly and through PgBouncer (then with
    the pooler setting and a direct ``listen_url`` in the test's environment)."""
    require_server(PG_URL, "PostgreSQL")
    return _shards_engine(request, shard_db.fresh(PG_SERVER), shard_db.NAME)


@pytest.fixture(params=["postgresql", "pgbouncer"])
def sharded_url(request: pytest.FixtureRequest) -> str:
    """:func:`shards_url`'s database with ``shards = 4`` migrated and no rows
    (:func:`helpers.shard_db.migrated`: another database, migrated once per pytest process and
    emptied of its rows before each test), for the tests whose subject is not ``migrate``
    itself; directly and through PgBouncer."""
    require_server(PG_URL, "PostgreSQL")
    return _shards_engine(request, shard_db.migrated(PG_SERVER), shard_db.MIGRATED)


def _shards_engine(request: pytest.FixtureRequest, direct: str, database: str) -> str:
    """The shards `database` (at URL `direct`) directly, or through PgBouncer (with the pooler
    setting and a direct ``listen_url`` in the test's environment)."""
    if request.param != "pgbouncer":
        return direct
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("SCHEDULER_DATABASE_POOLER", "transaction")
    monkeypatch.setenv("SCHEDULER_DATABASE_LISTEN_URL", direct)
    pgbouncer_url()
    return _bouncer[0].url(database)


@pytest.fixture
def direct_pg_url(tmp_path: Path, sqlite_template: Path) -> str:
    """A migrated, empty PostgreSQL database reached directly, never through a pooler (what
    must be: ``pg_terminate_backend`` of one's own backend, ``pg_prepared_statements``)."""
    return make_url("postgresql", tmp_path, sqlite_template)


@pytest.fixture(scope="session")
def citus() -> citus_cluster._citus.Cluster:
    """The pytest process's Citus cluster (:func:`helpers.citus_cluster.cluster`: started on
    first use, stopped at the end; skipped without Citus, failed under CI)."""
    return citus_cluster.cluster()


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    """A Scheduler with its own handler registry on each engine."""
    scheduler = Scheduler(db_url, registry=Registry())
    yield scheduler
    scheduler.close()
