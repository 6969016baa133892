"""The engine: one SQLAlchemy Core adapter for SQLite, PostgreSQL and MariaDB/MySQL.

SQLite gets WAL, a busy timeout and ``BEGIN IMMEDIATE`` for every transaction (a read that
later writes must hold the write lock from the start, or it fails at once with "database is
locked"). Capability flags are detected once per engine; correctness never depends on them.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.exc import DisconnectionError

from .._errors import ConfigError
from .driver import driver_error, read_only_server
from .settings import DatabaseSettings, settings_from_environment

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000

LOCK_TIMEOUT_SECONDS = 5
"""The longest any statement of ours waits for a lock on PostgreSQL and MariaDB/MySQL (a row
another transaction holds, a table a migration alters). Rows and jobs locked by someone else
are passed over without waiting (``FOR UPDATE SKIP LOCKED``); this bounds what waits anyway.
PostgreSQL: the session's ``lock_timeout``; MariaDB/MySQL: ``innodb_lock_wait_timeout`` (row
locks) and ``lock_wait_timeout`` (metadata locks, DDL). A statement that hits it fails with a
lock error (SQLSTATE 55P03; error 1205), which the tick reports as ``locked``."""

CLIENT_MULTI_STATEMENTS = 1 << 16
"""The MySQL protocol's client capability flag for several statements in one query (PyMySQL's
``constants.CLIENT.MULTI_STATEMENTS``)."""

APPLICATION_NAME = "scheduler"
"""PostgreSQL's ``application_name`` of our connections unless the URL sets one (so an
operator, or ``reliability/connection_cuts.py``, can tell them in ``pg_stat_activity``)."""


@dataclass(frozen=True)
class Capabilities:
    """What the engine offers beyond the portable path."""

    dialect: str
    update_returning: bool
    """UPDATE ... RETURNING (not MariaDB: it has INSERT/DELETE ... RETURNING only)."""
    skip_locked: bool
    """SELECT ... FOR UPDATE SKIP LOCKED."""
    claim_returning: bool = False
    """A job claim is one UPDATE ... RETURNING (else SELECT, UPDATE, SELECT what was won)."""
    single_writer: bool = False
    """One write transaction at a time (SQLite): more connections would only wait."""
    pipeline: bool = False
    """PostgreSQL through psycopg: statements can be sent on several connections at once from
    one thread (``scheduler/_store/pipeline.py``), each its own transaction."""
    autocommit_reads: bool = False
    """A read-only statement can run in the driver's autocommit (psycopg), skipping the BEGIN
    and COMMIT round trips."""
    nowait: bool = False
    """A write can be told not to wait for a row lock (MariaDB's ``SET STATEMENT
    innodb_lock_wait_timeout = 0 FOR ...``: error 1205 at once), so that it needs no
    ``SKIP LOCKED`` probe before it (``locks.NOWAIT``)."""
    multi_statements: bool = False
    """One query may carry several statements (PyMySQL connected with ``MULTI_STATEMENTS``,
    as :func:`make_engine` does): a row's statements in one round trip."""
    citus: bool = False
    """PostgreSQL with the Citus extension in the database (known once the engine has
    connected: before, False). Citus refuses a function that is not ``IMMUTABLE`` in the
    ``RETURNING`` of a write to a distributed table, and a ``VOLATILE`` one (``nextval``) in
    an ``UPDATE`` of one: the enqueue's ``pg_notify`` and the tick's one-statement dispatch
    take other forms there (``jobs.enqueue_on``, ``writers.writer_for``); and a claim under
    limits takes the limits' locks for its whole transaction (``limits_pipeline.covers``)."""


def skip_locked(dialect: Any) -> bool:
    """``FOR UPDATE SKIP LOCKED``: PostgreSQL; MySQL 8.0.1 and MariaDB 10.6 on (known once the
    engine has connected: before, False)."""
    if dialect.name == "postgresql":
        return True
    version = getattr(dialect, "server_version_info", None)
    if dialect.name not in ("mysql", "mariadb") or not version:
        return False
    return tuple(version) >= ((10, 6) if dialect.is_mariadb else (8, 0, 1))


def nowait(dialect: Any) -> bool:
    """MariaDB 10.3 on: ``SET STATEMENT innodb_lock_wait_timeout = 0 FOR`` a statement makes it
    fail at once (error 1205) where it would wait for a row lock (known once the engine has
    connected: before, False). MySQL has no ``SET STATEMENT``."""
    version = getattr(dialect, "server_version_info", None)
    if not getattr(dialect, "is_mariadb", False) or not version:
        return False
    return tuple(version) >= (10, 3)


def multi_statements(dbapi_connection: Any) -> bool:
    """Whether `dbapi_connection` (PyMySQL's) accepts several statements in one query."""
    return bool(getattr(dbapi_connection, "client_flag", 0) & CLIENT_MULTI_STATEMENTS)


CITUS_INSTALLED = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"


def citus(dbapi_connection: Any) -> bool:
    """Whether the database of `dbapi_connection` (PostgreSQL's) has the Citus extension. The
    connection is left as it was found, outside any transaction."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(CITUS_INSTALLED)
        row = cursor.fetchone()
    finally:
        cursor.close()
    if not getattr(dbapi_connection, "autocommit", False):
        dbapi_connection.rollback()
    return bool(row and row[0])


def _several_statements(engine: Engine) -> None:
    """PyMySQL connections that accept several statements in one query (``MULTI_STATEMENTS``):
    the tick's fresh dispatch sends its job, its row's swap and its log entry in one round
    trip. Every statement of ours binds its values as parameters (PyMySQL escapes them), so no
    value can end a statement and start another."""

    @event.listens_for(engine, "do_connect")
    def _on_do_connect(_dialect: Any, _record: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        kwargs["client_flag"] = kwargs.get("client_flag", 0) | CLIENT_MULTI_STATEMENTS


def _sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module (legacy mode on 3.11).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Straight to the driver: BEGIN through exec_driver_sql costs more than the BEGIN.
        readonly = conn.get_execution_options().get("scheduler_readonly")
        statement = "BEGIN" if readonly else "BEGIN IMMEDIATE"
        driver: Any = conn.connection.driver_connection
        try:
            driver.execute(statement)
        except sqlite3.Error as exc:  # "database is locked" past the busy timeout
            raise driver_error(conn, statement, (), exc) from exc


# A pooled connection idle for longer than this is pinged before it is handed out. One used
# more recently is handed out as it is: pinging every checkout (pool_pre_ping) cost a round
# trip, 0.12 ms here, on every checkout of a busy worker. If the server went away since, the
# first statement fails with a disconnect error; SQLAlchemy then invalidates the whole pool,
# so each process sees that error once, and the worker retries after its back-off.
IDLE_PING_SECONDS = 1.0


def _ping_when_idle(engine: Engine) -> None:
    dialect = engine.dialect

    @event.listens_for(engine.pool, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info["scheduler_checked_in"] = time.monotonic()

    @event.listens_for(engine.pool, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        checked_in = record.info.get("scheduler_checked_in")
        if checked_in is not None and time.monotonic() - checked_in <= IDLE_PING_SECONDS:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:  # the pool discards it and connects anew
            raise DisconnectionError(f"connection lost while idle: {exc}") from exc


def _duration(seconds: float) -> str:
    """`seconds` as a PostgreSQL duration in whole milliseconds (at least 1)."""
    return f"{max(1, round(seconds * 1000))}ms"


def local_settings(database: DatabaseSettings, schema: str | None = None) -> str:
    """One PostgreSQL statement that sets, for the current transaction only
    (``set_config(..., true)``, which is ``SET LOCAL``), what every transaction of ours needs:
    a lock wait of at most ``LOCK_TIMEOUT_SECONDS`` (a shorter ``lock_timeout`` already in
    force stays), the ``statement_timeout`` of ``[database]`` (if not 0), and a shard's
    `schema` as the ``search_path``."""
    bound = f"{LOCK_TIMEOUT_SECONDS}s"
    current = "current_setting('lock_timeout')"
    settings = [
        f"set_config('lock_timeout', CASE WHEN {current} = '0'"
        f" OR {current}::interval > interval '{bound}' THEN '{bound}' ELSE {current} END, true)"
    ]
    if database.statement_timeout > 0:
        timeout = _duration(database.statement_timeout)
        settings.append(f"set_config('statement_timeout', '{timeout}', true)")
    if schema is not None:
        settings.append(f"set_config('search_path', '{schema}', true)")
    return "SELECT " + ", ".join(settings)


def _session_settings(backend: str, database: DatabaseSettings, driver: str) -> str:
    """The statement a new server connection runs once (``pooler = "none"``): the lock wait
    bound (a shorter timeout set for the session already, by the URL or an ``init_command``,
    stays) and the statement timeout, for the session."""
    if backend == "postgresql":  # lock_timeout 0 is "wait for ever"
        statement = (
            f"SELECT set_config('lock_timeout', '{LOCK_TIMEOUT_SECONDS}s', false)"
            " WHERE current_setting('lock_timeout') = '0'"
            f" OR current_setting('lock_timeout')::interval > interval '{LOCK_TIMEOUT_SECONDS}s'"
        )
        if database.statement_timeout > 0:
            timeout = _duration(database.statement_timeout)
            statement += f"; SET statement_timeout = '{timeout}'"
        return statement
    statement = (
        "SET SESSION innodb_lock_wait_timeout ="
        f" LEAST(@@session.innodb_lock_wait_timeout, {LOCK_TIMEOUT_SECONDS}),"
        f" lock_wait_timeout = LEAST(@@session.lock_wait_timeout, {LOCK_TIMEOUT_SECONDS})"
    )
    if database.statement_timeout > 0:
        seconds = database.statement_timeout
        statement += (
            f", max_statement_time = {seconds:g}"  # MariaDB: seconds, any statement
            if backend == "mariadb" or driver == "mariadb"
            else f", max_execution_time = {max(1, round(seconds * 1000))}"  # MySQL: ms, SELECT
        )
    return statement


def _bounded_waits(engine: Engine, backend: str, database: DatabaseSettings) -> None:
    """Every new server connection gets the session settings of :func:`_session_settings`
    (``pooler = "none"``: the session is ours for the connection's life)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        statement = _session_settings(backend, database, _mysql_flavour(engine, dbapi_connection))
        cursor = dbapi_connection.cursor()
        for part in statement.split("; "):
            cursor.execute(part)
        cursor.close()
        dbapi_connection.commit()  # a session setting outlives its transaction


def _mysql_flavour(engine: Engine, dbapi_connection: Any) -> str:
    """``"mariadb"`` or ``"mysql"`` for a MySQL-protocol connection (the dialect knows once the
    first connection is initialised; until then, the server's version string says)."""
    dialect: Any = engine.dialect
    if dialect.name != "mysql" and dialect.name != "mariadb":
        return str(dialect.name)
    if getattr(dialect, "_is_mariadb", None) is not None or dialect.server_version_info:
        return "mariadb" if dialect.is_mariadb else "mysql"
    version = getattr(dbapi_connection, "get_server_info", lambda: "")()
    return "mariadb" if "mariadb" in str(version).lower() else "mysql"


LOCAL_SETTINGS_KEY = "scheduler_local_settings"
"""In a pooled connection's ``info`` behind a transaction pooler: :func:`local_settings`, which
a statement run in its own implicit transaction sends before it
(``scheduler/_store/pipeline.py``)."""


def _settings_per_transaction(
    engine: Engine, database: DatabaseSettings, schema: str | None = None
) -> None:
    """Behind a transaction pooler (``pooler = "transaction"``) a session setting lands on
    whichever server connection served that one statement: every transaction carries its own
    settings instead. With psycopg they travel with the BEGIN, in its one round trip (the
    driver is put in autocommit, so that it sends no BEGIN of its own; its ``commit()`` and
    ``rollback()`` still end the transaction the server has open); with another driver they
    are the transaction's first statement."""
    settings = local_settings(database, schema)
    psycopg = engine.dialect.driver == "psycopg"
    begin = f"BEGIN; {settings}"

    @event.listens_for(engine, "connect")
    def _on_connect(_dbapi_connection: Any, record: Any) -> None:
        record.info[LOCAL_SETTINGS_KEY] = settings.encode()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            return  # the caller asked for statements that are their own transactions
        driver: Any = conn.connection.driver_connection
        cursor = driver.cursor()
        try:
            if psycopg:
                if not driver.autocommit:
                    driver.autocommit = True  # a local flag, no round trip
                cursor.execute(begin)
            else:
                cursor.execute(settings)
        except engine.dialect.loaded_dbapi.Error as exc:
            error = driver_error(conn, begin, (), exc, cursor)
            if not conn.invalidated:  # a BEGIN that went through is not left open
                conn.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
            raise error from exc
        finally:
            cursor.close()


def make_engine(
    url: str, database: DatabaseSettings | None = None, schema: str | None = None, **kwargs: Any
) -> Engine:
    """Create an engine with our per-dialect settings and the ``[database]`` ones
    (``database``: the pool's size and overflow, the connect timeout, the statement timeout,
    the pooler; what the URL's own query sets, such as ``connect_timeout``, stays). Without
    `database`, the defaults and ``SCHEDULER_DATABASE_<KEY>`` from the environment.

    `schema` (PostgreSQL, a shard's): the connections find the tables there, by the start-up
    options' ``search_path`` (``shards.shard_url``), or behind a transaction pooler (which
    passes no start-up options) by each transaction's settings."""
    database = database or settings_from_environment()
    pooled = database.pooler == "transaction"
    if schema is not None and not pooled:
        from .shards import shard_url

        url = shard_url(url, schema)
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if pooled and backend != "postgresql":
        raise ConfigError(
            f"[database] pooler = 'transaction' is for PostgreSQL behind a transaction-mode"
            f" pooler (PgBouncer, RDS Proxy); this URL is {backend}"
        )
    options: dict[str, Any] = {}
    connect_args: dict[str, Any] = {}
    if backend != "sqlite":
        options.update(pool_size=database.pool_size, max_overflow=database.max_overflow)
        if "connect_timeout" not in parsed.query:
            # libpq takes whole seconds (and treats 1 as 2); PyMySQL takes a float
            seconds = database.connect_timeout
            connect_args["connect_timeout"] = (
                max(math.ceil(seconds), 2) if backend == "postgresql" else seconds
            )
    if backend in ("mysql", "mariadb"):
        options.update(pool_recycle=3600)
    if backend == "postgresql" and "application_name" not in parsed.query:
        connect_args["application_name"] = APPLICATION_NAME
    if pooled and parsed.get_driver_name() == "psycopg":
        # A server-side prepared statement lives in one server connection's session, and the
        # pooler hands the next transaction another: none is made, ever.
        connect_args["prepare_threshold"] = None
    if connect_args:
        options.update(connect_args=connect_args)
    options.update(kwargs)
    engine = create_engine(parsed, **options)
    if backend == "sqlite":
        _sqlite_hooks(engine)
    else:
        if pooled:
            _settings_per_transaction(engine, database, schema)
        else:
            _bounded_waits(engine, backend, database)
        if backend in ("mysql", "mariadb") and engine.dialect.driver == "pymysql":
            _several_statements(engine)
        if not options.get("pool_pre_ping"):
            _ping_when_idle(engine)
    return engine


def _read_only_is_lost(context: ExceptionContext) -> None:
    """``handle_error``: a server that answers read-only or in recovery is a lost connection
    (SQLAlchemy then invalidates it and the pool, as for a cut one, and the worker's back-off
    retries on a new connection; see ``driver.read_only_server``)."""
    if not context.is_disconnect and read_only_server(context.original_exception):
        context.is_disconnect = True


def lose_read_only_servers(engine: Engine) -> None:
    """Treat a read-only or recovering server as a lost connection on `engine` (once)."""
    if not event.contains(engine, "handle_error", _read_only_is_lost):
        event.listen(engine, "handle_error", _read_only_is_lost)


class Store:
    """An engine plus the capability flags of its dialect, and the ``[database]`` settings."""

    def __init__(
        self, url_or_engine: str | Engine, database: DatabaseSettings | None = None
    ) -> None:
        self.database = database or settings_from_environment()
        self.engine = (
            make_engine(url_or_engine, self.database)
            if isinstance(url_or_engine, str)
            else url_or_engine
        )
        dialect = self.engine.dialect
        name = dialect.name
        if name != "sqlite":
            lose_read_only_servers(self.engine)
        update_returning = bool(getattr(dialect, "update_returning", False))
        psycopg = name == "postgresql" and dialect.driver == "psycopg"
        self.caps = Capabilities(
            dialect=name,
            # MariaDB has INSERT/DELETE ... RETURNING but no UPDATE ... RETURNING.
            update_returning=update_returning,
            skip_locked=skip_locked(dialect),
            claim_returning=update_returning and name != "mysql",
            single_writer=name == "sqlite",
            pipeline=psycopg,
            # Behind a transaction pooler a statement in the driver's autocommit would run
            # without the transaction's settings: reads are transactions there.
            autocommit_reads=psycopg and self.database.pooler != "transaction",
            nowait=nowait(dialect),
        )
        if name in ("mysql", "mariadb") and dialect.server_version_info is None:
            # The server's version is known from the first connection on: detect it then.
            event.listen(self.engine, "connect", self._detect_version, once=True)
        elif name in ("mysql", "mariadb"):  # an engine of the caller's that has connected:
            # its connections are pooled already; detect from the next one handed out
            event.listen(self.engine, "checkout", self._detect_on_checkout, once=True)
        elif name == "postgresql":  # Citus: once per engine, on its first connection
            first = dialect.server_version_info is None  # else the caller's, connected
            event.listen(
                self.engine, "connect" if first else "checkout", self._detect_citus, once=True
            )
        self._helpers: ThreadPoolExecutor | None = None
        self._helper_threads = 0
        self._helper_pid = 0
        self._helpers_lock = threading.Lock()

    def _detect_version(self, dbapi_connection: Any, _record: Any) -> None:
        # Runs after the dialect's own first-connect initialisation, which reads the version.
        dialect = self.engine.dialect
        self.caps = replace(
            self.caps,
            skip_locked=skip_locked(dialect),
            nowait=nowait(dialect),
            multi_statements=dialect.driver == "pymysql" and multi_statements(dbapi_connection),
        )

    def _detect_on_checkout(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        self._detect_version(dbapi_connection, record)

    def _detect_citus(self, dbapi_connection: Any, *_args: Any) -> None:
        self.caps = replace(self.caps, citus=citus(dbapi_connection))

    def helpers(self, threads: int) -> ThreadPoolExecutor:
        """Threads for work spread over several connections (the tick's lanes), kept between
        calls: starting threads for every batch would cost more than small batches save."""
        with self._helpers_lock:
            pool = self._helpers
            if pool is not None and self._helper_pid != os.getpid():
                pool = None  # a forked child: the parent's threads do not exist here
            if pool is None or self._helper_threads < threads:
                if pool is not None:
                    pool.shutdown(wait=False)
                pool = ThreadPoolExecutor(threads, thread_name_prefix="scheduler-tick")
                self._helpers, self._helper_threads = pool, threads
                self._helper_pid = os.getpid()
            return pool

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite)."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction (a plain deferred ``BEGIN`` on SQLite)."""
        with self.engine.connect() as conn, self.reading(conn):
            yield conn

    @contextmanager
    def reading(self, conn: Connection) -> Iterator[Connection]:
        """A read-only transaction on a connection the caller holds (and goes on using for
        writes afterwards)."""
        conn.execution_options(scheduler_readonly=True)
        try:
            with conn.begin():
                yield conn
        finally:
            conn.execution_options(scheduler_readonly=False)

    @contextmanager
    def at_once(self) -> Iterator[Connection]:
        """A connection for one writing statement, atomic by itself: in the driver's
        autocommit on PostgreSQL (psycopg, not behind a transaction pooler, where the
        transaction carries the settings), so that it is one round trip with no ``BEGIN`` and
        ``COMMIT``; elsewhere a transaction (:meth:`begin`)."""
        if not self.caps.autocommit_reads:
            with self.begin() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            driver: Any = conn.connection.driver_connection
            driver.autocommit = True  # psycopg: a local flag, no round trip
            try:
                yield conn
                conn.commit()  # ends SQLAlchemy's transaction; the driver has nothing to commit
            finally:
                if not conn.invalidated:
                    driver.autocommit = False

    def read_rows(self, conn: Connection, statement: Any, params: dict[str, Any]) -> list[Any]:
        """The rows of one read-only statement on a connection the caller holds, outside any
        transaction. On PostgreSQL (psycopg) the statement runs in the driver's autocommit: a
        statement is its own snapshot there, and the BEGIN and COMMIT round trips would cost
        more than the statement. Elsewhere it runs in :meth:`reading`."""
        if not self.caps.autocommit_reads:
            with self.reading(conn):
                return list(conn.execute(statement, params))
        driver: Any = conn.connection.driver_connection
        driver.autocommit = True  # psycopg: a local flag, no round trip
        try:
            found = list(conn.execute(statement, params))
            conn.commit()  # ends SQLAlchemy's transaction; the driver has nothing to commit
            return found
        finally:
            if not conn.invalidated:
                driver.autocommit = False

    def dispose(self) -> None:
        with self._helpers_lock:
            if self._helpers is not None:
                self._helpers.shutdown(wait=True)
                self._helpers = None
        self.engine.dispose()
