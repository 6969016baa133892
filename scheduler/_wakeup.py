"""Wake-ups: an idle worker learns of a ready job at once, not at its next poll.

One function announces: :func:`announce`, called inside the transaction that makes jobs ready
(an enqueue, a retry written by a worker, ``retry_job``, ``backfill``) or, on a connection
outside any transaction, after the commits it speaks for (the tick, once per batch). What it
does depends on how the processes of one database are told:

- **PostgreSQL** (no ``[broker]``): ``pg_notify`` on the caller's connection, so the server
  delivers it at commit and never for a rollback. A transaction announces each queue once
  (PostgreSQL folds equal notifications of one transaction into one): a thousand jobs enqueued
  in one transaction are one wake-up. The channel is ``scheduler:`` and the schema the tables
  live in, so two schemas of one database do not wake each other.
- **A broker** (``[broker] url = "redis://..."``): after the commit (a rollback drops it), one
  token per ready job, up to :data:`TOKEN_CAP`, is pushed on a Redis list per queue; an idle
  worker pops one (``BLPOP``) and claims. One token wakes one worker: as many workers wake as
  there are jobs. Redis carries wake-ups only: the jobs and every decision stay in the SQL
  database, and a Redis that is down costs the poll interval, never a job.
- **In this process**: after the commit, the workers running in this process on the same
  database are woken directly (up to one per job, those with a free slot first).

Listening is per worker (:func:`listen`): a connection of its own that ``LISTEN``\\ s
(PostgreSQL; the ``[database] listen_url`` if set, and none behind a transaction pooler
without one), or a thread that pops the broker's tokens, or, on SQLite, a thread that reads the
WAL index header of the database file (48 bytes of the ``-shm`` file, every
:data:`SQLITE_WATCH_SECONDS`): it changes with every commit of any process, and reading it is
no SQL statement. The worker's own commits are told apart and ignored, so an idle worker does
not wake itself. Each wake-up sets the worker's event; the worker claims as it does at a poll,
and the poll (``POLL_SECONDS``) stays as the safety net for anything missed. A job whose
``run_at`` is in the future (a retry's back-off) is announced with it: a worker that hears of
it keeps a timer for the earliest such instant instead of waiting for the poll.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import logging
import os
import select
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sqlalchemy import Connection, Engine, String, bindparam, event, func, literal_column, text

if TYPE_CHECKING:
    from ._app import Scheduler
    from ._store.engine import Store

log = logging.getLogger(__name__)

SQLITE_WATCH_SECONDS = 0.01  # how often a SQLite worker reads the WAL index header
COOLDOWN_SECONDS = 0.01  # announcements wake one worker at most once per this (then coalesce)
TOKEN_CAP = 256  # most wake-up tokens kept per queue on the broker
BROKER_WAIT_SECONDS = 1.0  # one BLPOP waits at most this long (then looks at its stop flag)
BROKER_TIMEOUT_SECONDS = 1.0  # connecting to the broker, and a publish, give up after this
STATUS_PING_SECONDS = 0.5  # `status` asks the broker for a PING, waiting at most this long
RECONNECT_MIN, RECONNECT_MAX = 0.5, 10.0  # back-off of a lost LISTEN or broker connection
LISTEN_APPLICATION_NAME = "scheduler-listen"  # pg_stat_activity's name of the LISTEN connection

# The channel: 'scheduler:' and the schema the unqualified tables are found in (63 bytes at
# most, PostgreSQL's identifier length), computed by the server on both sides.
CHANNEL_SQL = "left('scheduler:' || current_schema(), 63)"
_NOTIFY = text(
    f"SELECT pg_notify({CHANNEL_SQL}, payload) FROM unnest(CAST(:payloads AS text[])) AS payload"
)

#: ``pg_notify`` as a column of the enqueue's ``INSERT ... RETURNING`` (:func:`folds`): the
#: notification rides in the statement that writes the job, no round trip of its own.
NOTIFY_COLUMN = func.pg_notify(
    literal_column(CHANNEL_SQL), bindparam("p_wakeup", type_=String())
).label("wakeup")

Ready = tuple[str, datetime | None]
"""A job made ready: its queue and its ``run_at`` (None: now)."""


# -- what an announcement carries ---------------------------------------------------------------
@dataclass
class _Wake:
    """Per queue: how many jobs are ready now, and the earliest later ``run_at`` (epoch s)."""

    now: dict[str, int] = field(default_factory=dict)
    later: dict[str, float] = field(default_factory=dict)

    def add(self, queue: str, at: float | None, count: int = 1) -> None:
        if at is None:
            self.now[queue] = self.now.get(queue, 0) + count
        else:
            known = self.later.get(queue)
            self.later[queue] = at if known is None else min(known, at)

    def merge(self, other: _Wake) -> None:
        for queue, count in other.now.items():
            self.add(queue, None, count)
        for queue, at in other.later.items():
            self.add(queue, at)

    def payloads(self) -> list[str]:
        """PostgreSQL's payloads: ``"0 QUEUE"`` (ready now) or ``"EPOCH QUEUE"`` (later)."""
        found = [f"0 {queue}" for queue in self.now]
        found += [f"{at:.3f} {queue}" for queue, at in self.later.items()]
        return found

    def __bool__(self) -> bool:
        return bool(self.now or self.later)


def _wake_of(ready: Iterable[Ready], now: float) -> _Wake:
    wake = _Wake()
    for queue, run_at in ready:
        at = None if run_at is None else run_at.timestamp()
        wake.add(queue, None if at is None or at <= now else at)
    return wake


def parse_payload(payload: str) -> tuple[str, float | None] | None:
    """(queue, epoch or None for now) of a PostgreSQL payload, None if it is not one of ours."""
    at, _, queue = payload.partition(" ")
    try:
        when = float(at)
    except ValueError:
        return None
    return queue, (when or None)


# -- the hub: one per engine, what this process announces through -------------------------------
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
        self.publisher: _Publisher | None = None

    def clock(self) -> datetime:
        found = self._clock()
        if found is None:
            from ._time import utcnow

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
_hubs_lock = threading.Lock()


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
    with _hubs_lock:
        old = _hubs.get(store.engine)
        if old is not None:
            old.close()
        _hubs[store.engine] = hub
        _forget_last()
    if enabled and broker_url is not None:  # published after the commits
        _hook_commits(store.engine)
    if enabled and broker_url is not None:
        # Imported here, in the thread that builds the Scheduler: redis imports OpenTelemetry,
        # and two threads importing it at once (a publisher's, an enqueue's span) can meet
        # each other's half-imported modules.
        try:
            _redis()
        except ImportError as exc:
            _say_once("no_redis", f"wake-ups: {exc}; workers look for new jobs once a second")
    return hub


_last: tuple[Engine | None, Hub | None] = (None, None)  # the last engine looked up, its hub


def _hub_of(store: Store, conn: Connection) -> Hub:
    """``store``'s hub (or, unknown, ``conn``'s engine's): the last one found is kept, for the
    enqueue's hot path (a weak dictionary's lookup makes a weak reference each time)."""
    global _last
    engine, hub = _last
    if engine is store.engine and hub is not None:
        return hub
    found = _hubs.get(store.engine) or _hub(conn.engine)
    _last = (store.engine, found)
    return found


def _forget_last() -> None:
    global _last
    _last = (None, None)


def _hub(engine: Engine) -> Hub:
    found = _hubs.get(engine)
    if found is None:
        from ._time import utcnow

        with _hubs_lock:
            found = _hubs.setdefault(engine, Hub(database_key(engine), utcnow))
    return found


_keys: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


def database_key(engine: Engine) -> str:
    """Which database an engine writes to, for the workers of this process (a SQLite file's
    real path; else the URL without its password)."""
    found = _keys.get(engine)
    if found is None:
        found = _keys[engine] = _database_key(engine)
    return found


def _database_key(engine: Engine) -> str:
    url = engine.url
    if url.get_backend_name() == "sqlite":
        name = url.database or ""
        if name and name != ":memory:" and not name.startswith("file:"):
            return "sqlite:" + os.path.realpath(name)
    return url.set(password=None).render_as_string(hide_password=True)


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
    hub = _hub_of(store, conn)
    if not hub.enabled:
        return
    notify = hub.broker_url is None and conn.dialect.name == "postgresql"
    local = bool(_local.get(hub.key))  # a worker of this process that nothing else tells
    if not (notify or local or hub.broker_url is not None):
        return  # no one to tell (SQLite's workers in other processes watch the file)
    wake = _wake_of(ready, hub.clock().timestamp())
    if not wake:
        return
    if notify:
        params = {"payloads": wake.payloads()}
        if conn.in_transaction():
            conn.execute(_NOTIFY, params)
        else:  # a statement of its own (in the driver's autocommit where it can)
            store.read_rows(conn, _NOTIFY, params)
        if not local:
            return
    _after(hub, conn, wake)


def _after(hub: Hub, conn: Connection, wake: _Wake) -> None:
    """Publish ``wake`` (broker, this process's workers) after ``conn``'s transaction commits,
    or now if it is in none."""
    if not conn.in_transaction():
        _publish(hub, wake)
        return
    _hook_commits(conn.engine)
    pending: _Wake | None = conn.info.get(_PENDING)
    if pending is None:
        conn.info[_PENDING] = pending = _Wake()
        conn.info[_PENDING + "_hub"] = hub
    pending.merge(wake)


def detach(conn: Connection) -> Callable[[], None] | None:
    """What the open transaction on ``conn`` announced (for the broker and this process's
    workers), taken off it: a function that publishes it, for a transaction that someone
    else commits (Django's ``on_commit``); None when there is nothing to publish."""
    pending: _Wake | None = conn.info.pop(_PENDING, None)
    hub: Hub | None = conn.info.get(_PENDING + "_hub")
    if pending is None or hub is None:
        return None
    return lambda: _publish(hub, pending)


_hooked: weakref.WeakSet[Engine] = weakref.WeakSet()


def _hook_commits(engine: Engine) -> None:
    """Publish what a transaction announced after its commit: SQLAlchemy's ``commit`` event
    comes before the driver's commit, so the announcement moves to "committed" there and goes
    out when the connection next begins or is returned to the pool (a rollback drops it)."""
    if engine in _hooked:
        return
    with _hubs_lock:
        if engine in _hooked:
            return
        _hooked.add(engine)
    event.listen(engine, "commit", _on_commit)
    event.listen(engine, "rollback", _on_rollback)
    event.listen(engine, "begin", _on_begin)
    event.listen(engine.pool, "checkin", _on_checkin)


def _on_commit(conn: Connection) -> None:
    info = conn.info
    pending: _Wake | None = info.pop(_PENDING, None)
    if pending is not None:
        committed: _Wake | None = info.get(_COMMITTED)
        if committed is None:
            info[_COMMITTED] = pending
        else:
            committed.merge(pending)
    watcher = _sqlite_watchers.get(database_key(conn.engine)) if _sqlite_watchers else None
    if watcher is not None and not conn.get_execution_options().get("scheduler_readonly"):
        info[_SQLITE_BEFORE] = (watcher, watcher.committing())


def _on_rollback(conn: Connection) -> None:
    conn.info.pop(_PENDING, None)
    before: tuple[SqliteWatcher, bytes] | None = conn.info.pop(_SQLITE_BEFORE, None)
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
    before: tuple[SqliteWatcher, bytes] | None = info.pop(_SQLITE_BEFORE, None)
    if before is not None:
        watcher, header = before
        watcher.own(header, watcher.header())
    committed: _Wake | None = info.pop(_COMMITTED, None)
    hub: Hub | None = info.get(_PENDING + "_hub")
    if committed is not None and hub is not None:
        _publish(hub, committed)


def folds(store: Store, conn: Connection) -> bool:
    """Whether an announcement on ``conn`` is a ``pg_notify`` (PostgreSQL without a broker,
    wake-ups on) that an INSERT can carry as :data:`NOTIFY_COLUMN`, with the parameter
    ``p_wakeup`` from :func:`notify_payload`; then call :func:`announced` instead of
    :func:`announce`."""
    hub = _hub_of(store, conn)
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
    hub = _hub_of(store, conn)
    if _local.get(hub.key):
        _after(hub, conn, _wake_of(ready, hub.clock().timestamp()))


def _publish(hub: Hub, wake: _Wake) -> None:
    _publish_local(hub.key, wake)
    if hub.broker_url is not None:
        publisher = hub.publisher
        if publisher is None:
            with _hubs_lock:
                if hub.publisher is None:
                    hub.publisher = _Publisher(hub.broker_url, hub.prefix)
                publisher = hub.publisher
        publisher.submit(wake)


# -- this process's workers ---------------------------------------------------------------------
class Waiter:
    """One worker's side: the event its claim loop waits on, set when a job of one of its
    queues is ready (or, for a later ``run_at`` it heard of, when that instant comes).

    Announcements wake the worker at once, then at most once per :data:`COOLDOWN_SECONDS`:
    those that arrive meanwhile are one wake-up at the end of it (a burst of enqueues is a
    claim per cooldown, not one per enqueue). A finished job still wakes it at once (the
    worker sets its event itself)."""

    def __init__(
        self,
        event: threading.Event,
        queues: Iterable[str],
        clock: Callable[[], datetime],
        has_free: Callable[[], bool] = lambda: True,
    ) -> None:
        self.event = event
        self.queues = frozenset(queues)
        self.clock = clock
        self.has_free = has_free
        self.freed = threading.Event()  # set by the worker when a slot frees
        self.wakes = 0  # wake-ups delivered to the worker (tests, benchmarks)
        self.heard = 0  # announcements heard (several may make one wake-up)
        self._woken = float("-inf")  # time.monotonic() of the last wake-up
        self._trailing: float | None = None  # a wake-up held back by the cooldown, due then
        self._deadline: float | None = None  # time.monotonic() of the earliest later run_at
        self._timer = threading.Condition()
        self._timing: threading.Thread | None = None
        self._closed = False

    def notice(self, queue: str, at: float | None) -> bool:
        """A job of ``queue`` is ready (``at`` None) or will be at epoch ``at``; True if this
        worker takes ``queue`` (woken, or its timer set)."""
        if queue not in self.queues and queue != "*":
            return False
        delay = 0.0 if at is None else at - self.clock().timestamp()
        if delay <= 0:
            self.wake()
            return True
        due = time.monotonic() + delay + 0.002  # the claim compares run_at <= now
        with self._timer:
            if self._deadline is None or due < self._deadline:
                self._deadline = due
                self._arm()
        return True

    def wake(self) -> None:
        """A job is ready: wake the worker now, or at the end of the cooldown."""
        with self._timer:
            self.heard += 1
            now = time.monotonic()
            if now - self._woken >= COOLDOWN_SECONDS:
                self._wake(now)
            elif self._trailing is None:
                self._trailing = self._woken + COOLDOWN_SECONDS
                self._arm()

    def _wake(self, now: float) -> None:
        self._woken = now
        self._trailing = None
        self.wakes += 1
        self.event.set()

    def _arm(self) -> None:
        """(Under ``_timer``.) Start the timer thread, or tell it of an earlier instant."""
        if self._closed:
            return
        if self._timing is None:
            self._timing = threading.Thread(
                target=self._time, name="scheduler-wake-timer", daemon=True
            )
            self._timing.start()
        self._timer.notify()

    def _time(self) -> None:
        """The timer: the wake-ups held back by the cooldown, and the earliest later
        ``run_at`` heard of."""
        with self._timer:
            while not self._closed:
                due = [t for t in (self._trailing, self._deadline) if t is not None]
                if not due:
                    self._timer.wait()
                    continue
                now = time.monotonic()
                if min(due) > now:
                    self._timer.wait(min(due) - now)
                    continue
                if self._deadline is not None and self._deadline <= now:
                    self._deadline = None
                self._wake(now)

    def close(self) -> None:
        with self._timer:
            self._closed = True
            self._timer.notify()


_local: dict[str, list[Waiter]] = {}
_local_lock = threading.Lock()


def _publish_local(key: str, wake: _Wake) -> None:
    """Wake this process's workers on database ``key``: for jobs ready now, up to one per job
    (those with a free slot first); for later ones, every worker of the queue sets its timer."""
    waiters = _local.get(key)
    if not waiters:
        return
    for queue, count in wake.now.items():
        takers = [w for w in waiters if queue in w.queues]
        takers.sort(key=lambda w: not w.has_free())
        for waiter in takers[:count]:
            waiter.wake()
    for queue, at in wake.later.items():
        for waiter in waiters:
            waiter.notice(queue, at)


# -- listening ------------------------------------------------------------------------------------
class Listening:
    """What :func:`listen` started for one worker; :meth:`close` stops it."""

    def __init__(self, waiter: Waiter, key: str) -> None:
        self.waiter = waiter
        self.key = key
        self.sources: list[_Source] = []
        self.how: list[str] = []  # "notify", "broker", "sqlite-watch": how wake-ups arrive

    def slot_freed(self) -> None:
        self.waiter.freed.set()

    def close(self) -> None:
        self.waiter.close()
        with _local_lock:
            waiters = _local.get(self.key, [])
            if self.waiter in waiters:
                waiters.remove(self.waiter)
            if not waiters:
                _local.pop(self.key, None)
        for source in self.sources:
            source.stop()


def listen(app: Scheduler, waiter: Waiter) -> Listening:
    """Start what tells ``waiter`` of new jobs: the broker if configured, else PostgreSQL's
    ``LISTEN`` (not behind a transaction pooler without ``listen_url``), or the SQLite file's
    watcher; where neither a ``NOTIFY`` nor the broker reaches it, this process's own
    announcements wake it directly. Says once in the log when nothing reaches it from other
    processes."""
    store = app.store
    hub = _hub(store.engine)
    key = hub.key
    listening = Listening(waiter, key)
    if not hub.enabled:
        return listening
    dialect = store.engine.dialect.name
    database = store.database
    if hub.broker_url is not None:
        listening.sources.append(_BrokerSource(hub.broker_url, hub.prefix, waiter))
        listening.how.append("broker")
    elif dialect == "postgresql":
        url = database.listen_url
        if url is None and database.pooler == "transaction":
            _say_once(
                "no_listen",
                "wake-ups: the database URL is a transaction pooler, which cannot carry LISTEN,"
                " and neither [database] listen_url nor [broker] url is set: workers look for"
                " new jobs once a second",
            )
        elif not _have_psycopg():
            _say_once(
                "no_psycopg",
                "wake-ups: LISTEN needs psycopg (pip install 'scheduler[postgres]'): workers"
                " look for new jobs once a second",
            )
        else:
            listening.sources.append(_PostgresSource(url, store.engine, waiter))
            listening.how.append("notify")
    elif dialect == "sqlite":
        watcher = _sqlite_watcher(store.engine)
        if watcher is not None:  # (this process's commits are told apart: hooks below)
            listening.sources.append(_SqliteSource(watcher, waiter))
            listening.how.append("sqlite-watch")
    else:
        _say_once(
            "no_notify_" + dialect,
            f"wake-ups: {dialect} cannot notify other processes: set [broker] url for"
            " wake-ups across processes; until then workers look for new jobs once a second",
        )
    if "notify" not in listening.how and "broker" not in listening.how:
        # Nothing tells this worker of its own process's jobs: they wake it directly, after
        # their commits (SQLite's watcher passes over this process's commits).
        _hook_commits(store.engine)
        with _local_lock:
            _local.setdefault(key, []).append(waiter)
        listening.how.insert(0, "process")
    for started in listening.sources:
        started.start()
    return listening


_said: set[str] = set()


def _have_psycopg() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return True


def _say_once(what: str, message: str) -> None:
    if what not in _said:
        _said.add(what)
        log.warning(message, extra={"action": "wakeups_off"})


class _Source:
    """A thread that wakes a waiter; reconnects after a lost connection (with a back-off)."""

    name = "source"

    def __init__(self, waiter: Waiter) -> None:
        self.waiter = waiter
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"scheduler-{self.name}")
        self._thread.daemon = True
        self.lost_at: float | None = None  # time.monotonic() when the connection was lost
        self._backoff = RECONNECT_MIN

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._interrupt()
        self._thread.join(timeout=BROKER_WAIT_SECONDS + 1)

    def _interrupt(self) -> None:
        pass

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve()
                return
            except Exception as exc:
                if self._stop.is_set():
                    return
                if self.lost_at is None:
                    self.lost_at = time.monotonic()
                    self._backoff = RECONNECT_MIN
                    log.warning(
                        "wake-ups: %s lost (%s); workers look for new jobs once a second"
                        " until it is back",
                        self.name,
                        _first_line(exc),
                        extra={"action": "wakeups_lost", "source": self.name},
                    )
            finally:
                self._close()
            self._stop.wait(self._backoff)
            self._backoff = min(self._backoff * 2, RECONNECT_MAX)

    def _connected(self) -> None:
        """Called once listening: after a loss, say so and look at once (what was missed)."""
        if self.lost_at is not None:
            log.info(
                "wake-ups: %s back after %.1fs",
                self.name,
                time.monotonic() - self.lost_at,
                extra={"action": "wakeups_back", "source": self.name},
            )
            self.lost_at = None
        self.waiter.wake()

    def _serve(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


# -- PostgreSQL: LISTEN on a connection of the worker's own ------------------------------------
def listen_connect_args(url: str | None, engine: Engine) -> tuple[list[Any], dict[str, Any]]:
    """psycopg's connect arguments for the LISTEN connection: ``url`` (``listen_url``) or the
    engine's, named ``scheduler-listen`` (unless the URL names it), with TCP keepalives so
    that a connection cut without a word is noticed."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url) if url is not None else engine.url
    dialect = engine.dialect if url is None else parsed.get_dialect()()
    args, kwargs = dialect.create_connect_args(parsed)
    kwargs = dict(kwargs)
    query = parsed.query
    if "application_name" not in query:
        kwargs["application_name"] = LISTEN_APPLICATION_NAME
    if "connect_timeout" not in query:
        kwargs["connect_timeout"] = 5
    for key, value in (("keepalives", 1), ("keepalives_idle", 10), ("keepalives_interval", 5)):
        if key not in query:
            kwargs[key] = value
    if "keepalives_count" not in query:
        kwargs["keepalives_count"] = 3
    return list(args), kwargs


class _PipedSource(_Source):
    """A source whose thread waits in ``select`` on a pipe too: :meth:`stop` writes to it."""

    def __init__(self, waiter: Waiter) -> None:
        super().__init__(waiter)
        self._pipe = os.pipe()

    def _interrupt(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._pipe[1], b"x")

    def stop(self) -> None:
        super().stop()
        for fd in self._pipe:
            with contextlib.suppress(OSError):
                os.close(fd)


class _PostgresSource(_PipedSource):
    name = "the LISTEN connection"

    def __init__(self, url: str | None, engine: Engine, waiter: Waiter) -> None:
        super().__init__(waiter)
        self.url = url
        self.engine = engine
        self._conn: Any = None
        self.backend_pid: int | None = None  # the LISTEN connection's server process (tests)

    def _serve(self) -> None:
        import psycopg
        from psycopg import pq, sql

        args, kwargs = listen_connect_args(self.url, self.engine)
        self._conn = conn = psycopg.connect(*args, autocommit=True, **kwargs)
        row = conn.execute(f"SELECT {CHANNEL_SQL}, pg_backend_pid()").fetchone()
        assert row is not None
        channel, self.backend_pid = row
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        self._connected()
        pgconn = conn.pgconn
        while not self._stop.is_set():
            ready, _, _ = select.select([pgconn.socket, self._pipe[0]], [], [], 60.0)
            if self._pipe[0] in ready:
                return
            pgconn.consume_input()
            if pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the server closed the LISTEN connection")
            while (note := pgconn.notifies()) is not None:
                found = parse_payload(note.extra.decode())
                if found is not None:
                    self.waiter.notice(*found)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


# -- the broker (Redis) ---------------------------------------------------------------------------
def _redis() -> Any:
    try:
        import redis
    except ImportError:
        raise ImportError(
            "[broker] url is set but the redis package is not installed:"
            " pip install 'scheduler[redis]'"
        ) from None
    return redis


def token_key(prefix: str, queue: str) -> str:
    return f"{prefix}:wake:{queue}"


def show_url(url: str) -> str:
    """The broker's URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


FLUSH_SECONDS = 2.0  # how long closing (or the interpreter's exit) waits for the last push
_publishers: weakref.WeakSet[_Publisher] = weakref.WeakSet()


@atexit.register
def _flush_publishers() -> None:
    for publisher in list(_publishers):
        publisher.close()


class _Publisher:
    """Pushes the committed announcements to the broker from a thread of its own, so an
    enqueue never waits for Redis: whatever piled up meanwhile goes in one round trip (a burst
    of enqueues is a few pushes), one token per job up to :data:`TOKEN_CAP` per queue. While the
    broker is down, announcements are dropped (the workers poll) and retried after a back-off."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self._pending = _Wake()
        self._cond = threading.Condition()
        self._closed = False
        self._client: Any = None
        self._down_until = 0.0
        self._backoff = RECONNECT_MIN
        self._thread = threading.Thread(target=self._loop, name="scheduler-publish", daemon=True)
        self._thread.start()
        _publishers.add(self)

    def submit(self, wake: _Wake) -> None:
        with self._cond:
            self._pending.merge(wake)
            self._cond.notify()

    def close(self, timeout: float = FLUSH_SECONDS) -> None:
        """Stop, after publishing what is pending (waiting up to ``timeout`` for it): a
        process that enqueues and exits (a script, a management command) still wakes the
        workers."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return  # closed, and nothing left
                wake, self._pending = self._pending, _Wake()
                closing = self._closed
            if time.monotonic() < self._down_until:
                if closing:
                    return
                continue  # the broker is down: the workers poll
            try:
                self._send(wake)
                self._backoff = RECONNECT_MIN
            except Exception as exc:
                self._client = None
                self._down_until = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, RECONNECT_MAX)
                log.warning(
                    "wake-ups: cannot publish to the broker %s (%s); workers look for new jobs"
                    " once a second",
                    show_url(self.url),
                    _first_line(exc),
                    extra={"action": "wakeups_publish_failed"},
                )

    def _send(self, wake: _Wake) -> None:
        if self._client is None:
            self._client = _redis().Redis.from_url(
                self.url,
                socket_connect_timeout=BROKER_TIMEOUT_SECONDS,
                socket_timeout=BROKER_TIMEOUT_SECONDS,
            )
        pipe = self._client.pipeline(transaction=False)
        for queue, count in wake.now.items():
            key = token_key(self.prefix, queue)
            pipe.rpush(key, *(["0"] * min(count, TOKEN_CAP)))
            pipe.ltrim(key, -TOKEN_CAP, -1)
        for queue, at in wake.later.items():
            key = token_key(self.prefix, queue)
            pipe.rpush(key, f"{at:.3f}")
            pipe.ltrim(key, -TOKEN_CAP, -1)
        pipe.execute()


class _BrokerSource(_Source):
    name = "the broker"

    def __init__(self, url: str, prefix: str, waiter: Waiter) -> None:
        super().__init__(waiter)
        self.url, self.prefix = url, prefix
        self._client: Any = None
        self.keys = {token_key(prefix, queue): queue for queue in sorted(waiter.queues)}

    def _interrupt(self) -> None:
        client = self._client
        if client is not None:  # a BLPOP in flight ends with an error, then the thread stops
            with contextlib.suppress(Exception):
                client.connection_pool.disconnect()

    def _serve(self) -> None:
        redis = _redis()
        self._client = client = redis.Redis.from_url(
            self.url,
            socket_connect_timeout=BROKER_TIMEOUT_SECONDS,
            socket_timeout=BROKER_WAIT_SECONDS + BROKER_TIMEOUT_SECONDS,
        )
        client.ping()
        self._connected()
        keys = list(self.keys)
        while not self._stop.is_set():
            if not self.waiter.has_free():  # a busy worker leaves the tokens to idle ones
                self.waiter.freed.clear()
                if not self.waiter.has_free():
                    self.waiter.freed.wait(0.05)
                continue
            popped = client.blpop(keys, timeout=BROKER_WAIT_SECONDS)
            if popped is None:
                continue
            key, value = (part.decode() for part in popped)
            if not self.waiter.has_free():  # became busy meanwhile: hand the token on
                client.lpush(key, value)
                continue
            found = parse_payload(f"{value} {self.keys.get(key, '*')}")
            if found is not None:
                self.waiter.notice(*found)

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


def broker_problem(url: str) -> str | None:
    """Why the broker at ``url`` cannot carry wake-ups now (one line), or None."""
    try:
        redis = _redis()
    except ImportError as exc:
        return str(exc)
    client = redis.Redis.from_url(
        url, socket_connect_timeout=STATUS_PING_SECONDS, socket_timeout=STATUS_PING_SECONDS
    )
    try:
        client.ping()
    except Exception as exc:
        return f"broker {show_url(url)} is unreachable ({_first_line(exc)})"
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return None


# -- SQLite: the WAL index header of the database file ------------------------------------------
_SQLITE_BEFORE = "scheduler_wakeup_sqlite_before"
HEADER_BYTES = 48  # the first copy of the WAL index header (https://sqlite.org/walformat.html)
OWN_COMMIT_SECONDS = 0.1  # a commit of this process not done after this is not waited for
RECHECK_SECONDS = 0.002  # after a write to the -wal file: look at the header again this soon
RECHECK_WITHIN = 0.05  # ... until it moves, for at most this long (the frames come first)


class SqliteWatcher:
    """Reads the WAL index header of one SQLite file (its ``-shm``): it changes at every commit,
    of any process. This process's own write transactions record the header before and after
    their commit (:meth:`own`); a change made of those alone is not news."""

    def __init__(self, path: str) -> None:
        self.path = path + "-shm"
        self._fd: int | None = None
        self._inode: int | None = None
        self._own: dict[bytes, bytes] = {}
        self._lock = threading.Lock()
        self._flying = 0  # this process's commits between their two header reads
        self._flying_since = 0.0
        self.users = 0

    def header(self) -> bytes:
        """The header now (empty while there is no ``-shm`` file, no connection being open, or
        the index is not built yet)."""
        try:
            if self._fd is None:
                fd = os.open(self.path, os.O_RDONLY)
                self._fd, self._inode = fd, os.fstat(fd).st_ino
            data = os.pread(self._fd, HEADER_BYTES, 0)
            # isInit (byte 12): 0 until a connection has built the index (not a commit)
            return data if len(data) == HEADER_BYTES and data[12] else b""
        except OSError:
            self.reopen()
            return b""

    def reopen(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def stale(self) -> bool:
        """Whether the ``-shm`` file was replaced (every connection closed meanwhile)."""
        try:
            return os.stat(self.path).st_ino != self._inode
        except OSError:
            return True

    def committing(self) -> bytes:
        """One of this process's write transactions is about to commit: the header before it
        (it holds SQLite's write lock, so no other commit lands meanwhile)."""
        with self._lock:
            if not self._flying:
                self._flying_since = time.monotonic()
            self._flying += 1
        return self.header()

    def own(self, before: bytes, after: bytes | None) -> None:
        """That commit is done (``after``: the header now; None: it did not happen)."""
        with self._lock:
            self._flying = max(self._flying - 1, 0)
            if after is None or before == after:
                return
            if len(self._own) > 256:
                self._own.clear()
            self._own[before] = after

    def news(self, last: bytes, now: bytes) -> bool | None:
        """Whether going from header ``last`` to ``now`` took a commit of another process (from
        no ``-shm`` file at all: a first connection opened, not news); None while a commit of
        this process is under way (look again in a moment: it says what it changed)."""
        if last == now or not last:
            return False
        with self._lock:
            if self._flying and time.monotonic() - self._flying_since < OWN_COMMIT_SECONDS:
                return None
            seen = 0
            while last in self._own and seen < 256:
                last = self._own.pop(last)
                seen += 1
        return last != now


_sqlite_watchers: dict[str, SqliteWatcher] = {}


def _sqlite_watcher(engine: Engine) -> SqliteWatcher | None:
    key = database_key(engine)
    if not key.startswith("sqlite:"):
        return None  # in memory: one process only, woken directly
    with _hubs_lock:
        watcher = _sqlite_watchers.get(key)
        if watcher is None:
            watcher = _sqlite_watchers[key] = SqliteWatcher(key.removeprefix("sqlite:"))
        watcher.users += 1
    return watcher


class _Inotify:
    """Linux's inotify on a folder, for the writes to one file in it (through ctypes); raises
    OSError (or AttributeError) where there is none: then the watcher reads every 10 ms."""

    MASK = 0x2 | 0x80 | 0x100  # IN_MODIFY, IN_MOVED_TO, IN_CREATE

    def __init__(self, path: str) -> None:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        folder = os.path.dirname(path) or "."
        if libc.inotify_add_watch(fd, os.fsencode(folder), self.MASK) < 0:
            error = ctypes.get_errno()
            os.close(fd)
            raise OSError(error, f"inotify_add_watch {folder}")
        self.fd = fd
        self.name = os.fsencode(os.path.basename(path))

    def drain(self) -> bool:
        """Read the events that arrived; whether one was about the file."""
        hit = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return hit
            offset = 0
            while offset + 16 <= len(data):
                _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16 : offset + 16 + size].rstrip(b"\0")
                hit = hit or name == self.name
                offset += 16 + size

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class _SqliteSource(_PipedSource):
    """Wakes the worker when the WAL index header moves by another process's commit: looked at
    after each write to the ``-wal`` file (inotify: no wake-up of this thread while nothing is
    written), or every :data:`SQLITE_WATCH_SECONDS` where there is no inotify."""

    name = "the SQLite file watcher"

    def __init__(self, watcher: SqliteWatcher, waiter: Waiter) -> None:
        super().__init__(waiter)
        self.watcher = watcher
        self.how = "poll"  # or "inotify" (tests)

    def stop(self) -> None:
        super().stop()
        with _hubs_lock:
            self.watcher.users -= 1
            if self.watcher.users <= 0:
                key = "sqlite:" + self.watcher.path.removesuffix("-shm")
                _sqlite_watchers.pop(key, None)
                self.watcher.reopen()

    def _serve(self) -> None:
        watcher = self.watcher
        try:
            events: _Inotify | None = _Inotify(watcher.path.removesuffix("-shm") + "-wal")
            self.how = "inotify"
        except (OSError, AttributeError):
            events = None
        try:
            self._watch(watcher, events)
        finally:
            if events is not None:
                events.close()

    def _watch(self, watcher: SqliteWatcher, events: _Inotify | None) -> None:
        last = watcher.header()
        self._connected()
        checked = time.monotonic()
        recheck_until = 0.0  # after a write to the -wal file, until the header moves
        while not self._stop.is_set():
            now_ = time.monotonic()
            if events is None:
                timeout = SQLITE_WATCH_SECONDS
            elif now_ < recheck_until:
                timeout = RECHECK_SECONDS
            else:
                timeout = 1.0
            ready, _, _ = select.select(
                [self._pipe[0]] if events is None else [self._pipe[0], events.fd],
                [],
                [],
                timeout,
            )
            if self._pipe[0] in ready:
                return
            if events is not None and events.fd in ready and events.drain():
                recheck_until = time.monotonic() + RECHECK_WITHIN
            header = watcher.header()
            verdict = watcher.news(last, header)
            if verdict is None:  # a commit of ours under way: it will say what it changed
                recheck_until = max(recheck_until, time.monotonic() + RECHECK_SECONDS)
                continue
            if verdict:
                self.waiter.wake()
            if header != last:
                recheck_until = 0.0
            last = header
            if time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                if watcher.stale():
                    watcher.reopen()


def describe(listening: Listening | None) -> str:
    """How a worker hears of new jobs, for its start-up line."""
    if listening is None or not listening.how:
        return "polling"
    return "+".join(listening.how)


def status_warnings(
    dialect: str, database: Any, broker_url: str | None, enabled: bool
) -> list[str]:
    """``status``'s warnings about wake-ups: a broker that is down or cannot be used, or a
    pooler with nothing to listen through."""
    if not enabled:
        return []
    if broker_url is not None:
        problem = broker_problem(broker_url)
        if problem is not None:
            return [f"{problem}: workers look for new jobs once a second until it is back"]
        return []
    if dialect == "postgresql" and database.pooler == "transaction" and not database.listen_url:
        return [
            "wake-ups are off: the database URL is a transaction pooler and neither"
            " [database] listen_url nor [broker] url is set (workers look for new jobs once a"
            " second)"
        ]
    return []


__all__ = [
    "Hub",
    "Listening",
    "Ready",
    "SqliteWatcher",
    "Waiter",
    "announce",
    "configure",
    "database_key",
    "listen",
]
