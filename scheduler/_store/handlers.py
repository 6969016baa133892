"""What every process may know of a handler: the settings the workers registered it with.

A worker writes its handlers to ``scheduler_handlers`` when it starts, all of them in one
statement (an upsert: ``INSERT … ON CONFLICT DO UPDATE`` on SQLite and PostgreSQL, ``INSERT …
ON DUPLICATE KEY UPDATE`` on MariaDB/MySQL), so that ``enqueue`` in a process that did not
register a handler (a web process that never imported the handlers' module) gives its job the
handler's queue and ``max_attempts``. The worker's own row in ``scheduler_workers`` lists the
names it runs, for ``status``'s ready jobs that no live worker can run.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.exc import DBAPIError

from .._errors import UnknownHandlerWarning
from .engine import Store
from .retry import retry
from .tables import handlers, jobs

QUEUED = "queued"
#: Seconds a process keeps what it read of a handler (found or not) before reading it again.
KEEP_SECONDS = 60.0
#: Names kept at most; past this the cache starts afresh (a process enqueueing endless names).
KEEP_NAMES = 1024


class Recorded(NamedTuple):
    """A handler's settings as a worker registered them."""

    name: str
    queue: str
    max_attempts: int
    retry_safe: bool
    registered_at: datetime
    registered_by: str


def _insert(dialect_name: str) -> Any:
    # Imported here: a dialect the process does not use stays unloaded.
    module = "mysql" if dialect_name in ("mysql", "mariadb") else dialect_name
    return importlib.import_module(f"sqlalchemy.dialects.{module}").insert(handlers)


def record(
    store: Store,
    found: Iterable[tuple[str, str, int, bool]],
    *,
    now: datetime,
    worker_id: str,
) -> int:
    """Upsert ``found`` ((name, queue, max_attempts, retry_safe) each) in one statement; the
    number of handlers written. Rows are written in name order, so two workers starting at
    once take their locks in the same order (no deadlock on InnoDB)."""
    values = [
        {
            "name": name,
            "queue": queue,
            "max_attempts": max_attempts,
            "retry_safe": retry_safe,
            "registered_at": now,
            "registered_by": worker_id[:200],
        }
        for name, queue, max_attempts, retry_safe in sorted(found)
    ]
    if not values:
        return 0
    kept = ("queue", "max_attempts", "retry_safe", "registered_at", "registered_by")
    dialect = store.engine.dialect.name
    statement = _insert(dialect).values(values)
    if dialect in ("mysql", "mariadb"):
        statement = statement.on_duplicate_key_update(
            {key: statement.inserted[key] for key in kept}
        )
    else:
        statement = statement.on_conflict_do_update(
            index_elements=[handlers.c.name], set_={key: statement.excluded[key] for key in kept}
        )

    def attempt() -> int:
        with store.begin() as conn:
            conn.execute(statement)
        return len(values)

    return retry("record handlers", attempt)


def lookup(conn: Connection, name: str) -> Recorded | None:
    """The recorded settings of handler ``name``, or None if no worker ever registered it."""
    row = conn.execute(select(handlers).where(handlers.c.name == name)).first()
    return Recorded(*row) if row is not None else None


def recorded(conn: Connection) -> list[Recorded]:
    """Every recorded handler, by name."""
    return [Recorded(*row) for row in conn.execute(select(handlers).order_by(handlers.c.name))]


def names_text(names: Sequence[str]) -> str:
    """The ``scheduler_workers.handlers`` value for a worker that runs ``names``."""
    return json.dumps(sorted(names), separators=(",", ":"))


def names_of(text: str | None) -> frozenset[str] | None:
    """The names a worker's ``handlers`` value lists; None when it lists none (written by a
    release before this one, or unreadable): that worker may have any handler."""
    if text is None:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, list):
        return None
    return frozenset(str(name) for name in found)


def unserved(conn: Connection, now: datetime, served: frozenset[str]) -> dict[str, int]:
    """Ready jobs (``queued``, ``run_at`` reached) whose handler is not in ``served``: how
    many of each handler."""
    query = (
        select(jobs.c.handler, func.count())
        .where(jobs.c.state == QUEUED, jobs.c.run_at <= now)
        .group_by(jobs.c.handler)
        .order_by(jobs.c.handler)
    )
    if served:
        named: Any = bindparam("served", sorted(served), expanding=True)
        query = query.where(jobs.c.handler.not_in(named))
    return {handler: int(count) for handler, count in conn.execute(query)}


class Known:
    """One process's copy of the recorded handlers it enqueued for without registering them.

    Each name is read at most once per :data:`KEEP_SECONDS` (found or not found), so an
    ``enqueue`` costs no extra query once its handler was looked up; a worker that starts
    with new settings is seen within that time, and :meth:`forget` drops everything at once.
    A name that no worker has recorded gives one :class:`~scheduler.UnknownHandlerWarning`
    per process.
    """

    def __init__(self, store: Store, keep_seconds: float = KEEP_SECONDS) -> None:
        self._store = store
        self._keep = keep_seconds
        self._found: dict[str, tuple[float, Recorded | None]] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def get(self, name: str) -> Recorded | None:
        """``name``'s recorded settings (None: never recorded, or not readable)."""
        now = time.monotonic()
        hit = self._found.get(name)
        if hit is not None and now - hit[0] < self._keep:
            return hit[1]
        try:
            with self._store.read() as conn:
                found = lookup(conn, name)
        except DBAPIError:  # a schema before revision 0010, or the database is away: defaults
            return None
        with self._lock:
            if len(self._found) >= KEEP_NAMES:
                self._found.clear()
            self._found[name] = (now, found)
            warn = found is None and name not in self._warned
            if warn:
                self._warned.add(name)
        if warn:
            warnings.warn(
                f"handler {name[:200]!r} is not registered in this process and no worker has"
                " registered it: the job gets queue 'default' and max_attempts 3 unless given"
                " (a worker that registers it later will run it)",
                UnknownHandlerWarning,
                stacklevel=5,  # the caller of enqueue()
            )
        return found

    def peek(self, name: str) -> Recorded | None:
        """What is kept of ``name`` (however old), reading nothing: for the tick, which asks
        inside its transaction. Workers keep it filled (:meth:`load_all`)."""
        hit = self._found.get(name)
        return hit[1] if hit is not None else None

    def load_all(self) -> int:
        """Read every recorded handler (one query) and keep them; how many. A worker does it
        when it starts and at each housekeeping (about once a minute), so that its tick gives a
        task's job the recorded settings of a handler this process did not register."""
        now = time.monotonic()
        with self._store.read() as conn:
            found = recorded(conn)
        with self._lock:
            if len(self._found) + len(found) > KEEP_NAMES:
                self._found.clear()
            for one in found:
                self._found[one.name] = (now, one)
        return len(found)

    def forget(self) -> None:
        """Read every name again at its next enqueue."""
        with self._lock:
            self._found.clear()
