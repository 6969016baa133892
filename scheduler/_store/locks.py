"""Never wait on someone else's lock: take a row's (and a job's) lock only if it is free, and
tell a lock timeout from other errors.

On PostgreSQL and MariaDB >= 10.6 (MySQL >= 8.0.1) a ``SELECT ... FOR UPDATE SKIP LOCKED`` by
primary key returns nothing for a row another transaction holds locked, at once: the caller
passes over it (the tick reports it ``locked``) and the next tick or claim looks again. On
SQLite there are no row locks: one transaction writes at a time, and the others wait for it
up to the busy timeout (``engine.SQLITE_BUSY_TIMEOUT_MS``), then fail with "database is
locked" (the worker retries after its back-off). On an engine without ``SKIP LOCKED`` the
statement waits, bounded by the session's lock timeout (``engine.LOCK_TIMEOUT_SECONDS``), and
:func:`timed_out` recognises the error it then raises.

On MariaDB the tick's fresh dispatch needs no probe: its swap is written with :data:`NOWAIT`
and fails at once, with the error :func:`timed_out` recognises, on a row another transaction
holds.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.exc import DBAPIError

from .engine import skip_locked
from .tables import jobs, rows

_ROW = select(rows.c.id).where(rows.c.id == bindparam("p_id")).with_for_update(skip_locked=True)
_JOB = select(jobs.c.id).where(jobs.c.id == bindparam("p_id")).with_for_update(skip_locked=True)

NOWAIT = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR "
"""MariaDB (``engine.nowait``): written before a write, it makes the write fail at once with
error 1205 (:func:`timed_out`) where it would wait for a row lock. A write that is the first to
touch its row can so take the lock itself, with no :func:`take` before it (the tick's fresh
dispatch: its swap)."""

PG_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout (or NOWAIT)
PG_DEADLOCK = "40P01"
PG_QUERY_CANCELED = "57014"  # statement_timeout
MYSQL_LOCK_WAIT_TIMEOUT = 1205


def take(conn: Connection, row_id: int, job_id: int | None = None) -> bool:
    """Lock the row `row_id` (and the job `job_id`, if given) in `conn`'s transaction unless
    another transaction holds it; False (nothing locked that matters: the caller rolls back)
    if one does. Where the engine has no ``SKIP LOCKED``, True without a statement: the write
    that follows waits, bounded by the lock timeout."""
    if not skip_locked(conn.dialect):
        return True
    if conn.execute(_ROW, {"p_id": row_id}).first() is None:
        return False
    return job_id is None or conn.execute(_JOB, {"p_id": job_id}).first() is not None


def _sqlstate(exc: DBAPIError) -> str | None:
    orig: Any = exc.orig
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return state if isinstance(state, str) else None


def _mysql_code(exc: DBAPIError) -> int | None:
    orig: Any = exc.orig
    code = getattr(orig, "errno", None)
    if code is None:
        args = getattr(orig, "args", ())
        code = args[0] if args else None
    return code if isinstance(code, int) else None


def timed_out(exc: BaseException) -> bool:
    """A statement gave up waiting for a lock (PostgreSQL ``lock_timeout``, InnoDB's lock wait
    timeout): someone else holds it; nothing of ours is wrong."""
    if not isinstance(exc, DBAPIError):
        return False
    return _sqlstate(exc) == PG_LOCK_NOT_AVAILABLE or _mysql_code(exc) == MYSQL_LOCK_WAIT_TIMEOUT


def deadlock(exc: BaseException) -> bool:
    """PostgreSQL detected a deadlock and rolled this transaction back."""
    return isinstance(exc, DBAPIError) and _sqlstate(exc) == PG_DEADLOCK
