"""Claims that go on from where the last one left off while the queue's dead rows pile up.

Every claim leaves a dead version of the job row behind, and its entry in the ready index
``(state, queue, priority, run_at, id)`` stays there, at the front of the range the next
claim walks, until vacuum removes it. Normally that is seconds: vacuum runs, and a scan that
meets an entry whose row no transaction can see any more marks it dead in the index for the
scans after it. While a transaction elsewhere holds the MVCC horizon (a report, a
``pg_dump``, a session left idle in a transaction), neither can happen: every claim walks
every entry left since the horizon was pinned, fetching each row to find it gone, and the
claim's cost grows with the time held (issue 25 measured throughput falling from 300 to 191
jobs a second after 240 s, with 9,283 jobs waiting).

A :class:`ClaimCursor` notices the walk by its cost. Normally every claim starts from the
front of the range (a *sweep*), exactly as before. Once ``SLOW_SWEEPS`` sweeps in a row take
longer than ``SLOW_SECONDS``, claims go on from the last job this runner claimed (a row
comparison the index is range-scanned from: ``ClaimKey``), and only one claim every
``SWEEP_SECONDS`` is a sweep again, which also finds what a cursor passes over: a job made
ready behind it (a higher priority, an older ``run_at`` committed late, a row another claimer
had locked). A sweep as fast as normal ends it. So a job behind the cursor waits at most
``SWEEP_SECONDS`` longer, and only while sweeping is slow. Meanwhile the look for expired
leases, which walks the lease index's dead entries alike, runs once every ``SWEEP_SECONDS``.

PostgreSQL only (its dead versions are what piles up), and a claim of one queue only: the
index is ordered within a queue, so one cursor across queues would pass over the other
queues' jobs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from .._model.job import Job
from .jobs import ClaimKey

SLOW_SECONDS = 0.025
"""A sweep slower than this counts towards going on from a cursor."""
SLOW_SWEEPS = 3
"""Sweeps in a row slower than ``SLOW_SECONDS`` before claims go on from a cursor."""
SWEEP_SECONDS = 1.0
"""While claims go on from a cursor, one claim at least this often sweeps from the front."""


@dataclass
class _Variant:
    """The cursor of one kind of claim (its handlers filter), which sees its own jobs only."""

    key: ClaimKey | None = None
    slow: int = 0  # consecutive slow sweeps
    swept_at: float = float("-inf")


@dataclass
class ClaimCursor:
    """Per runner: where its claims go on from, when they do (module docstring)."""

    enabled: bool
    clock: Callable[[], float] = time.monotonic
    _variants: dict[tuple[tuple[str, ...], bool], _Variant] = field(default_factory=dict)
    _expired_at: float = float("-inf")

    def claim(
        self,
        handlers: Collection[str],
        exclude: bool,
        run: Callable[[ClaimKey | None], Sequence[Job]],
    ) -> list[Job]:
        """``run(after)`` the claim, from the cursor or as a sweep, and learn from it."""
        if not self.enabled:
            return list(run(None))
        variant = self._variants.setdefault((tuple(sorted(handlers)), exclude), _Variant())
        began = self.clock()
        cursor = (
            variant.key is not None
            and variant.slow >= SLOW_SWEEPS
            and began - variant.swept_at < SWEEP_SECONDS
        )
        found = list(run(variant.key if cursor else None))
        if not cursor:
            variant.swept_at = began
            slow = self.clock() - began > SLOW_SECONDS
            variant.slow = variant.slow + 1 if slow else 0
        if found:  # in the claim's order: every job before the last is taken, or was passed
            last = found[-1]  # over (a sweep finds those)
            variant.key = (last.priority, last.run_at, last.id)
        return found

    def expired_due(self) -> bool:
        """Whether to look for expired leases now: always, but while claims go on from a
        cursor at most once every ``SWEEP_SECONDS`` (that scan walks the lease index's dead
        entries the same way, and a lease runs for tens of seconds)."""
        now = self.clock()
        if self.active and now - self._expired_at < SWEEP_SECONDS:
            return False
        self._expired_at = now
        return True

    @property
    def active(self) -> bool:
        """Whether some kind of claim goes on from a cursor now."""
        return any(v.slow >= SLOW_SWEEPS and v.key is not None for v in self._variants.values())
