"""Recovery probes: the tick's pass over the rows that probe after a disable.

A row with ``recovery = "probe"`` that the failure limit disables gets ``probe_at`` (when
its first probe runs: the disable plus its first interval) in the disable's transaction
(:func:`arm`). Each tick then reads the probing rows (``probe_at`` set: an index) and, for
each, as :func:`scheduler._model.probes.step` says:

- a probe is due and the last job is ``aborted``: rerun the job in place (the probe), count it,
  and set ``probe_at`` to the next interval from now (decision ``probed``);
- the last job ``succeeded`` (a probe did): re-enable the row (failure count 0, next slot from
  now) and write the ``row_recovered`` alert into the row's outbox (decision ``recovered``);
  after the commit its receivers run (:func:`scheduler._store.alerts.deliver_recovered`).

Every write is a compare-and-swap on the row's version: of two ticks, one wins; the other
writes nothing, so the row recovers, and its alert is written, once.

An idle tick stays one statement: a process reads the probing rows only when it may have
something to do (:func:`wanted`): at its first tick, once the earliest ``probe_at`` it saw is
due, every :data:`WHILE_RUNNING` seconds of tick time while a probe runs (to see it succeed),
at the tick after a disable of its own, and otherwise every :data:`IDLE` seconds of real time
(the rows another process disabled).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, false, select, update

from .._model import probes as _probes
from .._model.decide import REASON_FAILURES, Logged
from .._model.rules import IN_FLIGHT, PROBE
from . import decisions as _decisions
from . import jobs as _jobs
from .alerts import Recovered, deliver_recovered
from .tables import jobs, rows

log = logging.getLogger("scheduler._tick")

JobDefaults = Callable[[str], tuple[int, str]]
AfterCommit = Callable[[Connection], None]


def arm(conn: Connection, row_id: int, now: datetime) -> datetime | None:
    """In a disable's transaction: the row's first probe, if its recovery is ``probe``."""
    found = conn.execute(
        select(rows.c.recovery, rows.c.probe_intervals).where(rows.c.id == row_id)
    ).first()
    if found is None or found.recovery != PROBE:
        return None
    at = _probes.first_probe_at(_probes.decode_intervals(found.probe_intervals), now)
    conn.execute(update(rows).where(rows.c.id == row_id).values(probe_at=at, probes=0))
    return at


_PROBING = (
    select(
        rows.c.id,
        rows.c.name,
        rows.c.version,
        rows.c.probe_at,
        rows.c.probes,
        rows.c.probe_intervals,
        rows.c.disabled_at,
        rows.c.cron,
        rows.c.timezone,
        rows.c.jitter,
        rows.c.last_job_id,
        rows.c.handler,
        rows.c.payload,
        rows.c.tenant,
    )
    .where(
        rows.c.probe_at.is_not(None),
        rows.c.enabled == false(),
        rows.c.recovery == PROBE,
        rows.c.disabled_reason == REASON_FAILURES,
    )
    .order_by(rows.c.probe_at)
)


WHILE_RUNNING = 5.0
"""Seconds of tick time between reads of the probing rows while a probe runs."""
IDLE = 60.0
"""Seconds of real (monotonic) time between reads when no probe is due or running: the
rows another process disabled are found within this."""


@dataclass
class _LastRead:
    due_at: datetime | None  # the earliest probe_at of the rows waiting for their next probe
    running_until: datetime | None  # while a probe runs: the tick instant to look again at
    monotonic: float  # when it read, for IDLE


# Per store: what its last read of the probing rows found.
_last_read: weakref.WeakKeyDictionary[object, _LastRead] = weakref.WeakKeyDictionary()


def wanted(store: object, now: datetime) -> bool:
    """Whether a tick at ``now`` reads the probing rows (see the module's doc)."""
    last = _last_read.get(store)
    if last is None:
        return True
    if last.due_at is not None and last.due_at <= now:
        return True
    if last.running_until is not None and last.running_until <= now:
        return True
    return time.monotonic() - last.monotonic >= IDLE


def soon(store: object) -> None:
    """A row of this process was disabled: read the probing rows at the next tick."""
    _last_read.pop(store, None)


class _Lost(Exception):
    """Another tick wrote the row first: this one's transaction rolls back."""


def sweep(store: object, conn: Connection, now: datetime, job_defaults: JobDefaults) -> list[str]:
    """Probe or recover each probing row that is due to; the names of the rows recovered.
    The ``row_recovered`` receivers run after each row's commit."""
    if not wanted(store, now):
        return []
    due_at: datetime | None = None
    running = False
    with conn.begin():
        found = conn.execute(_PROBING).all()
        states: dict[int, str] = {}
        ids = [r.last_job_id for r in found if r.last_job_id is not None]
        if ids:
            stmt = select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(ids))
            states = {int(i): str(s) for i, s in conn.execute(stmt)}
    recovered: list[str] = []
    for r in found:
        state = states.get(r.last_job_id) if r.last_job_id is not None else None
        step = _probes.step(state, r.probe_at, now, r.last_job_id is not None)
        if step is _probes.Step.WAIT:
            if state in IN_FLIGHT:
                running = True
            elif due_at is None or r.probe_at < due_at:
                due_at = r.probe_at
            continue
        running = running or step is _probes.Step.PROBE
        after: AfterCommit | None = None
        try:
            with conn.begin():
                if step is _probes.Step.PROBE:
                    _probe(conn, r, now, job_defaults)
                else:
                    after = _recover(conn, r, now)
        except _Lost:
            continue
        if after is not None:
            recovered.append(r.name)
            after(conn)
    again = now + timedelta(seconds=WHILE_RUNNING) if running else None
    _last_read[store] = _LastRead(due_at, again, time.monotonic())
    return recovered


def _swap(conn: Connection, r: Any, now: datetime, **values: object) -> None:
    stmt = (
        update(rows)
        .where(rows.c.id == r.id, rows.c.version == r.version)
        .values(version=rows.c.version + 1, updated_at=now, **values)
    )
    if conn.execute(stmt).rowcount != 1:
        raise _Lost


def _probe(conn: Connection, r: Any, now: datetime, job_defaults: JobDefaults) -> None:
    row = r
    count = row.probes + 1
    intervals = _probes.decode_intervals(row.probe_intervals)
    following = now + timedelta(seconds=_probes.interval(intervals, count))
    _swap(conn, row, now, probes=count, probe_at=following)
    max_attempts, queue = job_defaults(row.handler)
    reset = conn.execute(
        _jobs.RERUN_IN_PLACE,
        {
            "p_id": row.last_job_id,
            "p_max_attempts": max_attempts,
            "p_queue": queue,
            "p_handler": row.handler,
            "p_payload": row.payload,
            "p_tenant": row.tenant,
            "p_now": now,
            "p_slot": now,
            "p_traceparent": None,
        },
    )
    if reset.rowcount != 1:
        raise _Lost
    name: str = row.name
    detail = f"probe {count}; if it fails, the next at {following:%Y-%m-%d %H:%M:%S}Z"
    _decisions.record(
        conn,
        name,
        Logged.PROBED.value,
        now,
        now,
        job_id=row.last_job_id,
        reason="recovery",
        detail=detail,
    )
    log.info(
        "task %s: probe %s (job %s rerun in place)",
        name,
        count,
        row.last_job_id,
        extra={"action": "row_probed", "row": name},
    )


def _recover(conn: Connection, r: Any, now: datetime) -> AfterCommit:
    from .._model import slots as _slots

    row = r
    name: str = row.name
    disabled_at: datetime | None = row.disabled_at
    disabled = (now - disabled_at).total_seconds() if disabled_at is not None else 0.0
    probes: int = row.probes
    alert = Recovered(
        row.id,
        name,
        probes,
        disabled,
        uuid.uuid4().hex,
        now,
    )
    following = _slots.first_run(
        row.cron,
        row.timezone,
        name,
        now,
        row.jitter,
    )
    _swap(
        conn,
        row,
        now,
        enabled=True,
        disabled_reason=None,
        disabled_at=None,
        disabled_note=None,
        consecutive_failures=0,
        next_run_at=following,
        probe_at=None,
        probes=0,
        recovery_alert=json.dumps(alert.stored(), separators=(",", ":")),
    )
    _decisions.record(
        conn,
        name,
        Logged.RECOVERED.value,
        now,
        now,
        job_id=row.last_job_id,
        reason="recovery",
        detail=f"probe {probes} succeeded after {disabled:.0f} s disabled",
    )
    log.warning(
        "task %s recovered: probe %s succeeded after %.0f s disabled",
        name,
        probes,
        disabled,
        extra={"action": "row_recovered", "row": name},
    )
    return lambda after: deliver_recovered(after, alert)
