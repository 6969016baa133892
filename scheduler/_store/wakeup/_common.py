"""What the parts of wake-ups share: an announcement's content, the payload's text, the
registry lock, a database's key, and the log lines said once."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine

log = logging.getLogger("scheduler._store.wakeup")

RECONNECT_MIN, RECONNECT_MAX = 0.5, 10.0  # back-off of a lost LISTEN or broker connection

# Guards the registries of hubs, hooked engines and SQLite watchers.
registry_lock = threading.Lock()

Ready = tuple[str, datetime | None]
"""A job made ready: its queue and its ``run_at`` (None: now)."""


# -- what an announcement carries ---------------------------------------------------------------
@dataclass
class Wake:
    """Per queue: how many jobs are ready now, and the earliest later ``run_at`` (epoch s)."""

    now: dict[str, int] = field(default_factory=dict)
    later: dict[str, float] = field(default_factory=dict)

    def add(self, queue: str, at: float | None, count: int = 1) -> None:
        if at is None:
            self.now[queue] = self.now.get(queue, 0) + count
        else:
            known = self.later.get(queue)
            self.later[queue] = at if known is None else min(known, at)

    def merge(self, other: Wake) -> None:
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


def wake_of(ready: Iterable[Ready], now: float) -> Wake:
    wake = Wake()
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


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


said: set[str] = set()


def say_once(what: str, message: str) -> None:
    if what not in said:
        said.add(what)
        log.warning(message, extra={"action": "wakeups_off"})


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
