"""The tick, one way through: read the due rows from the store, decide each one and compute
its slots in the model, write the decisions through the store, report.

Per batch: the due query (``scheduler/_store/due.py``), one :func:`~scheduler._model.decide.decide`
per row (the rules live there; the slots are ``scheduler/_model/slots.py``'s), then the engine's
decision writer (``scheduler/_store/writers/``) writes the decisions, each row in its own
transaction. The outcomes are reported, and the signals sent, in due order once the batch is carried
out; an error is raised after what committed has been reported.

Several processes may tick at once. A row another process dispatched first is lost by this
one (``lost_race``: its snapshot is stale, the compare-and-swap misses, nothing is written).
So that the ticks divide a large set of due rows instead of racing for the same ones, a tick
that lost a race goes on from a random position among the due rows (and comes back for the
rows before it): two ticks that met part again. Without a lost race, the rows are taken
oldest ``next_run_at`` first, then by id.

A row another transaction holds locked (an operator's open ``UPDATE``, a migration) is passed over
without waiting (``locked``, ``scheduler/_store/locks.py``): it stays due, the tick goes on with the
others, and the next tick looks at it again.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from datetime import datetime
from typing import Any

from ._model.decide import Action, decide
from ._model.report import Outcome, TickReport
from ._model.rows import DueRow, Position
from ._model.slots import dst_cases, next_slot, nominal_slot, passed
from ._observe import tracing as _tracing
from ._store import Connection, Store
from ._store import probes as _probes
from ._store import wakeup as _wakeup
from ._store.due import due, last_id
from ._store.writers import Carried, Decided, JobDefaults, Work, Writer, writer_for
from ._store.writers.portable import SendDispatched

log = logging.getLogger("scheduler._tick")  # every record of the tick, whichever module

_random = random.Random()  # where a tick that met another goes on; not a secret
_CREATES = (Action.DISPATCH, Action.RERUN)  # the decisions that queue a job (a traced tick's)


def tick(
    store: Store,
    *,
    now: datetime,
    max_consecutive_failures: int,
    batch_size: int,
    job_defaults: JobDefaults,
    connections: int = 0,
) -> TickReport:
    """Run one tick over every due row, in bounded batches (under a span when traced and it
    dispatches or reruns: _tracing.TickTrace)."""
    report = TickReport()
    trace = _tracing.TickTrace()
    try:
        _tick(
            store,
            now,
            max_consecutive_failures,
            batch_size,
            job_defaults,
            connections,
            report,
            trace,
        )
    except BaseException as exc:
        trace.end(report, exc)
        raise
    trace.end(report)
    return report


def _tick(
    store: Store,
    now: datetime,
    max_consecutive_failures: int,
    batch_size: int,
    job_defaults: JobDefaults,
    connections: int,
    report: TickReport,
    trace: _tracing.TickTrace,
) -> None:
    after: Position | None = None
    seen: set[int] = set()  # the rows decided in this tick, not decided again after a jump
    jumped = owed = False  # owed: a jump skipped rows; read from the first once past the last
    # One connection reads each batch, runs its rows (or the first lane of them) and sends the
    # signals: a checkout costs a round trip where the pool pings (PostgreSQL, MariaDB).
    with store.engine.connect() as conn:
        writer = writer_for(store)  # after the connect: Citus is known from it
        work = Work(  # after the connect: MariaDB's SKIP LOCKED is known from it
            now=now,
            job_defaults=job_defaults,
            connections=connections,
            skip_locked=store.caps.skip_locked,
            nowait=store.caps.nowait,
            multi_statements=store.caps.multi_statements,
        )
        while True:
            batch = due(store, conn, now, batch_size, after)
            todo = [row for row in batch if row.id not in seen] if jumped else batch
            lost = _carry_out(
                store, conn, todo, max_consecutive_failures, writer, work, report, seen, trace
            )
            if lost:  # another tick is on these rows: go on from a random position
                top = last_id(store, conn)
                after = (batch[0].next_run_at, _random.randint(batch[0].id, max(top, batch[0].id)))
                jumped = owed = True
            elif len(batch) < batch_size:
                if not owed:
                    break
                after, owed = None, False  # back for the rows the jump skipped
            else:
                after = (batch[-1].next_run_at, batch[-1].id)
        # The rows disabled by the failure limit that probe (recovery = "probe"): one read of
        # an index when one may be due, and a write for each one whose probe is due or
        # succeeded.
        if report.disabled:  # perhaps a row that probes: its first probe is to be read
            _probes.soon(store)
        try:
            report.recovered.extend(_probes.sweep(store, conn, now, job_defaults))
        except Exception as exc:  # the due rows are done: a probe waits for the next tick
            if conn.in_transaction():
                conn.rollback()
            log.warning("tick: could not run the recovery probes: %s", exc)


def _carry_out(
    store: Store,
    conn: Connection,
    batch: list[DueRow],
    max_consecutive_failures: int,
    writer: Writer,
    work: Work,
    report: TickReport,
    seen: set[int],
    trace: _tracing.TickTrace,
) -> int:
    """Decide each row, have the writer write the decisions, report the outcomes (adding
    the rows carried out to `seen`); the number of races lost. A writer stops a batch at
    its first lost race: the rows it did not get to stay due, for later in the tick."""
    if not batch:
        return 0
    decided: list[Decided] = []
    failure: BaseException | None = None
    # A burst's rows share their slot and their schedule: equal instants are made one object
    # (the driver converts a parameter once per object), and whether later slots passed is
    # worked out once per schedule and slot.
    instants: dict[datetime, datetime] = {}
    merged: dict[tuple[str, ...] | tuple[str, str, datetime, int], int] = {}

    def passed_once(row: DueRow, slot: datetime, now: datetime) -> int:
        key: Any = (row.cron, row.timezone, slot, row.jitter)
        if row.jitter or "h" in row.cron or "H" in row.cron:  # drawn from the name
            key = (*key, row.name)
        found = merged.get(key)
        if found is None:
            found = merged[key] = passed(row, slot, now)
        return found

    for row in batch:
        try:
            served = nominal_slot(row) if row.jitter else row.next_run_at
            decision = decide(
                row,
                work.now,
                max_consecutive_failures=max_consecutive_failures,
                next_slot=next_slot,
                slot=instants.setdefault(served, served),
                passed=passed_once,
                dst=dst_cases,
            )
        except Exception as exc:  # carry out the rows before it, then raise
            failure = exc
            break
        decided.append((row, decision))
    if trace.wanted and any(d.action in _CREATES for _, d in decided):
        work = dataclasses.replace(work, traceparent=trace.begin())  # the jobs carry the span
    carried = writer.carry_out(store, conn, decided, work) if decided else Carried()
    _announce(store, conn, batch, carried, work)
    if failure is not None:
        carried.failures.append(failure)
    seen.update(carried.done)
    return _settle(conn, batch, carried, report)


_READY = (Outcome.DISPATCHED, Outcome.RERUN)


def _announce(
    store: Store, conn: Connection, batch: list[DueRow], carried: Carried, work: Work
) -> None:
    """Wake the workers for the jobs this batch dispatched or reran: one announcement for the
    batch, after its rows' commits (each row is its own transaction; none of a rolled-back row
    is announced). A failure to announce costs the workers' poll interval, never the tick."""
    ready: list[_wakeup.Ready] = []
    for row in batch:
        done = carried.done.get(row.id)
        if done is not None and done[0] in _READY:
            ready.append((work.job_defaults(row.handler)[1], work.now))  # the job's run_at
    if not ready:
        return
    try:
        _wakeup.announce(store, conn, ready)
    except Exception as exc:
        if conn.in_transaction():
            conn.rollback()
        log.warning("tick: could not announce %s new job(s): %s", len(ready), exc)


def _settle(conn: Connection, rows: list[DueRow], carried: Carried, report: TickReport) -> int:
    """Report what was done (and send its signals) in due order, then raise the first failure:
    what committed is reported even when another row failed. Returns the races lost."""
    lost = 0
    debug = log.isEnabledFor(logging.DEBUG)  # once per batch: the record's extra costs a dict
    for row in rows:
        done = carried.done.get(row.id)
        if done is None:
            continue
        outcome, after_commit = done
        lost += outcome is Outcome.LOST_RACE
        report.add(outcome, row.name)
        if debug:
            log.debug(
                "tick: task %s %s",
                row.name,
                outcome,
                extra={"action": f"row_{outcome}", "row": row.name},
            )
        if after_commit is not None:
            if isinstance(after_commit, SendDispatched):
                report.dispatched_slots.append(after_commit.slot)
            after_commit(conn)
    if carried.failures:
        raise carried.failures[0]
    return lost
