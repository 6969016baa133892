"""Deadlocks and lock wait timeouts: recognise them, and run the transaction again.

On InnoDB (MariaDB, MySQL) a deadlock (error 1213) or a lock wait timeout (1205) is an
ordinary outcome of concurrent transactions: the server rolled one back (after a deadlock the
whole transaction, after a timeout the statement; ``Store.begin`` then rolls back the rest) and
asks for a retry. Every transaction of the queue, the tick and the rows changes the database
only, under conditions it re-checks (a lease, a state, a version), so running it again from its
start is safe; :func:`retry` does so a few times, after a short random pause (full jitter, so
that the transactions that collided do not collide again in step).

An operation that may simply lose instead (a claim that claimed nothing this time, a takeover
someone else won, a tick row whose compare-and-swap is ``lost_race``) passes ``lost``: once the
attempts are used up, its value is the result and nothing reaches the caller. Any other
operation re-raises the last error after one warning line naming it.

The error is recognised by the driver's error code: ``args[0]`` for PyMySQL and mysqlclient
(MySQLdb), ``errno`` for MariaDB Connector/Python. Nothing else is retried here: a lost
connection (``is_transient``) is the worker's back-off, a busy SQLite the busy timeout.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

log = logging.getLogger(__name__)

DEADLOCK = 1213  # ER_LOCK_DEADLOCK
LOCK_WAIT_TIMEOUT = 1205  # ER_LOCK_WAIT_TIMEOUT
LOCK_CONFLICTS = {DEADLOCK: "deadlock", LOCK_WAIT_TIMEOUT: "lock wait timeout"}

ATTEMPTS = 5  # in all, the first included
# A lock wait timeout has already waited innodb_lock_wait_timeout (50 s by default): one more try.
TIMEOUT_ATTEMPTS = 2
BASE_DELAY = 0.01  # seconds; the n-th pause is uniform in [0, min(MAX_DELAY, BASE_DELAY * 2**n)]
MAX_DELAY = 0.5

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """A database error that a retry may cure: a lost connection, a server restarting or busy,
    a server that answered read-only (a switchover: the connection was invalidated, and the
    next one goes to the new primary)."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def lock_conflict(exc: BaseException) -> int | None:
    """The InnoDB error code (1213 or 1205) if ``exc`` is a deadlock or lock wait timeout."""
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig
    code = getattr(orig, "errno", None)  # MariaDB Connector/Python
    if code is None:
        args = getattr(orig, "args", ())
        code = args[0] if args else None  # PyMySQL, mysqlclient: (code, message)
    return code if isinstance(code, int) and code in LOCK_CONFLICTS else None


def pause(attempt: int) -> float:
    """The jittered pause before attempt ``attempt + 1`` (``attempt`` >= 1)."""
    return random.uniform(0.0, min(MAX_DELAY, BASE_DELAY * 2**attempt))


def retry(what: str, run: Callable[[], T], *, lost: Callable[[], T] | None = None) -> T:
    """Run ``run`` (one whole transaction, its own); again on a deadlock or lock wait timeout.

    ``what`` names the operation in the log. Once the attempts are used up: ``lost()`` if
    given (the operation lost a race and changed nothing), else the last error is re-raised.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return run()
        except DBAPIError as exc:
            code = lock_conflict(exc)
            if code is None:
                raise
            limit = ATTEMPTS if code == DEADLOCK else TIMEOUT_ATTEMPTS
            if attempt >= limit:
                if lost is not None:
                    log.info(
                        "%s: %s (%s) %d time(s); treated as a lost race",
                        what,
                        LOCK_CONFLICTS[code],
                        code,
                        attempt,
                        extra={"action": "lock_conflict_lost", "code": code},
                    )
                    return lost()
                log.warning(
                    "%s failed: the database reported a %s (%s) on each of %d attempt(s)",
                    what,
                    LOCK_CONFLICTS[code],
                    code,
                    attempt,
                    extra={"action": "lock_conflict_gave_up", "code": code},
                )
                raise
            delay = pause(attempt)
            log.debug(
                "%s: %s (%s); retrying in %.3fs",
                what,
                LOCK_CONFLICTS[code],
                code,
                delay,
                extra={"action": "lock_conflict_retry", "code": code},
            )
            time.sleep(delay)
