"""Writing on the caller's transaction: ``enqueue(..., connection=conn)`` and the other writes.

The caller hands over a SQLAlchemy ``Connection`` or ORM ``Session`` that is in a transaction on
the scheduler's database. The scheduler's statements run on it, in that transaction: nothing
here commits, rolls back or retries it, so what is written exists if and only if the caller
commits. Refused, with a :class:`SchedulerError` and before anything is written:

- an object that is neither (``connection=engine``, a DB-API connection);
- a closed or invalidated connection, or one not in a transaction (its statements would run in
  a transaction that nobody commits, or that closing rolls back without a word);
- a connection in autocommit (each statement would commit at once: the job would not wait for
  the caller's commit). SQLAlchemy's ``isolation_level="AUTOCOMMIT"``, or a driver connection
  in autocommit (psycopg's ``autocommit``, PyMySQL's ``get_autocommit()``; SQLite: no
  transaction open in the driver while the driver does not start one by itself);
- a connection to another database. "Another" is decided by the server, not the URL (a host
  alias, a pooler in front, or a Django alias name would make two URLs of one database differ):
  the dialect must be the same (MariaDB and MySQL are one), and then
  SQLite: the same main database file (``PRAGMA database_list``, compared as real paths);
  PostgreSQL: the same ``current_database()``, server port and ``pg_postmaster_start_time()``,
  and ``scheduler_jobs`` must resolve to the same table (its OID: a ``search_path`` that shows
  another schema's tables is another database for us);
  MariaDB/MySQL: the same ``@@hostname``, ``@@port`` and ``DATABASE()``.
  The caller's side is read once per driver connection (kept in its pool record's ``info``),
  ours once per engine (read again once before refusing: a restarted server has a new start
  time). A connection from the scheduler's own engine is not checked.

``Signals`` the operation sends after its commit (``enable``'s ``slot_skipped``) are sent when
the caller commits: on a ``Session`` after its commit (``after_commit``); on a ``Connection``
as its transaction commits (SQLAlchemy's ``commit`` event, which comes just before the
driver's commit: a commit that then fails has sent them); never after a rollback.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, event, text

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

from .._errors import SchedulerError
from .engine import Store

OnCommit = Callable[[Callable[[], None]], None]

_IDENTITY_KEY = "scheduler.database_identity"


@dataclass(frozen=True)
class CallerTransaction:
    """The caller's connection, in its transaction, and how to run code after it commits."""

    conn: Connection
    on_commit: OnCommit


def adopt(given: Any, store: Store, *, same_database: bool = False) -> CallerTransaction:
    """``given`` (a ``Connection`` or ``Session``) checked for writing the scheduler's rows on
    ``store``'s database, in the caller's transaction; else :class:`SchedulerError`.
    ``same_database``: known to be the scheduler's database (not compared)."""
    # The ORM is imported only by a caller that has a Session (it costs a command's start-up a
    # sixth of a second): where it was never imported, ``given`` is no Session.
    orm = sys.modules.get("sqlalchemy.orm")
    if orm is not None and isinstance(given, orm.Session):
        if not given.in_transaction():
            raise SchedulerError(
                "connection=: the Session is not in a transaction; begin one"
                " (`with session.begin():`) or write with it first"
            )
        conn = given.connection()
        checked = _checked(conn, store, "the Session's connection", same_database)
        return CallerTransaction(checked, _after_session_commit(given))
    if isinstance(given, Connection):
        checked = _checked(given, store, "the Connection", same_database)
        return CallerTransaction(checked, _after_connection_commit(given))
    raise SchedulerError(
        f"connection=: expected a SQLAlchemy Connection or Session in a transaction,"
        f" got {type(given).__name__}"
    )


def _checked(conn: Connection, store: Store, what: str, known: bool = False) -> Connection:
    if conn.closed or conn.invalidated:
        raise SchedulerError(f"connection=: {what} is closed")
    if not conn.in_transaction():
        raise SchedulerError(
            f"connection=: {what} is not in a transaction; call conn.begin() first (or use"
            " engine.begin()): the job must be written in a transaction that you commit"
        )
    if autocommit(conn):
        raise SchedulerError(
            f"connection=: {what} is in autocommit: each statement would commit at once, not"
            " with your transaction; use a connection without isolation_level='AUTOCOMMIT'"
        )
    if conn.engine is not store.engine and not known:
        same_database(conn, store, what)
    return conn


def autocommit(conn: Connection) -> bool:
    """Whether statements on ``conn`` commit one by one (see the module's docstring)."""
    if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        return True
    dbapi = conn.connection.dbapi_connection
    if dbapi is None:
        return False
    if conn.dialect.name == "sqlite":
        # Our engines (and an AUTOCOMMIT one) take the driver's own transaction control away
        # (isolation_level None): then a transaction is open only if one was begun. Python
        # 3.12's autocommit=True is the same. Otherwise the driver begins one before a write.
        driver_controls = getattr(dbapi, "isolation_level", None) is not None
        if getattr(dbapi, "autocommit", None) is True:
            driver_controls = False
        return not driver_controls and not bool(getattr(dbapi, "in_transaction", False))
    if conn.dialect.driver == "psycopg" and getattr(dbapi, "autocommit", False):
        # In autocommit, psycopg sends no BEGIN of its own; behind a transaction pooler our
        # engine sends one with the transaction's settings (_store/engine.py). The server's
        # answer tells: a transaction block is open, or every statement commits at once.
        from psycopg import pq

        return bool(dbapi.info.transaction_status == pq.TransactionStatus.IDLE)
    try:
        return bool(conn.dialect.detect_autocommit_setting(dbapi))
    except NotImplementedError:  # a dialect that cannot tell: trust SQLAlchemy's option
        return False


# -- the same database -------------------------------------------------------------------
_ours: weakref.WeakKeyDictionary[Engine, tuple[Any, ...]] = weakref.WeakKeyDictionary()
_ours_lock = threading.Lock()


def _family(name: str) -> str:
    return "mysql" if name in ("mysql", "mariadb") else name


def identity(conn: Connection) -> tuple[Any, ...]:
    """What tells ``conn``'s database apart from another (the module's docstring)."""
    family = _family(conn.dialect.name)
    if family == "sqlite":
        found = ""
        for row in conn.exec_driver_sql("PRAGMA database_list"):
            if row[1] == "main":
                found = row[2] or ""
        return ("sqlite", os.path.realpath(found) if found else f"memory:{id(conn.engine)}")
    if family == "postgresql":
        row = conn.execute(
            text(
                "SELECT current_database(), current_setting('port'), pg_postmaster_start_time(),"
                " to_regclass('scheduler_jobs')::oid::bigint"
            )
        ).one()
        return ("postgresql", *row)
    if family == "mysql":
        row = conn.execute(text("SELECT @@hostname, @@port, DATABASE()")).one()
        return ("mysql", *row)
    return (family, conn.engine.url.render_as_string(hide_password=True))


def describe(found: tuple[Any, ...]) -> str:
    kind = found[0]
    if kind == "sqlite":
        return f"SQLite file {found[1]}"
    if kind == "postgresql":
        table = "no scheduler_jobs table" if found[4] is None else f"scheduler_jobs oid {found[4]}"
        return f"PostgreSQL database {found[1]!r} on port {found[2]} ({table})"
    if kind == "mysql":
        return f"MariaDB/MySQL database {found[3]!r} on {found[1]}:{found[2]}"
    return f"{kind} {found[1]}"


def _our_identity(store: Store, fresh: bool = False) -> tuple[Any, ...]:
    with _ours_lock:
        known = None if fresh else _ours.get(store.engine)
    if known is None:
        # A read-only transaction: on SQLite a write one would wait for the caller's own lock.
        with store.read() as conn:
            known = identity(conn)
        with _ours_lock:
            _ours[store.engine] = known
    return known


def same_database(conn: Connection, store: Store, what: str) -> None:
    """Raise :class:`SchedulerError` unless ``conn`` is on ``store``'s database."""
    engine = store.engine
    if _family(conn.dialect.name) != _family(engine.dialect.name):
        raise SchedulerError(
            f"connection=: {what} is a {conn.dialect.name} connection; the scheduler's"
            f" database is {engine.dialect.name}: the job must be written in its database"
        )
    info = conn.connection.info
    theirs = info.get(_IDENTITY_KEY)
    if theirs is None:
        theirs = info[_IDENTITY_KEY] = identity(conn)
    if theirs == _our_identity(store) or theirs == _our_identity(store, fresh=True):
        return
    raise SchedulerError(
        f"connection=: {what} is on another database ({describe(theirs)}) than the"
        f" scheduler's ({describe(_our_identity(store))}): the job must be written in the"
        " scheduler's database, or it would not be the scheduler's job"
    )


# -- after the caller's commit ------------------------------------------------------------
# What runs after each Session's or Connection's commit, dropped at its rollback. One listener
# pair per object, registered at its first use and never removed (removing a listener while
# SQLAlchemy dispatches the event is not allowed); the entries go with the objects.
_pending: weakref.WeakKeyDictionary[Any, list[Callable[[], None]]] = weakref.WeakKeyDictionary()


def _run_pending(target: Any) -> None:
    for fn in _pending.pop(target, ()):
        fn()


def _session_committed(session: Session) -> None:
    _run_pending(session)


def _session_rolled_back(session: Session, transaction: Any) -> None:
    if not transaction.nested:  # a savepoint's rollback leaves the transaction going on
        _pending.pop(session, None)


def _connection_committed(conn: Connection) -> None:
    _run_pending(conn)


def _connection_rolled_back(conn: Connection) -> None:
    _pending.pop(conn, None)


def _after_session_commit(session: Session) -> OnCommit:
    def on_commit(fn: Callable[[], None]) -> None:
        if not event.contains(session, "after_commit", _session_committed):
            event.listen(session, "after_commit", _session_committed)
            event.listen(session, "after_soft_rollback", _session_rolled_back)
        _pending.setdefault(session, []).append(fn)

    return on_commit


def _after_connection_commit(conn: Connection) -> OnCommit:
    def on_commit(fn: Callable[[], None]) -> None:
        if not event.contains(conn, "commit", _connection_committed):
            event.listen(conn, "commit", _connection_committed)
            event.listen(conn, "rollback", _connection_rolled_back)
        _pending.setdefault(conn, []).append(fn)

    return on_commit
