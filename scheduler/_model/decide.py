"""The tick's rule for one due row, as a pure function: what happens to it, and with what.

:func:`decide` reads no clock and writes nothing: it sees the row as the due query read it
(with its last job's state and its run policies) and the tick's ``now``, and returns a
:class:`Decision`: the action, the values to write, and the decision-log entries that go with
it (docs/howto/why-didnt-my-task-run.md). Carrying the decision out (the transaction, the
compare-and-swap on the row's version that makes a stale snapshot lose, the entries written
in that same transaction, the signals) is the writers' part (``scheduler/_store/writers/``).

The rules, in order (docs/explanation/tick.md tells them for users):

0. The row has a ``catchup_window`` and its due instant is older than that: the slot is
   **missed**: nothing runs, the row moves to its next slot.
1. The last job is ``aborted`` (checked before the in-flight gate, whatever the overlap):
   count one more consecutive failure. If the limit is reached (the row's own
   ``max_consecutive_failures``, else the global one; 0 means no limit), **disable** the row;
   otherwise **rerun** that same job in place and move the row to its next slot.
2. The last job is still in flight (``queued`` or ``claimed``) and the row's ``overlap`` is not
   ``allow`` (``concurrent`` is its alias): ``skip`` drops the slot (**skip**, the row moves on);
   ``hold`` **holds back**: ``next_run_at`` stays, so the row fires as soon as the job ends, and
   only the first tick that holds a slot back writes (the log entry and ``held_slot``);
   ``replace`` holds back the same way, its first tick also asking the job to cancel
   (**replace**): the job ends ``aborted``/``cancelled`` and rule 1 reruns it in place.
3. Otherwise **dispatch** a fresh job and move to the next slot; the failure count is reset to 0
   when the previous job succeeded or there was none, and kept while a failure streak goes on.

The next slot is the first cron slot after ``now`` (with the row's jitter added): slots missed
meanwhile are coalesced into this one run, and a ``coalesced`` entry counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple

from .rows import DueRow
from .rules import ALLOW, IN_FLIGHT, REPLACE, SKIP, JobState


class Action(StrEnum):
    """What the tick does with one due row."""

    DISPATCH = "dispatch"
    """Create a fresh job, point the row at it, move the row to its next slot."""
    RERUN = "rerun"
    """Reset the row's aborted last job to ``queued`` (the same job id), move to the next slot."""
    HOLD_BACK = "hold_back"
    """The last job is still in flight and the row's overlap is ``hold``: the row stays due
    (only the first hold of a slot writes: its log entry and ``held_slot``)."""
    DISABLE = "disable"
    """Disable the row: too many consecutive failures."""
    REPLACE = "replace"
    """The last job is in flight and the row's overlap is ``replace``: ask it to cancel (the
    cancel of a running job) and hold the slot back, so it runs once the job has stopped (only
    the first tick that finds the slot writes)."""
    SKIP = "skip"
    """Drop this slot (the last job is in flight, overlap ``skip``) and move to the next one."""
    MISSED = "missed"
    """The slot is older than the catch-up window: record it, wait for the next slot."""
    COALESCED = "coalesced"
    """Several missed slots merged into one run (a log entry beside a dispatch or a rerun;
    never an action of its own)."""


class Logged(StrEnum):
    """The decisions the log holds (``scheduler_decisions.decision``)."""

    DISPATCHED = "dispatched"
    RERUN = "rerun"
    HELD_BACK = "held_back"
    SKIPPED_OVERLAP = "skipped_overlap"
    MISSED = "missed"
    COALESCED = "coalesced"
    DISABLED = "disabled"
    REPLACED = "replaced"
    """Overlap ``replace``: the slot asked the in-flight job (named) to cancel, to run after it."""
    PROBED = "probed"
    """A row disabled by the failure limit ran a recovery probe (its job rerun in place)."""
    RECOVERED = "recovered"
    """A recovery probe succeeded: the row is enabled again."""
    PAUSED = "paused"
    TRIGGERED = "triggered"
    BACKFILLED = "backfilled"
    DST_GAP = "dst_gap"
    DST_REPEAT = "dst_repeat"


REASON_FAILURES = "max_consecutive_failures"
CANCELLED = "cancelled"  # the code of a job an operator cancelled: not a failure of its task
"""Why a row was disabled by the tick (stored in ``disabled_reason``)."""
REASON_IN_FLIGHT = "in_flight"
"""Why a row was held back or its slot skipped: its last job is queued or claimed."""
REASON_LATE = "catchup_window"
"""Why a slot was missed: it was due longer ago than the row's ``catchup_window``."""
REASON_MERGED = "merged"
"""Why slots were coalesced: they passed before the tick got to the row."""


NextSlot = Callable[[DueRow, datetime], datetime]
"""The row's new ``next_run_at``: its first slot strictly after ``now`` (its cron in its
timezone), with its jitter added."""
Passed = Callable[[DueRow, datetime, datetime], int]
"""(row, slot, now) -> how many of the row's later slots were due by ``now`` (coalesced)."""
DstNotes = Callable[[DueRow, datetime, datetime], tuple[tuple[str, datetime], ...]]
"""(row, now, new next_run_at) -> the DST cases on the way there: ("dst_gap", slot moved),
("dst_repeat", repeated instant not fired)."""

_RESETS_FAILURES = frozenset({JobState.SUCCEEDED, None})
_MOVES = frozenset({Action.DISPATCH, Action.RERUN, Action.SKIP, Action.MISSED})


class Entry(NamedTuple):
    """One decision-log entry, written in the transaction that carries the decision out."""

    decision: Logged
    slot: datetime | None
    job_id: int | None = None
    """The job it concerns (the blocking job of a hold back or a skip); see `new_job`."""
    reason: str | None = None
    detail: str | None = None
    new_job: bool = False
    """The entry concerns the job this decision creates (its id is known once written)."""


class Decision(NamedTuple):
    """What to do with one due row, and the values to write (a named tuple: the tick makes
    one per due row)."""

    action: Action
    failures: int
    """The row's ``consecutive_failures`` after this decision."""
    next_run_at: datetime | None
    """The row's new ``next_run_at``; None when it does not move (hold back, disable)."""
    reason: str | None = None
    """Why (a disable's ``disabled_reason``, a hold back's cause); None for a dispatch."""
    slot: datetime | None = None
    """The nominal slot served (before jitter): the job's ``slot``; None when not given."""
    log: tuple[Entry, ...] = ()
    """The decision-log entries to write with it (none for a slot already held back)."""

    @property
    def writes(self) -> bool:
        """Whether carrying it out writes anything (a repeated hold back does not)."""
        return self.action is not Action.HOLD_BACK or bool(self.log)


def overlap_of(row: DueRow) -> str:
    """The row's overlap policy (``concurrent`` is an alias of ``allow``)."""
    return ALLOW if row.concurrent else row.overlap


def decide(
    row: DueRow,
    now: datetime,
    *,
    max_consecutive_failures: int,
    next_slot: NextSlot,
    slot: datetime | None = None,
    passed: Passed | None = None,
    dst: DstNotes | None = None,
) -> Decision:
    """The decision for one due `row` at `now`.

    `max_consecutive_failures` is the global limit, used when the row has none of its own
    (0: unlimited). `next_slot` computes the row's next ``next_run_at``; it is only called when
    the row moves on. `slot` is the nominal slot the row's ``next_run_at`` stands for (the same
    instant without jitter; default ``next_run_at``). `passed` counts the slots a run merges
    (no ``coalesced`` entry without it); `dst` tells the DST cases on the way to the next slot.
    """
    served = row.next_run_at if slot is None else slot
    state = row.job_state
    failures = row.consecutive_failures
    late = (now - row.next_run_at).total_seconds() if row.catchup_window else 0.0
    if row.catchup_window and late > row.catchup_window:
        detail = f"due {late:.0f} s ago, catch-up window {row.catchup_window} s"
        return _moving(
            row,
            now,
            Action.MISSED,
            failures,
            served,
            REASON_LATE,
            next_slot,
            dst,
            (Entry(Logged.MISSED, served, None, REASON_LATE, detail),),
        )
    if state == JobState.ABORTED and row.job_error == CANCELLED:
        # An operator cancelled the last run: rerun in place, the failure count unchanged.
        entry = Entry(Logged.RERUN, served, row.last_job_id, CANCELLED, "cancelled: not a failure")
        merged = _coalesced(row, served, now, passed, row.last_job_id)
        return _moving(
            row, now, Action.RERUN, failures, served, None, next_slot, dst, (entry, *merged)
        )
    if state == JobState.ABORTED:
        failures += 1
        limit = row.max_consecutive_failures
        if limit is None:
            limit = max_consecutive_failures
        if limit and failures >= limit:
            detail = f"{failures} consecutive failures (last error {row.job_error})"
            entry = Entry(Logged.DISABLED, served, row.last_job_id, REASON_FAILURES, detail)
            return Decision(Action.DISABLE, failures, None, REASON_FAILURES, served, (entry,))
        entry = Entry(Logged.RERUN, served, row.last_job_id, row.job_error, f"failure {failures}")
        merged = _coalesced(row, served, now, passed, row.last_job_id)
        return _moving(
            row, now, Action.RERUN, failures, served, None, next_slot, dst, (entry, *merged)
        )
    overlap = ALLOW if row.concurrent else row.overlap
    if state in IN_FLIGHT and overlap != ALLOW:
        detail = f"job {row.last_job_id} is {state}"
        if overlap == SKIP:
            entry = Entry(Logged.SKIPPED_OVERLAP, served, row.last_job_id, REASON_IN_FLIGHT, detail)
            return _moving(
                row, now, Action.SKIP, failures, served, REASON_IN_FLIGHT, next_slot, dst, (entry,)
            )
        if overlap == REPLACE:  # the first tick of the slot asks the job to cancel
            if row.held_slot == served:
                return Decision(Action.HOLD_BACK, failures, None, REASON_IN_FLIGHT, served)
            detail = f"job {row.last_job_id} ({state}) cancelled to run this slot once it stops"
            entry = Entry(Logged.REPLACED, served, row.last_job_id, REASON_IN_FLIGHT, detail)
            return Decision(Action.REPLACE, failures, None, REASON_IN_FLIGHT, served, (entry,))
        log: tuple[Entry, ...] = ()
        if row.held_slot != served:  # the first tick to hold this slot back logs it
            log = (Entry(Logged.HELD_BACK, served, row.last_job_id, REASON_IN_FLIGHT, detail),)
        return Decision(Action.HOLD_BACK, failures, None, REASON_IN_FLIGHT, served, log)
    if state in _RESETS_FAILURES:
        failures = 0
        state = None  # nothing in flight beside it
    beside = f"beside job {row.last_job_id} ({state}): overlap allow" if state else None
    entry = Entry(Logged.DISPATCHED, served, None, None, beside, True)
    merged = _coalesced(row, served, now, passed, None)
    return _moving(
        row, now, Action.DISPATCH, failures, served, None, next_slot, dst, (entry, *merged)
    )


def _coalesced(
    row: DueRow, served: datetime, now: datetime, passed: Passed | None, job_id: int | None
) -> tuple[Entry, ...]:
    count = passed(row, served, now) if passed is not None else 0
    if not count:
        return ()
    detail = f"{count} later slot(s) due by now merged into this run"
    return (Entry(Logged.COALESCED, served, job_id, REASON_MERGED, detail, new_job=job_id is None),)


def _moving(
    row: DueRow,
    now: datetime,
    action: Action,
    failures: int,
    served: datetime,
    reason: str | None,
    next_slot: NextSlot,
    dst: DstNotes | None,
    log: tuple[Entry, ...],
) -> Decision:
    """A decision that moves the row to its next slot, with the DST cases on the way."""
    assert action in _MOVES
    following = next_slot(row, now)
    if dst is not None:
        notes = dst(row, now, following)
        log += tuple(Entry(Logged(kind), at, None, kind, None) for kind, at in notes)
    return Decision(action, failures, following, reason, served, log)
