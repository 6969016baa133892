"""Announcing: the hub of each engine, :func:`announce` in the transaction that makes jobs
ready, and the publishing after its commit."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, event

from ._broker import Publisher, redis_module
from ._common import Ready, Wake, database_key, registry_lock, say_once, wake_of
from ._postgres import NOTIFY
from ._process import local_waiters, wake_local
from ._sqlite import SQLITE_BEFORE, SqliteWatcher, sqlite_watchers

if TYPE_CHECKING:
    from ..engine import Store


class Hub:
    """How one engine's transactions announce (set up by the :class:`~scheduler.Scheduler`).

    Holds no reference to its engine (the registry is keyed weakly by it), and the clock only
    weakly when it is an object or a method (the database's clock holds the store)."""

    def __init__(
        self,
        key: str,
        clock: Callable[[], datetime],
        enabled: bool = True,
        broker_url: str | None = None,
        prefix: str = "scheduler",
    ) -> None:
        self.key = key
        self._clock = _weakly(clock)
        self.enabled = enabled
        self.broker_url = broker_url
        self.prefix = prefix
        self.publisher: Publisher | None = None

    def clock(self) -> datetime:
        found = self._clock()
        if found is None:
            from ..._model.time import utcnow

            return utcnow()
        return found()

    def close(self) -> None:
        """Stop publishing to the broker (the Scheduler is closed)."""
        publisher, self.publisher = self.publisher, None
        if publisher is not None:
            publisher.close()


def _weakly(fn: Callable[[], datetime]) -> Callable[[], Callable[[], datetime] | None]:
    if inspect.ismethod(fn):
        return weakref.WeakMethod(fn)
    if inspect.isfunction(fn) or inspect.isbuiltin(fn):
        return lambda: fn
    return weakref.ref(fn)


_hubs: weakref.WeakKeyDictionary[Engine, Hub] = weakref.WeakKeyDictionary()


def configure(
    store: Store,
    clock: Callable[[], datetime],
    *,
    enabled: bool = True,
    broker_url: str | None = None,
    prefix: str = "scheduler",
) -> Hub:
    """Set how ``store``'s engine announces (the Scheduler does, once, at construction)."""
    hub = Hub(database_key(store.engine), clock, enabled, broker_url, prefix)
    with registry_lock:
        old = _hubs.get(store.engine)
        if old is not None:
            old.close()
        _hubs[store.engine] = hub
        _forget_last()
    if enabled and broker_url is not None:  # published after the commits
        hook_commits(store.engine)
    if enabled and broker_url is not None:
        # Imported here, in the thread that builds the Scheduler: redis imports OpenTelemetry,
        # and two threads importing it at once (a publisher's, an enqueue's span) can meet
        # each other's half-imported modules.
        try:
            redis_module()
        except ImportError as exc:
            say_once("no_redis", f"wake-ups: {exc}; workers look for new jobs once a second")
    return hub


_last: tuple[Engine | None, Hub | None] = (None, None)  # the last engine looked up, its hub


def hub_of(store: Store, conn: Connection) -> Hub:
    """``store``'s hub (or, unknown, ``conn``'s engine's): the last one found is kept, for the
    enqueue's hot path (a weak dictionary's lookup makes a weak reference each time)."""
    global _last
    engine, hub = _last
    if engine is store.engine and hub is not None:
        return hub
    found = _hubs.get(store.engine) or hub_for(conn.engine)
    _last = (store.engine, found)
    return found


def _forget_last() -> None:
    global _last
    _last = (None, None)


def hub_for(engine: Engine) -> Hub:
    found = _hubs.get(engine)
    if found is None:
        from ..._model.time import utcnow

        with registry_lock:
            found = _hubs.setdefault(engine, Hub(database_key(engine), utcnow))
    return found


# -- announcing -----------------------------------------------------------------------------------
_PENDING = "scheduler_wakeup_pending"  # conn.info: announced in the open transaction
_COMMITTED = "scheduler_wakeup_committed"  # conn.info: committed, not yet published


def announce(store: Store, conn: Connection, ready: Iterable[Ready]) -> None:
    """Tell the workers that the jobs ``ready`` ((queue, run_at) pairs) can be claimed.

    Call it inside the transaction that makes them ready, on its connection (any SQLAlchemy
    ``Connection`` on the scheduler's database, the caller's own included): on PostgreSQL the
    notification goes out at that transaction's commit, never for a rollback; through the
    broker and to this process's workers it is published after the commit. On a connection
    outside any transaction (the jobs already committed) it is sent at once. Never raises for a
    broker that is down; on PostgreSQL a failing ``pg_notify`` fails the transaction, as any
    statement of it would.
    """
    hub = hub_of(store, conn)
    if not hub.enabled:
        return
    notify = hub.broker_url is None and conn.dialect.name == "postgresql"
    local = bool(local_waiters.get(hub.key))  # a worker of this process that nothing else tells
    if not (notify or local or hub.broker_url is not None):
        return  # no one to tell (SQLite's workers in other processes watch the file)
    wake = wake_of(ready, hub.clock().timestamp())
    if not wake:
        return
    if notify:
        params = {"payloads": wake.payloads()}
        if conn.in_transaction():
            conn.execute(NOTIFY, params)
        else:  # a statement of its own (in the driver's autocommit where it can)
            store.read_rows(conn, NOTIFY, params)
        if not local:
            return
    _after(hub, conn, wake)


def _after(hub: Hub, conn: Connection, wake: Wake) -> None:
    """Publish ``wake`` (broker, this process's workers) after ``conn``'s transaction commits,
    or now if it is in none."""
    if not conn.in_transaction():
        _publish(hub, wake)
        return
    hook_commits(conn.engine)
    pending: Wake | None = conn.info.get(_PENDING)
    if pending is None:
        conn.info[_PENDING] = pending = Wake()
        conn.info[_PENDING + "hub_for"] = hub
    pending.merge(wake)


def detach(conn: Connection) -> Callable[[], None] | None:
    """What the open transaction on ``conn`` announced (for the broker and this process's
    workers), taken off it: a function that publishes it, for a transaction that someone
    else commits (Django's ``on_commit``); None when there is nothing to publish."""
    pending: Wake | None = conn.info.pop(_PENDING, None)
    hub: Hub | None = conn.info.get(_PENDING + "hub_for")
    if pending is None or hub is None:
        return None
    return lambda: _publish(hub, pending)


_hooked: weakref.WeakSet[Engine] = weakref.WeakSet()


def hook_commits(engine: Engine) -> None:
    """Publish what a transaction announced after its commit: SQLAlchemy's ``commit`` event
    comes before the driver's commit, so the announcement moves to "committed" there and goes
    out when the connection next begins or is returned to the pool (a rollback drops it)."""
    if engine in _hooked:
        return
    with registry_lock:
        if engine in _hooked:
            return
        _hooked.add(engine)
    event.listen(engine, "commit", _on_commit)
    event.listen(engine, "rollback", _on_rollback)
    event.listen(engine, "begin", _on_begin)
    event.listen(engine.pool, "checkin", _on_checkin)


def _on_commit(conn: Connection) -> None:
    info = conn.info
    pending: Wake | None = info.pop(_PENDING, None)
    if pending is not None:
        committed: Wake | None = info.get(_COMMITTED)
        if committed is None:
            info[_COMMITTED] = pending
        else:
            committed.merge(pending)
    watcher = sqlite_watchers.get(database_key(conn.engine)) if sqlite_watchers else None
    if watcher is not None and not conn.get_execution_options().get("scheduler_readonly"):
        info[SQLITE_BEFORE] = (watcher, watcher.committing())


def _on_rollback(conn: Connection) -> None:
    conn.info.pop(_PENDING, None)
    before: tuple[SqliteWatcher, bytes] | None = conn.info.pop(SQLITE_BEFORE, None)
    if before is not None:  # the commit failed
        before[0].own(before[1], None)


def _on_begin(conn: Connection) -> None:
    _after_commit(conn.info)


def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
    if record is None:
        return
    info = record.info
    info.pop(_PENDING, None)  # never committed: the pool rolls it back
    _after_commit(info)


def _after_commit(info: dict[str, Any]) -> None:
    before: tuple[SqliteWatcher, bytes] | None = info.pop(SQLITE_BEFORE, None)
    if before is not None:
        watcher, header = before
        watcher.own(header, watcher.header())
    committed: Wake | None = info.pop(_COMMITTED, None)
    hub: Hub | None = info.get(_PENDING + "hub_for")
    if committed is not None and hub is not None:
        _publish(hub, committed)


def folds(store: Store, conn: Connection) -> bool:
    """Whether an announcement on ``conn`` is a ``pg_notify`` (PostgreSQL without a broker,
    wake-ups on) that an INSERT can carry as :data:`NOTIFY_COLUMN`, with the parameter
    ``p_wakeup`` from :func:`notify_payload`; then call :func:`announced` instead of
    :func:`announce`. (On Citus the INSERT is a CTE of the query that carries the column:
    ``jobs.enqueue_on``.)"""
    hub = hub_of(store, conn)
    return hub.enabled and hub.broker_url is None and conn.dialect.name == "postgresql"


def notify_payload(queue: str, run_at: datetime | None, now: datetime) -> str:
    """The ``p_wakeup`` parameter of :data:`NOTIFY_COLUMN` for a job of ``queue`` that runs at
    ``run_at`` (None: now), written at ``now`` (its ``created_at``)."""
    if run_at is None or run_at <= now:
        return f"0 {queue}"
    return f"{run_at.timestamp():.3f} {queue}"


def announced(store: Store, conn: Connection, ready: Iterable[Ready]) -> None:
    """After a statement on ``conn`` carried :data:`NOTIFY_COLUMN`: this process's workers are
    woken when its transaction commits (the server notifies the others then)."""
    hub = hub_of(store, conn)
    if local_waiters.get(hub.key):
        _after(hub, conn, wake_of(ready, hub.clock().timestamp()))


def _publish(hub: Hub, wake: Wake) -> None:
    wake_local(hub.key, wake)
    if hub.broker_url is not None:
        publisher = hub.publisher
        if publisher is None:
            with registry_lock:
                if hub.publisher is None:
                    hub.publisher = Publisher(hub.broker_url, hub.prefix)
                publisher = hub.publisher
        publisher.submit(wake)
