"""One clock for every host: the database server's (``[scheduler] clock``).

With ``clock = "database"`` (the default on PostgreSQL and MariaDB) every time the scheduler
compares across hosts (a row due, a lease expired, a job taken over, a heartbeat's new lease,
the health thresholds) is the database server's time, so a host whose clock is minutes off
neither fires early nor takes over a healthy job.

How: not ``now()`` inside each statement, but a *reading* of the server's clock, carried
forward on this host's elapsed-time counter. A reading is the lowest round trip of a few
``SELECT clock_timestamp()`` (MariaDB/MySQL: ``UTC_TIMESTAMP(6)``) on one connection, the
server's time taken to be at the round trip's midpoint; :class:`DatabaseClock` then returns
that time plus the time elapsed since on ``CLOCK_BOOTTIME`` (``time.monotonic`` where there is
none), and takes a new reading every ``REFRESH_SECONDS``. So:

- the host's wall clock plays no part: stepping it (NTP, an operator, ``faketime``) changes
  nothing, and a host whose clock is 5 minutes off decides on the database's time;
- the error is at most half the round trip (well under a millisecond on a LAN) plus the
  drift of the host's counter between readings (50 ppm of 10 s: 0.5 ms); a suspended VM's
  ``CLOCK_BOOTTIME`` counts the suspension;
- it costs one round trip every ``REFRESH_SECONDS`` per process, and nothing per statement,
  so every statement of the queue and the tick stays as it is, with a bound ``now``: the same
  code runs with ``clock = "local"``, with a clock injected by a test (``ManualClock``), and
  under freezegun (which only the local clock follows).

A reading that fails (the server is away) keeps the previous one, carried forward, and is
tried again after ``RETRY_SECONDS``; without any reading yet, the error is the caller's (as
the statement it was about to run would have failed).

Each reading also gives this host's *offset*: the server's time minus the host's wall clock.
Workers record it in ``scheduler_workers.clock_offset``; ``status`` warns when a host's is
more than ``health.CLOCK_WARN_SECONDS`` off.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from .._errors import ConfigError
from .._model.time import Clock, utcnow
from .engine import Store

log = logging.getLogger(__name__)

CLOCK_ENV = "SCHEDULER_CLOCK"
"""Overrides ``[scheduler] clock`` (``database`` or ``local``)."""
MODES = ("database", "local")
REFRESH_SECONDS = 10.0
"""A new reading of the server's clock at most this often (when the clock is read)."""
RETRY_SECONDS = 1.0
"""After a failed reading, the next try waits this long (the previous reading goes on)."""
SAMPLES = 3
"""Round trips per reading; the shortest is kept."""
WARN_SECONDS = 2.0
"""A reading this far off the host's clock is logged as a warning (as ``status`` warns)."""

_SERVER_NOW = {
    "postgresql": "SELECT clock_timestamp()",
    "mysql": "SELECT UTC_TIMESTAMP(6)",
    "mariadb": "SELECT UTC_TIMESTAMP(6)",
}

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def elapsed() -> float:
    """Seconds on this host's steady counter: never stepped, counting a suspension."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


@dataclass(frozen=True)
class Reading:
    """The server's clock, read once."""

    server: datetime
    """The server's time (aware UTC) at ``at``."""
    at: float
    """:func:`elapsed` at the midpoint of the round trip."""
    offset: float
    """The server's time minus this host's wall clock, in seconds."""
    round_trip: float


def _aware(value: Any) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"the server's clock returned {value!r}")
    if value.tzinfo is None:  # UTC_TIMESTAMP: naive UTC
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def read(store: Store, samples: int = SAMPLES) -> Reading:
    """One reading of `store`'s server clock: the shortest of `samples` round trips."""
    statement = _SERVER_NOW.get(store.caps.dialect)
    if statement is None:
        raise ValueError(f"no server clock on {store.caps.dialect}")
    best: Reading | None = None
    with store.engine.connect() as conn:
        conn.exec_driver_sql(statement).scalar()  # the transaction's BEGIN, off the timing
        for _ in range(samples):
            wall0, t0 = time.time(), elapsed()
            value = conn.exec_driver_sql(statement).scalar()
            t1, wall1 = elapsed(), time.time()
            server = _aware(value)
            trip = t1 - t0
            if best is None or trip < best.round_trip:
                offset = server.timestamp() - (wall0 + wall1) / 2
                best = Reading(server, (t0 + t1) / 2, offset, trip)
        conn.rollback()
    assert best is not None
    return best


class DatabaseClock:
    """A :data:`~scheduler._time.Clock` that returns the database server's time (see the
    module's docstring); thread-safe."""

    def __init__(self, store: Store, *, refresh: float = REFRESH_SECONDS) -> None:
        self._store = store
        self._refresh_every = refresh
        self._reading: Reading | None = None
        self._next_try = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        reading = self.reading()
        return reading.server + timedelta(seconds=elapsed() - reading.at)

    def reading(self) -> Reading:
        """The current reading, taking a new one when it is ``refresh`` seconds old."""
        reading, now = self._reading, elapsed()
        if reading is not None and now - reading.at < self._refresh_every:
            return reading
        if reading is None:
            self._lock.acquire()
        elif now < self._next_try or not self._lock.acquire(blocking=False):
            return reading  # another thread is reading it, or the last try failed just now
        try:
            current = self._reading
            if current is not reading and current is not None:
                return current  # read meanwhile by another thread
            try:
                fresh = read(self._store)
            except SQLAlchemyError as exc:
                if reading is None:
                    raise
                self._next_try = elapsed() + RETRY_SECONDS
                log.debug("could not read the database's clock (going on with the last): %s", exc)
                return reading
            if reading is None or abs(fresh.offset - reading.offset) > 1.0:
                # Worth a warning past the threshold status warns at (health.py's 2 s).
                level = logging.WARNING if abs(fresh.offset) > WARN_SECONDS else logging.DEBUG
                log.log(
                    level,
                    "this host's clock is %+.3fs off the database's",
                    -fresh.offset,
                    extra={"action": "clock_offset", "offset": fresh.offset},
                )
            self._reading = fresh
            return fresh
        finally:
            self._lock.release()

    def offset(self) -> float | None:
        """The server's time minus this host's wall clock (seconds), from the current reading;
        None if the server cannot be read now and never was."""
        try:
            return self.reading().offset
        except SQLAlchemyError:
            return None


@dataclass(frozen=True)
class Chosen:
    """The clock a Scheduler decides with, and what measures the host's offset."""

    mode: str
    """``database`` or ``local``."""
    clock: Clock
    meter: DatabaseClock | None
    """Reads the server's clock (None on SQLite, and for an injected clock)."""


def choose(store: Store, clock: Clock | str | None, setting: str) -> Chosen:
    """The clock for `store`: an injected callable `clock` (tests) is used as it is (local);
    else the mode `clock` names, else ``SCHEDULER_CLOCK``, else `setting` (``[scheduler]
    clock``). SQLite's clock is this host's, whatever the mode."""
    if clock is not None and not isinstance(clock, str):
        return Chosen("local", clock, None)
    source, mode = "Scheduler(clock=...)", clock
    if mode is None:
        env = os.environ.get(CLOCK_ENV, "").strip()
        source, mode = (CLOCK_ENV, env) if env else ("[scheduler] clock", setting)
    check_mode(mode, source)
    if store.caps.dialect not in _SERVER_NOW:
        return Chosen("local", utcnow, None)
    meter = DatabaseClock(store)
    if mode == "database":
        return Chosen("database", meter, meter)
    return Chosen("local", utcnow, meter)


def check_mode(mode: str, source: str) -> None:
    if mode not in MODES:
        raise ConfigError(f"{source}: expected 'database' or 'local', got {mode!r}")
