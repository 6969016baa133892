"""The portable writer: SQLAlchemy Core on every engine, each row in its own transaction.

Every write to a row is a compare-and-swap on its version; a miss means another process wrote
the row since the due query read it, and the row's transaction rolls back (``lost_race``):

- dispatch: INSERT the job, then point the row at it, moving it to its next slot (the job's
  INSERT is rolled back with the swap if the swap misses);
- rerun: the swap (failure count, next slot), then reset the aborted job to ``queued``, itself
  conditional on the job still being ``aborted``;
- disable: the swap (not enabled, why and when, the failure count, the alert's id); the alert
  goes out after the commit;
- skip, missed: the swap (the next slot); the ``slot_skipped`` signal follows the commit;
- hold back: the first tick to hold a slot back writes the swap (``held_slot``) and its log
  entry; the later ones write nothing, so no transaction at all.

Each decision's log entries (``Decision.log``: ``dispatched``, ``held_back``, ``coalesced`` ...)
are INSERTed into ``scheduler_decisions`` in the same transaction (``_store/decisions.py``).

A fresh dispatch, the tick's hot path, runs its three statements (the job's INSERT, the row's
swap, its ``dispatched`` entry) on one cursor of the driver's (``_store/driver.py``), with the
connection's cursor listeners taken once per batch; the entry takes its four values from the
dispatch's own parameters (:data:`DISPATCHED_ENTRY`). With more than one connection configured
(not on SQLite, which has one writer at a time), a batch's rows are taken in due order by
several connections on helper threads.
"""

from __future__ import annotations

import collections
import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Dialect,
    Insert,
    Update,
    bindparam,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement

from ... import signals
from ..._errors import JobStateError
from ..._model.decide import Action, Decision, Entry, Logged
from ..._model.report import Outcome
from ..._model.rows import DueRow
from .. import Store
from .. import decisions as _decisions
from .. import jobs as _jobs
from .. import locks as _locks
from .. import probes as _probes
from .. import retry as _retry
from ..alerts import Alert, cause, deliver
from ..driver import CursorEvents, Prepared, PreparedSet, cursor_events
from ..tables import decisions, jobs, rows
from .base import Carried, Decided, Done, Work

# The tick's records (a row disabled) keep the logger operators know them by.
log = logging.getLogger("scheduler._tick")

_P = bindparam

# The new job's values are _jobs.new_job_values', each a parameter named "j_" + its column.
JOB_COLUMNS: tuple[str, ...] = ("handler", "payload", "queue", "priority", "run_at", "state")
JOB_COLUMNS += ("attempts", "max_attempts", "dedupe_key", "task_name", "created_at", "tenant")
JOB_COLUMNS += ("slot", "traceparent")
JOB_PARAMS = {c: _P(f"j_{c}", type_=jobs.c[c].type) for c in JOB_COLUMNS}
_JOB_KEYS = {c: f"j_{c}" for c in JOB_COLUMNS}  # made once: a dispatch renames every column
# The row's compare-and-swap of a fresh dispatch: parameters "r_" + what they set.
SWAP_VALUES = {
    "version": rows.c.version + literal_column("1"),
    "updated_at": _P("p_now", type_=rows.c.updated_at.type),
    "consecutive_failures": _P("r_failures", type_=rows.c.consecutive_failures.type),
    "next_run_at": _P("r_next_run_at", type_=rows.c.next_run_at.type),
}
SWAP_WHERE = (
    rows.c.id == _P("r_id", type_=rows.c.id.type),
    rows.c.version == _P("r_version", type_=rows.c.version.type),
)

# PostgreSQL's drivers report no lastrowid: the INSERT returns the id there.
_RETURNS_ID = frozenset({"postgresql"})


def _insert_job(dialect: str) -> Insert:
    inserted = insert(jobs).values(JOB_PARAMS)
    return inserted.returning(jobs.c.id) if dialect in _RETURNS_ID else inserted


_INSERT_JOB = PreparedSet(_insert_job, Prepared)


def _point_row(_dialect: str) -> Update:
    return (
        update(rows)
        .where(*SWAP_WHERE)
        .values(last_job_id=_P("r_job_id", type_=rows.c.last_job_id.type), **SWAP_VALUES)
    )


_POINT_ROW = PreparedSet(_point_row, Prepared)
_RESET_JOB = _jobs.RERUN_IN_PLACE

# A fresh dispatch's own entry (``dispatched``, no reason, no detail: the tick's hot path) takes
# its values from the dispatch's parameters: the job's task and slot, the tick's now, the job id.
# It runs on the cursor of the dispatch's other statements, with four parameters, none new.
DISPATCHED_ENTRY = {
    "task_name": JOB_PARAMS["task_name"],
    "slot": JOB_PARAMS["slot"],
    "decided_at": _P("p_now", type_=decisions.c.decided_at.type),
    "decision": literal_column(f"'{Logged.DISPATCHED.value}'"),
    "job_id": _P("r_job_id", type_=decisions.c.job_id.type),
}
_LOG_DISPATCHED = PreparedSet(lambda _dialect: insert(decisions).values(DISPATCHED_ENTRY), Prepared)


def _one_query(prefix: str) -> Callable[[ClauseElement, Dialect], Prepared]:
    """A plain fresh dispatch as one query: the job's INSERT; the row's swap, pointing it at
    ``LAST_INSERT_ID()`` (the job's id, on the server); the ``dispatched`` entry copied from
    the job's row (its task, slot, creation time and id: :data:`DISPATCHED_ENTRY`'s values)."""

    def make(insert_job: ClauseElement, dialect: Dialect) -> Prepared:
        job_id = func.last_insert_id()
        point_row = update(rows).where(*SWAP_WHERE).values(last_job_id=job_id, **SWAP_VALUES)
        entry = insert(decisions).from_select(
            list(DISPATCHED_ENTRY),  # the same columns, from the job's row
            select(
                jobs.c.task_name,
                jobs.c.slot,
                jobs.c.created_at,
                literal_column(f"'{Logged.DISPATCHED.value}'"),
                jobs.c.id,
            ).where(jobs.c.id == job_id),
        )
        return Prepared.joined(
            Prepared(insert_job, dialect),
            Prepared(point_row, dialect, prefix=prefix),
            Prepared(entry, dialect),
        )

    return make


# MariaDB/MySQL through PyMySQL (Work.multi_statements): a plain fresh dispatch is one query
# (_one_query) and the COMMIT, where the log had made it four round trips and the COMMIT. On
# MariaDB (Work.nowait) the swap also refuses to wait for the row's lock (_locks.NOWAIT: error
# 1205 at once, reported ``locked``) in place of a SKIP LOCKED probe before the job's INSERT.
_POINT_ROW_NOWAIT = PreparedSet(_point_row, functools.partial(Prepared, prefix=_locks.NOWAIT))
_DISPATCH_QUERY = {
    nowait: PreparedSet(_insert_job, _one_query(_locks.NOWAIT if nowait else ""))
    for nowait in (False, True)
}

# Fewer rows than this per connection are not worth a checkout.
ROWS_PER_CONNECTION = 2


class _Rollback(Exception):
    """The row's transaction rolls back with this outcome (a compare-and-swap missed)."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


def fresh_params(row: DueRow, decision: Decision, work: Work) -> dict[str, Any]:
    """The parameters of a fresh dispatch: the new job's values and the row's swap."""
    max_attempts, queue = work.job_defaults(row.handler)
    job = _jobs.new_job_values(
        handler=row.handler,
        payload=row.payload,
        now=work.now,
        max_attempts=max_attempts,
        queue=queue,
        task_name=row.name,
    )
    keys = _JOB_KEYS
    params = {keys[column]: value for column, value in job.items()}
    params["j_tenant"] = row.tenant
    params["j_traceparent"] = work.traceparent
    params.update(
        j_slot=decision.slot if decision.slot is not None else row.next_run_at,
        p_now=work.now,
        r_id=row.id,
        r_version=row.version,
        r_failures=decision.failures,
        r_next_run_at=decision.next_run_at,
    )
    return params


def log_params(
    row: DueRow,
    decision: Decision,
    work: Work,
    job_id: int | None,
    entries: Sequence[Entry] | None = None,
) -> list[dict[str, Any]]:
    """The parameters of the decision's log entries (or of `entries`, some of them); `job_id`:
    the job it created, if any."""
    return [
        {
            "d_task_name": row.name,
            "d_slot": entry.slot,
            "d_decided_at": work.now,
            "d_decision": entry.decision.value,
            "d_job_id": job_id if entry.new_job else entry.job_id,
            "d_reason": entry.reason,
            "d_detail": None if entry.detail is None else entry.detail[:500],
        }
        for entry in (decision.log if entries is None else entries)
    ]


def _log(
    conn: Connection, row: DueRow, decision: Decision, work: Work, job_id: int | None = None
) -> None:
    if decision.log:
        _decisions.write(conn, log_params(row, decision, work, job_id))


@dataclass(frozen=True, slots=True)
class SendDispatched:
    """What follows a fresh dispatch's commit: the ``job_dispatched`` signal. Its nominal
    ``slot`` is also read by the tick, for its report (the lateness metric)."""

    row: str
    job_id: int
    slot: datetime

    def __call__(self, _conn: Connection) -> None:
        signals.send(
            signals.job_dispatched, self.row, row=self.row, job_id=self.job_id, slot=self.slot
        )


def dispatched(row: DueRow, job_id: int, slot: datetime | None = None) -> Done:
    """A fresh dispatch that committed: the ``job_dispatched`` signal follows (with the
    nominal `slot`, before jitter; the row's ``next_run_at`` when not given)."""
    return Outcome.DISPATCHED, SendDispatched(
        row.name, job_id, row.next_run_at if slot is None else slot
    )


@functools.lru_cache(maxsize=16)
def _swap_statement(keys: tuple[str, ...]) -> Any:
    return (
        update(rows)
        .where(rows.c.id == _P("p_id"), rows.c.version == _P("p_version"))
        .values(
            version=rows.c.version + 1,
            updated_at=_P("p_now"),
            **{key: _P(f"p_{key}", type_=rows.c[key].type) for key in keys},
        )
    )


def _swap(conn: Connection, row: DueRow, work: Work, **values: Any) -> None:
    """The compare-and-swap on the row's version; a miss means another process won."""
    params = {f"p_{key}": value for key, value in values.items()}
    params.update(p_id=row.id, p_version=row.version, p_now=work.now)
    if conn.execute(_swap_statement(tuple(sorted(values))), params).rowcount != 1:
        raise _Rollback(Outcome.LOST_RACE)


def _disable(conn: Connection, row: DueRow, decision: Decision, work: Work) -> Done:
    alert_id = uuid.uuid4().hex
    _swap(
        conn,
        row,
        work,
        enabled=False,
        disabled_reason=decision.reason,
        disabled_at=work.now,
        consecutive_failures=decision.failures,
        alert_id=alert_id,
    )
    code = cause(conn, row.last_job_id, row.job_error)
    log.warning(
        "task %s disabled after %s consecutive failures (last error %s)",
        row.name,
        decision.failures,
        code,
        extra={"action": "row_disabled", "row": row.name, "code": code},
    )
    assert row.last_job_id is not None  # an aborted last job is what disables a row
    alert = Alert(row.id, row.name, decision.failures, code, row.last_job_id, work.now, alert_id)
    _probes.arm(conn, row.id, work.now)  # recovery = "probe": its first probe
    _log(conn, row, decision, work)
    return Outcome.DISABLED, lambda after: deliver(after, alert)


def _rerun(conn: Connection, row: DueRow, decision: Decision, work: Work) -> Done:
    max_attempts, queue = work.job_defaults(row.handler)
    _swap(
        conn,
        row,
        work,
        consecutive_failures=decision.failures,
        next_run_at=decision.next_run_at,
    )
    reset = conn.execute(
        _RESET_JOB,
        {
            "p_id": row.last_job_id,
            "p_max_attempts": max_attempts,
            "p_queue": queue,
            "p_handler": row.handler,
            "p_payload": row.payload,
            "p_tenant": row.tenant,
            "p_now": work.now,
            "p_slot": decision.slot if decision.slot is not None else row.next_run_at,
            "p_traceparent": work.traceparent,  # the rerun's run: a child of this tick's span
        },
    )
    if reset.rowcount != 1:
        raise _Rollback(Outcome.LOST_RACE)
    _log(conn, row, decision, work)
    return Outcome.RERUN, lambda _conn: signals.send(
        signals.job_rerun,
        row.name,
        row=row.name,
        job_id=row.last_job_id,
        consecutive_failures=decision.failures,
    )


def plain_dispatched(entry: Entry, slot: datetime) -> bool:
    """Whether `entry` is a fresh dispatch's own entry as :data:`DISPATCHED_ENTRY` writes it
    (for the job's `slot`, with no reason and no detail)."""
    return (
        entry.decision is Logged.DISPATCHED
        and entry.new_job
        and entry.reason is None
        and entry.detail is None
        and entry.slot == slot
    )


def _dispatch(
    conn: Connection,
    row: DueRow,
    decision: Decision,
    work: Work,
    events: CursorEvents | None = None,
) -> Done:
    """A fresh dispatch: the job's INSERT, the row's swap, the entries; `events`: the cursor
    listeners of `conn`, taken once for the batch (else here, once for the row's statements)."""
    params = fresh_params(row, decision, work)
    if events is None:
        events = cursor_events(conn)
    log = decision.log
    plain = bool(log) and plain_dispatched(log[0], params["j_slot"])
    if plain and work.multi_statements:  # one query: the job, the swap, the entry
        results = _DISPATCH_QUERY[work.nowait].on(conn).run_all(conn, params, None, events)
        if results[1][0] != 1:
            raise _Rollback(Outcome.LOST_RACE)  # (the job and the entry go with the rollback)
        job_id = int(results[0][1])
        if len(log) > 1:
            _decisions.write(conn, log_params(row, decision, work, job_id, log[1:]))
        return dispatched(row, job_id, decision.slot)
    cursor = _INSERT_JOB.on(conn).run(conn, params, None, events)
    job_id = int(cursor.fetchone()[0] if conn.dialect.name in _RETURNS_ID else cursor.lastrowid)
    params["r_job_id"] = job_id
    point_row = _POINT_ROW_NOWAIT if work.nowait else _POINT_ROW
    if point_row.on(conn).run(conn, params, cursor, events).rowcount != 1:
        raise _Rollback(Outcome.LOST_RACE)
    if plain:
        _LOG_DISPATCHED.on(conn).run(conn, params, cursor, events)
        log = log[1:]
    if log:
        _decisions.write(conn, log_params(row, decision, work, job_id, log))
    return dispatched(row, job_id, decision.slot)


def _hold_back(conn: Connection, row: DueRow, decision: Decision, work: Work) -> Done:
    """The first hold of a slot: ``held_slot`` and its entry (later ones write nothing)."""
    _swap(conn, row, work, held_slot=decision.slot)
    _log(conn, row, decision, work)
    return Outcome.HELD_BACK, None


def skipped(row: DueRow, decision: Decision, outcome: Outcome) -> Done:
    """A slot that did not run: the ``slot_skipped`` signal follows the commit."""
    logged = Logged.SKIPPED_OVERLAP if outcome is Outcome.SKIPPED_OVERLAP else Logged.MISSED
    return outcome, lambda _conn: signals.send(
        signals.slot_skipped,
        row.name,
        slot=decision.slot if decision.slot is not None else row.next_run_at,
        decision=str(logged),
        reason=decision.reason,
    )


def _move_on(conn: Connection, row: DueRow, decision: Decision, work: Work) -> Done:
    """Skip or missed: the row moves to its next slot and nothing runs."""
    _swap(conn, row, work, next_run_at=decision.next_run_at)
    _log(conn, row, decision, work)
    outcome = Outcome.SKIPPED_OVERLAP if decision.action is Action.SKIP else Outcome.MISSED
    return skipped(row, decision, outcome)


def _replace(conn: Connection, row: DueRow, decision: Decision, work: Work) -> Done:
    """Overlap ``replace``: the slot held back (``held_slot``), its entry, and the in-flight
    job asked to cancel (a queued one ends at once; a claimed one's worker stops it)."""
    _swap(conn, row, work, held_slot=decision.slot)
    if row.last_job_id is not None:
        try:
            _jobs.cancel(conn, row.last_job_id, now=work.now)
        except JobStateError:
            pass  # it ended meanwhile: the next tick runs the slot
    _log(conn, row, decision, work)
    return Outcome.HELD_BACK, None


_WRITES = {
    Action.REPLACE: _replace,
    Action.DISABLE: _disable,
    Action.RERUN: _rerun,
    Action.DISPATCH: _dispatch,
    Action.HOLD_BACK: _hold_back,
    Action.SKIP: _move_on,
    Action.MISSED: _move_on,
}


def carry_out_row(
    conn: Connection,
    row: DueRow,
    decision: Decision,
    work: Work,
    events: CursorEvents | None = None,
) -> Done:
    """One decision in its own transaction on `conn` (a repeated hold back needs none). A row
    (or, for a rerun, its last job) that another transaction holds locked is passed over
    (``locked``), not waited for (``_store/locks.py``). `events`: `conn`'s cursor listeners
    (:func:`~scheduler._store.driver.cursor_events`), taken once for a batch's fresh
    dispatches."""
    if not decision.writes:
        return Outcome.HELD_BACK, None
    write = _WRITES.get(decision.action)
    if write is None:
        raise NotImplementedError(f"no writer writes {decision.action!r} yet")
    try:
        with conn.begin():
            if write is _dispatch:  # on MariaDB its swap takes the row's lock, or fails at once
                if work.skip_locked and not work.nowait and not _locks.take(conn, row.id):
                    raise _Rollback(Outcome.LOCKED)
                return _dispatch(conn, row, decision, work, events)
            job = row.last_job_id if decision.action is Action.RERUN else None
            if work.skip_locked and not _locks.take(conn, row.id, job):
                raise _Rollback(Outcome.LOCKED)
            return write(conn, row, decision, work)
    except _Rollback as rolled_back:
        return rolled_back.outcome, None
    except DBAPIError as exc:  # a deadlock or lock timeout: the next tick takes the row
        if _locks.timed_out(exc):
            log.debug("tick: task %s passed over, a lock wait timed out: %s", row.name, exc.orig)
            return Outcome.LOCKED, None
        if _retry.lock_conflict(exc) is None and not _locks.deadlock(exc):
            raise
        log.debug("tick: task %s lost to a lock conflict: %s", row.name, exc.orig)
        return Outcome.LOST_RACE, None


class PortableWriter:
    """SQLAlchemy Core, every engine: each row in turn on one connection, or taken in due order
    by several connections on helper threads when more than one is configured."""

    def __init__(self, *, single_writer: bool) -> None:
        self.single_writer = single_writer

    def carry_out(
        self, store: Store, conn: Connection, decided: Sequence[Decided], work: Work
    ) -> Carried:
        connections = 1 if self.single_writer or work.connections < 0 else work.connections
        lanes = min(max(connections, 1), len(decided) // ROWS_PER_CONNECTION)
        if lanes > 1:
            return _parallel(store, conn, decided, lanes, work)
        carried = Carried()
        events = cursor_events(conn)  # once for the batch: a lookup costs more than a statement
        for row, decision in decided:
            try:
                done = carried.done[row.id] = carry_out_row(conn, row, decision, work, events)
            except BaseException as exc:  # the rows before it committed: report them
                carried.failures.append(exc)
                break
            if done[0] is Outcome.LOST_RACE:
                break  # the rest of the batch is likely stale too: the tick goes elsewhere
        return carried


def _parallel(
    store: Store, conn: Connection, decided: Sequence[Decided], lanes: int, work: Work
) -> Carried:
    """Rows taken in due order by `lanes` connections (this thread runs the first on `conn`).
    A lane that fails stops; the others go on."""
    carried = Carried()
    # Each lane takes the next row when it is free, so a helper that starts late (it waits for
    # the GIL and a connection) takes fewer rows. A deque's popleft is thread-safe.
    pending = collections.deque(decided)
    lost: list[int] = []  # a lost race stops every lane: the rest is likely stale too

    def lane(lane_conn: Connection) -> None:
        events = cursor_events(lane_conn)
        while not lost:
            try:
                row, decision = pending.popleft()
            except IndexError:
                return
            done = carried.done[row.id] = carry_out_row(lane_conn, row, decision, work, events)
            if done[0] is Outcome.LOST_RACE:
                lost.append(row.id)

    def helper() -> None:
        with store.engine.connect() as helper_conn:
            lane(helper_conn)

    helpers = store.helpers(lanes - 1)
    futures = [helpers.submit(helper) for _ in range(lanes - 1)]
    try:
        lane(conn)
    except BaseException as exc:  # wait for the other lanes' commits first
        carried.failures.append(exc)
    for future in futures:
        error = future.exception()
        if error is not None:
            carried.failures.append(error)
    return carried
