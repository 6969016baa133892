"""The tick's rule for one due row, as a pure function: what happens to it, and with what.

:func:`decide` reads no clock and writes nothing: it sees the row as the due query read it
(with its last job's state) and the tick's ``now``, and returns a :class:`Decision`. Carrying
the decision out (the transaction, the compare-and-swap on the row's version that makes a stale
snapshot lose, the signals) is the dispatcher's part (``scheduler/_dispatch``).

The rules, in order (docs/explanation/tick.md tells them for users):

1. The last job is ``aborted`` (checked before the in-flight gate, whatever the concurrency):
   count one more consecutive failure. If the limit is reached (the row's own
   ``max_consecutive_failures``, else the global one; 0 means no limit), **disable** the row;
   otherwise **rerun** that same job in place and move the row to its next slot.
2. The row is not concurrent and its last job is still in flight (``queued`` or ``claimed``):
   **hold back**. Nothing is written and ``next_run_at`` stays, so the row fires as soon as the
   job ends.
3. Otherwise **dispatch** a fresh job and move to the next slot; the failure count is reset to 0
   when the previous job succeeded or there was none, and kept while a failure streak goes on.

The next slot is the first cron slot after ``now``: slots missed meanwhile are coalesced into
this one run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from .._store.tables import JobState
from .due import DueRow


class Action(StrEnum):
    """What the tick does with one due row."""

    DISPATCH = "dispatch"
    """Create a fresh job, point the row at it, move the row to its next slot."""
    RERUN = "rerun"
    """Reset the row's aborted last job to ``queued`` (the same job id), move to the next slot."""
    HOLD_BACK = "hold_back"
    """Write nothing: the last job is still in flight and the row is not concurrent."""
    DISABLE = "disable"
    """Disable the row: too many consecutive failures."""
    # Room for the run policies to come; decide() returns none of these yet.
    SKIP = "skip"
    """Drop this slot (the last job is in flight) and move to the next one."""
    MISSED = "missed"
    """The slot is older than the catch-up window: record it, wait for the next slot."""
    COALESCED = "coalesced"
    """Several missed slots merged into one run."""


REASON_FAILURES = "max_consecutive_failures"
"""Why a row was disabled by the tick (stored in ``disabled_reason``)."""
REASON_IN_FLIGHT = "in_flight"
"""Why a row was held back: its last job is queued or claimed."""

NextSlot = Callable[[DueRow, datetime], datetime]
"""The row's first slot strictly after ``now`` (its cron in its timezone)."""

_IN_FLIGHT = frozenset({JobState.QUEUED, JobState.CLAIMED})
_RESETS_FAILURES = frozenset({JobState.SUCCEEDED, None})


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one due row, and the values to write."""

    action: Action
    failures: int
    """The row's ``consecutive_failures`` after this decision."""
    next_run_at: datetime | None
    """The row's new ``next_run_at``; None when it does not move (hold back, disable)."""
    reason: str | None = None
    """Why (a disable's ``disabled_reason``, a hold back's cause); None for a dispatch."""


def decide(
    row: DueRow, now: datetime, *, max_consecutive_failures: int, next_slot: NextSlot
) -> Decision:
    """The decision for one due `row` at `now`.

    `max_consecutive_failures` is the global limit, used when the row has none of its own
    (0: unlimited). `next_slot` computes the row's next slot; it is only called when the row
    moves on.
    """
    state = row.job_state
    if state == JobState.ABORTED:
        failures = row.consecutive_failures + 1
        limit = row.max_consecutive_failures
        if limit is None:
            limit = max_consecutive_failures
        if limit and failures >= limit:
            return Decision(Action.DISABLE, failures, None, REASON_FAILURES)
        return Decision(Action.RERUN, failures, next_slot(row, now))
    if state in _IN_FLIGHT and not row.concurrent:
        return Decision(Action.HOLD_BACK, row.consecutive_failures, None, REASON_IN_FLIGHT)
    failures = 0 if state in _RESETS_FAILURES else row.consecutive_failures
    return Decision(Action.DISPATCH, failures, next_slot(row, now))
