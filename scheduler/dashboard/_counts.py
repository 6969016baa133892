"""The finished states' job counts, taken in the background: no page request waits on them.

Counting the ``succeeded`` and ``aborted`` jobs walks an index entry per finished job (about
100 ms per million on SQLite and PostgreSQL here), the rest of the Workers & health page a few
milliseconds. So the page shows the counts of the last background count with their age
(stale-while-revalidate, as Oban Web reads its counts from Oban.Met): a request that finds them
older than :meth:`FinishedCounts.interval` starts one count in a thread and is answered with
the last counts meanwhile. The interval grows with what a count costs, so counting takes at
most 1/:data:`COST_SHARE` of one connection's time: a small database is counted on every
refresh, a million jobs every ten seconds or so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from .._store.status import counts as _counts
from .._store.status import shards as _shards

if TYPE_CHECKING:
    from .._app import Scheduler

log = logging.getLogger(__name__)

COST_SHARE = 100
"""A count is taken at most once per this many times its own duration."""


@dataclass(frozen=True)
class Counted:
    """The last counts, when they were taken (the app's clock, at the start) and how long the
    count took; ``counts`` is None until the first count has ended."""

    counts: dict[str, int] | None
    at: datetime | None
    seconds: float
    counting: bool  # a count is under way
    failed: bool  # the last count failed (logged): ``counts`` are older ones, or None


class FinishedCounts:
    """The counts of the finished states, shared by every viewer of one dashboard."""

    def __init__(
        self, app: Scheduler, min_interval: float, clock: Callable[[], float] | None = None
    ) -> None:
        self.app = app
        self.min_interval = min_interval
        # time.monotonic looked up at each call, not taken as a default at import (freezegun
        # replaces it while time is frozen: a default would depend on the import order)
        self._clock = clock or (lambda: time.monotonic())
        self._lock = threading.Lock()
        self._counts: dict[str, int] | None = None
        self._at: datetime | None = None
        self._seconds = 0.0
        self._failed = False
        self._ended = float("-inf")  # monotonic, when the last count ended (or failed)
        self._thread: threading.Thread | None = None

    def interval(self) -> float:
        """Seconds between two counts: the refresh interval, or more when counting is slow."""
        return max(self.min_interval, COST_SHARE * self._seconds)

    def get(self) -> Counted:
        """The last counts; starts a count in the background when they are due (never waits)."""
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
            if not running and self._clock() - self._ended >= self.interval():
                self._thread = threading.Thread(
                    target=self._count, name="scheduler-dashboard-counts", daemon=True
                )
                self._thread.start()
                running = True
            return Counted(self._counts, self._at, self._seconds, running, self._failed)

    def wait(self, timeout: float | None = None) -> None:
        """Until the count under way (if any) has ended: for tests and scripts."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _count(self) -> None:
        at, start = self.app.clock(), self._clock()
        try:
            every = []
            for shard in self.app.shards:  # [database] shards: every shard's, added
                with shard.store.read() as conn:
                    every.append(_counts.finished_counts(conn))
            counts = every[0] if len(every) == 1 else _shards.counts(every)
        except Exception as exc:  # logged; the last counts are shown meanwhile
            log.warning(
                "dashboard: cannot count the finished jobs: %s",
                str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc),
                extra={"action": "dashboard_count_failed"},
            )
            with self._lock:
                self._failed = True
                self._ended = self._clock()  # failed or not: no retry storm
            return
        with self._lock:
            self._counts, self._at = counts, at
            self._seconds = self._clock() - start
            self._failed = False
            self._ended = self._clock()
