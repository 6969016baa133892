"""The tick's rule for one due row (scheduler/_tick/decide.py), on its own: no database, no
clock. A table of every case, then hypothesis over any row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler._model.decide import REASON_FAILURES, REASON_IN_FLIGHT, Action, Logged, decide
from scheduler._model.rows import DueRow
from scheduler._model.rules import JobState
from scheduler._model.slots import next_slot as cron_next_slot

NOW = datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC)
NEXT = datetime(2030, 1, 1, 13, 0, tzinfo=UTC)


def row(
    state: str | None,
    *,
    concurrent: bool = False,
    failures: int = 0,
    limit: int | None = None,
) -> DueRow:
    return DueRow(
        id=7,
        name="r",
        handler="h",
        payload="{}",
        cron="0 * * * *",
        timezone="UTC",
        concurrent=concurrent,
        next_run_at=datetime(2030, 1, 1, 12, 0, tzinfo=UTC),
        last_job_id=None if state is None else 41,
        consecutive_failures=failures,
        max_consecutive_failures=limit,
        version=3,
        job_state=state,
        job_error="boom" if state == "aborted" else None,
    )


def fixed_slot(_row: DueRow, _now: datetime) -> datetime:
    return NEXT


def no_slot(_row: DueRow, _now: datetime) -> datetime:
    raise AssertionError("a row that does not move needs no next slot")


Q, C, S, A = "queued", "claimed", "succeeded", "aborted"
DISPATCH, RERUN, HOLD, DISABLE = Action.DISPATCH, Action.RERUN, Action.HOLD_BACK, Action.DISABLE

# (last job's state, concurrent, consecutive failures, row's limit, global limit)
#   -> (action, failures written, moves to the next slot, reason)
CASES = [
    # no job yet, or the last one succeeded: a fresh dispatch, the failure count reset
    ((None, False, 0, None, 3), (DISPATCH, 0, True, None)),
    ((None, True, 2, None, 3), (DISPATCH, 0, True, None)),
    ((S, False, 0, None, 3), (DISPATCH, 0, True, None)),
    ((S, False, 2, None, 3), (DISPATCH, 0, True, None)),
    ((S, True, 5, 1, 0), (DISPATCH, 0, True, None)),
    # in flight, not concurrent: held back, nothing moves
    ((Q, False, 0, None, 3), (HOLD, 0, False, REASON_IN_FLIGHT)),
    ((C, False, 2, None, 3), (HOLD, 2, False, REASON_IN_FLIGHT)),
    ((Q, False, 9, 1, 1), (HOLD, 9, False, REASON_IN_FLIGHT)),
    # in flight, concurrent: a fresh dispatch beside it; a failure streak is kept
    ((Q, True, 0, None, 3), (DISPATCH, 0, True, None)),
    ((C, True, 2, None, 3), (DISPATCH, 2, True, None)),
    # aborted: one more failure, then rerun in place or disable at the limit
    ((A, False, 0, None, 3), (RERUN, 1, True, None)),
    ((A, False, 1, None, 3), (RERUN, 2, True, None)),
    ((A, False, 2, None, 3), (DISABLE, 3, False, REASON_FAILURES)),
    ((A, False, 7, None, 3), (DISABLE, 8, False, REASON_FAILURES)),  # past the limit already
    ((A, True, 2, None, 3), (DISABLE, 3, False, REASON_FAILURES)),  # checked before the gate
    ((A, True, 0, None, 3), (RERUN, 1, True, None)),
    # the row's own limit wins over the global one, in both directions
    ((A, False, 0, 1, 3), (DISABLE, 1, False, REASON_FAILURES)),
    ((A, False, 2, 5, 3), (RERUN, 3, True, None)),
    ((A, False, 0, 1, 0), (DISABLE, 1, False, REASON_FAILURES)),
    # 0 means no limit: the row's own 0 too, even when the global limit is set
    ((A, False, 99, None, 0), (RERUN, 100, True, None)),
    ((A, False, 99, 0, 3), (RERUN, 100, True, None)),
]


@pytest.mark.parametrize(("given_", "expected"), CASES, ids=[str(c[0]) for c in CASES])
def test_every_case_of_the_rule(
    given_: tuple[str | None, bool, int, int | None, int],
    expected: tuple[Action, int, bool, str | None],
) -> None:
    state, concurrent, failures, limit, global_limit = given_
    action, written, moves, reason = expected
    slot = fixed_slot if moves else no_slot
    decision = decide(
        row(state, concurrent=concurrent, failures=failures, limit=limit),
        NOW,
        max_consecutive_failures=global_limit,
        next_slot=slot,
    )
    got = (decision.action, decision.failures, decision.next_run_at, decision.reason)
    assert got == (action, written, NEXT if moves else None, reason)
    assert decision.slot == row(state).next_run_at  # the nominal slot served


def test_the_next_slot_is_the_first_cron_slot_after_now() -> None:
    """Missed slots coalesce: a row due since 09:00 that fires at 12:00:30 moves to 13:00."""
    late = row(None)._replace(next_run_at=datetime(2030, 1, 1, 9, 0, tzinfo=UTC))
    decision = decide(late, NOW, max_consecutive_failures=3, next_slot=cron_next_slot)
    assert decision.next_run_at == NEXT
    on_the_slot = decide(
        late,
        datetime(2030, 1, 1, 13, 0, tzinfo=UTC),
        max_consecutive_failures=3,
        next_slot=cron_next_slot,
    )
    assert on_the_slot.next_run_at == datetime(2030, 1, 1, 14, 0, tzinfo=UTC)


def test_job_states_compare_as_the_strings_the_column_holds() -> None:
    assert [s.value for s in JobState] == [Q, C, S, A]
    assert JobState.ABORTED == A and A in {JobState.ABORTED}
    assert decide(row(JobState.QUEUED), NOW, max_consecutive_failures=3, next_slot=no_slot) == (
        decide(row(Q), NOW, max_consecutive_failures=3, next_slot=no_slot)
    )


rows_ = st.builds(
    row,
    st.sampled_from([None, Q, C, S, A]),
    concurrent=st.booleans(),
    failures=st.integers(0, 1000),
    limit=st.none() | st.integers(0, 1000),
)
nows = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@given(rows_, nows, st.integers(0, 1000))
def test_the_rule_over_any_row(due_row: DueRow, now: datetime, global_limit: int) -> None:
    """Independent statements of the rule, checked on any row, any time, any limit."""
    asked: list[datetime] = []

    def slot(r: DueRow, at: datetime) -> datetime:
        assert r is due_row
        asked.append(at)
        return at + timedelta(minutes=1)

    d = decide(due_row, now, max_consecutive_failures=global_limit, next_slot=slot)
    assert d == decide(due_row, now, max_consecutive_failures=global_limit, next_slot=slot)
    limit = (
        global_limit
        if due_row.max_consecutive_failures is None
        else due_row.max_consecutive_failures
    )
    aborted = due_row.job_state == A
    in_flight = due_row.job_state in (Q, C)
    # the action
    if aborted:
        assert d.action in (RERUN, DISABLE)
        assert d.failures == due_row.consecutive_failures + 1
        assert (d.action is DISABLE) == (limit > 0 and d.failures >= limit)
    elif in_flight and not due_row.concurrent:
        assert d.action is HOLD
        assert d.failures == due_row.consecutive_failures
    else:
        assert d.action is DISPATCH
        kept = in_flight  # a concurrent row's streak goes on while its last job runs
        assert d.failures == (due_row.consecutive_failures if kept else 0)
    # it moves to the next slot after now exactly when it runs, and asks for it only then
    if d.action in (DISPATCH, RERUN):
        assert d.next_run_at == now + timedelta(minutes=1) and asked[-1] == now
    else:
        assert d.next_run_at is None
    assert len(asked) == (2 if d.action in (DISPATCH, RERUN) else 0)
    assert (d.reason is not None) == (d.action in (DISABLE, HOLD))
    assert d.action in (DISPATCH, RERUN, HOLD, DISABLE)  # no skip/missed without the policies


# --- the run policies and the log entries ---------------------------------------------------
SLOT = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
FIRST_ENTRY = {
    Action.DISPATCH: Logged.DISPATCHED,
    Action.RERUN: Logged.RERUN,
    Action.HOLD_BACK: Logged.HELD_BACK,
    Action.DISABLE: Logged.DISABLED,
    Action.SKIP: Logged.SKIPPED_OVERLAP,
    Action.MISSED: Logged.MISSED,
}


def policy_row(state: str | None, **policies: Any) -> DueRow:
    return row(state)._replace(**policies)


POLICY_CASES = [
    # (state, policies) -> (action, first entry's job id, moves)
    ((Q, {"overlap": "skip"}), (Action.SKIP, 41, True)),
    ((C, {"overlap": "skip"}), (Action.SKIP, 41, True)),
    ((S, {"overlap": "skip"}), (DISPATCH, None, True)),
    ((Q, {"overlap": "allow"}), (DISPATCH, None, True)),
    ((Q, {"overlap": "hold"}), (HOLD, 41, False)),
    ((A, {"overlap": "skip"}), (RERUN, 41, True)),  # aborted comes before the gate
    # 30 s late: within a 60 s window it runs, past a 10 s window it is missed, whatever the job
    ((None, {"catchup_window": 60}), (DISPATCH, None, True)),
    ((None, {"catchup_window": 10}), (Action.MISSED, None, True)),
    ((Q, {"catchup_window": 10}), (Action.MISSED, None, True)),
    ((A, {"catchup_window": 10}), (Action.MISSED, None, True)),
]


@pytest.mark.parametrize(
    ("given_", "expected"), POLICY_CASES, ids=[str(c[0]) for c in POLICY_CASES]
)
def test_every_case_of_the_policies(
    given_: tuple[str | None, dict[str, Any]], expected: tuple[Action, int | None, bool]
) -> None:
    state, policies = given_
    action, job_id, moves = expected
    d = decide(
        policy_row(state, **policies),
        NOW,
        max_consecutive_failures=3,
        next_slot=fixed_slot if moves else no_slot,
    )
    assert (d.action, d.next_run_at) == (action, NEXT if moves else None)
    assert d.log[0].decision is FIRST_ENTRY[action] and d.log[0].slot == SLOT
    assert d.log[0].job_id == job_id
    assert d.log[0].new_job is (action is DISPATCH)


def test_a_held_back_slot_is_logged_once() -> None:
    first = decide(row(Q), NOW, max_consecutive_failures=3, next_slot=no_slot)
    assert [e.decision for e in first.log] == [Logged.HELD_BACK] and first.writes
    again = decide(
        row(Q)._replace(held_slot=SLOT), NOW, max_consecutive_failures=3, next_slot=no_slot
    )
    assert again.action is HOLD and again.log == () and not again.writes
    newer = decide(
        row(Q)._replace(held_slot=SLOT - timedelta(hours=1)),
        NOW,
        max_consecutive_failures=3,
        next_slot=no_slot,
    )
    assert newer.writes


def test_coalesced_slots_and_dst_cases_join_the_entries() -> None:
    moved = datetime(2030, 1, 1, 14, 0, tzinfo=UTC)
    d = decide(
        row(S),
        NOW,
        max_consecutive_failures=3,
        next_slot=fixed_slot,
        passed=lambda _r, served, now: 2 if (served, now) == (SLOT, NOW) else 0,
        dst=lambda _r, now, following: (("dst_gap", following),),
    )
    assert [(e.decision, e.slot) for e in d.log] == [
        (Logged.DISPATCHED, SLOT),
        (Logged.COALESCED, SLOT),
        (Logged.DST_GAP, NEXT),
    ]
    assert d.log[1].detail is not None and d.log[1].detail.startswith("2 later slot(s)")
    assert d.log[1].new_job and moved > NEXT
    # the nominal slot given (a jittered row) is the one logged
    jittered = decide(
        row(S), NOW, max_consecutive_failures=3, next_slot=fixed_slot, slot=SLOT - timedelta(1)
    )
    assert jittered.slot == jittered.log[0].slot == SLOT - timedelta(1)


@given(
    rows_,
    nows,
    st.sampled_from(["hold", "skip", "allow"]),
    st.integers(0, 10**6),
    st.booleans(),
    st.integers(0, 5),
)
def test_the_policies_over_any_row(
    due_row: DueRow, now: datetime, overlap: str, window: int, held: bool, merged: int
) -> None:
    due_at = min(due_row.next_run_at, now)  # a due row
    due_row = due_row._replace(
        overlap=overlap,
        catchup_window=window,
        held_slot=due_at if held else None,
        next_run_at=due_at,
    )
    d = decide(
        due_row,
        now,
        max_consecutive_failures=3,
        next_slot=lambda _r, at: at + timedelta(minutes=1),
        passed=lambda *_a: merged,
    )
    late = (now - due_row.next_run_at).total_seconds()
    in_flight = due_row.job_state in (Q, C)
    effective = "allow" if due_row.concurrent else overlap
    if window and late > window:
        assert d.action is Action.MISSED
    elif due_row.job_state == A:
        assert d.action in (RERUN, DISABLE)
    elif in_flight and effective == "skip":
        assert d.action is Action.SKIP
    elif in_flight and effective == "hold":
        assert d.action is HOLD
        assert (d.log == ()) is held  # once per slot
    else:
        assert d.action is DISPATCH
    assert (d.next_run_at is not None) == (d.action not in (HOLD, DISABLE))
    if d.writes:
        assert d.log[0].decision is FIRST_ENTRY[d.action]
        assert all(e.slot == due_row.next_run_at for e in d.log)
        coalesced = [e for e in d.log if e.decision is Logged.COALESCED]
        assert len(coalesced) == (1 if merged and d.action in (DISPATCH, RERUN) else 0)
    assert d.slot == due_row.next_run_at


@pytest.mark.parametrize("state", [Q, C])
def test_overlap_replace_asks_the_in_flight_job_to_cancel_once_per_slot(state: str) -> None:
    replacing = row(state)._replace(overlap="replace")
    first = decide(replacing, NOW, max_consecutive_failures=3, next_slot=no_slot)
    assert first.action is Action.REPLACE and first.next_run_at is None  # held until it stops
    [entry] = first.log
    assert (entry.decision, entry.job_id) == (Logged.REPLACED, 41)
    assert entry.detail == f"job 41 ({state}) cancelled to run this slot once it stops"
    again = replacing._replace(held_slot=replacing.next_run_at)
    later = decide(again, NOW, max_consecutive_failures=3, next_slot=no_slot)
    assert later.action is Action.HOLD_BACK and not later.writes  # asked already
    stopped = replacing._replace(job_state=A, job_error="cancelled")
    after = decide(stopped, NOW, max_consecutive_failures=3, next_slot=fixed_slot)
    assert after.action is Action.RERUN and after.failures == 0  # runs; not a failure
