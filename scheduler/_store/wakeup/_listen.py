"""What a worker listens through (:func:`listen`), and how it is described to the user."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._announce import hook_commits, hub_for
from ._broker import BrokerSource, broker_problem
from ._common import say_once
from ._postgres import PostgresSource, have_psycopg
from ._process import Waiter, local_lock, local_waiters
from ._sources import Source
from ._sqlite import SqliteSource, sqlite_watcher

if TYPE_CHECKING:
    from ..engine import Store


class Listening:
    """What :func:`listen` started for one worker; :meth:`close` stops it."""

    def __init__(self, waiter: Waiter, key: str) -> None:
        self.waiter = waiter
        self.key = key
        self.sources: list[Source] = []
        self.how: list[str] = []  # "notify", "broker", "sqlite-watch": how wake-ups arrive

    def slot_freed(self) -> None:
        self.waiter.freed.set()

    def close(self) -> None:
        self.waiter.close()
        with local_lock:
            waiters = local_waiters.get(self.key, [])
            if self.waiter in waiters:
                waiters.remove(self.waiter)
            if not waiters:
                local_waiters.pop(self.key, None)
        for source in self.sources:
            source.stop()


def listen(store: Store, waiter: Waiter) -> Listening:
    """Start what tells ``waiter`` of new jobs: the broker if configured, else PostgreSQL's
    ``LISTEN`` (not behind a transaction pooler without ``listen_url``), or the SQLite file's
    watcher; where neither a ``NOTIFY`` nor the broker reaches it, this process's own
    announcements wake it directly. Says once in the log when nothing reaches it from other
    processes."""
    hub = hub_for(store.engine)
    key = hub.key
    listening = Listening(waiter, key)
    if not hub.enabled:
        return listening
    dialect = store.engine.dialect.name
    database = store.database
    if hub.broker_url is not None:
        listening.sources.append(BrokerSource(hub.broker_url, hub.prefix, waiter))
        listening.how.append("broker")
    elif dialect == "postgresql":
        url = database.listen_url
        if url is None and database.pooler == "transaction":
            say_once(
                "no_listen",
                "wake-ups: the database URL is a transaction pooler, which cannot carry LISTEN,"
                " and neither [database] listen_url nor [broker] url is set: workers look for"
                " new jobs once a second",
            )
        elif not have_psycopg():
            say_once(
                "no_psycopg",
                "wake-ups: LISTEN needs psycopg (pip install 'rerun-scheduler[postgres]'): workers"
                " look for new jobs once a second",
            )
        else:
            listening.sources.append(PostgresSource(url, store.engine, waiter))
            listening.how.append("notify")
    elif dialect == "sqlite":
        watcher = sqlite_watcher(store.engine)
        if watcher is not None:  # (this process's commits are told apart: hooks below)
            listening.sources.append(SqliteSource(watcher, waiter))
            listening.how.append("sqlite-watch")
    else:
        say_once(
            "no_notify_" + dialect,
            f"wake-ups: {dialect} cannot notify other processes: set [broker] url for"
            " wake-ups across processes; until then workers look for new jobs once a second",
        )
    if "notify" not in listening.how and "broker" not in listening.how:
        # Nothing tells this worker of its own process's jobs: they wake it directly, after
        # their commits (SQLite's watcher passes over this process's commits).
        hook_commits(store.engine)
        with local_lock:
            local_waiters.setdefault(key, []).append(waiter)
        listening.how.insert(0, "process")
    for started in listening.sources:
        started.start()
    return listening


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
