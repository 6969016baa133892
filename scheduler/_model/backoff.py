"""The one back-off: a delay that doubles after each failure up to a cap.

Every retry of the scheduler's waits this way: a job's attempts (1, 2, 4 ... minutes, capped
at an hour), the worker's loops after a database error, the recording of outcomes while the
database is away, and a lost wake-up connection. What differs is only the first delay and
the cap; what to do while waiting (sleep, wait on an event, skip publishing) is the caller's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypeVar

_D = TypeVar("_D", float, timedelta)

_MAX_DOUBLINGS = 40  # 2**40 times any first delay is past every cap


def delay_after(failures: int, first: _D, cap: _D) -> _D:
    """The wait after `failures` failures in a row: `first` after one, then doubling, never
    over `cap` (`first` for 0 or 1)."""
    doubled: _D = first * 2 ** min(max(failures - 1, 0), _MAX_DOUBLINGS)
    return min(doubled, cap)


class Backoff:
    """The waits of one loop that retries: :meth:`next` gives the wait after a failure (the
    first, then doubling up to the cap); :meth:`reset` after a success starts again."""

    __slots__ = ("cap", "failures", "first")

    def __init__(self, first: float, cap: float) -> None:
        self.first = first
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        """The wait after one more failure."""
        self.failures += 1
        return delay_after(self.failures, self.first, self.cap)

    def reset(self) -> None:
        """A success: the next failure waits the first delay again."""
        self.failures = 0
