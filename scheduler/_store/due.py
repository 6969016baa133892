"""Which rows are due: the tick's one read, and the typed row it returns.

The due query takes the enabled rows whose ``next_run_at <= now``, oldest first (then by id),
in bounded batches with keyset pagination, each with its last job's state. It is a read on its
own, outside any write transaction, so an idle tick costs one statement and takes no lock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Select,
    and_,
    bindparam,
    func,
    or_,
    select,
    true,
    tuple_,
    union_all,
)

from .._model.rows import DueRow, Position
from .._model.rules import CLAIMED, QUEUED
from . import Store
from .tables import jobs, rows

_P = bindparam
# Built once with bound parameters (building costs more than running on SQLite).
_DUE = (
    select(
        rows.c.id,
        rows.c.name,
        rows.c.handler,
        rows.c.payload,
        rows.c.cron,
        rows.c.timezone,
        rows.c.concurrent,
        rows.c.next_run_at,
        rows.c.last_job_id,
        rows.c.consecutive_failures,
        rows.c.max_consecutive_failures,
        rows.c.version,
        jobs.c.state.label("job_state"),
        jobs.c.last_error_code.label("job_error"),
        rows.c.overlap,
        rows.c.catchup_window,
        rows.c.jitter,
        rows.c.held_slot,
        rows.c.tenant,
    )
    .select_from(rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id))
    .where(rows.c.enabled == true(), rows.c.next_run_at <= _P("p_now"))
    .order_by(rows.c.next_run_at, rows.c.id)
    .limit(_P("p_limit", type_=Integer))
)
# The next batch: keyset pagination past the last row seen (after_at, after_id), which must
# be a range scan of the due index (enabled, next_run_at, id) from that position: a burst's
# rows share one next_run_at, and a batch that reads every due row to find its 100 makes a
# burst quadratic (issue 25: `next_run_at > :at OR (next_run_at = :at AND id > :id)` read and
# sorted them all on PostgreSQL, for every batch). Each engine gets the form it seeks on:
_AT = _P("p_after_at", type_=rows.c.next_run_at.type)  # typed: a tuple does not pass its
_ID = _P("p_after_id", type_=rows.c.id.type)  # columns' types on to its values
# PostgreSQL: a row comparison, an index condition that positions the scan.
_DUE_AFTER = _DUE.where(tuple_(rows.c.next_run_at, rows.c.id) > tuple_(_AT, _ID))
# MariaDB/MySQL: the OR form, which their range optimiser turns into two ranges of the index
# (a row comparison it does not position on: it read every entry before the batch's).
_DUE_AFTER_OR = _DUE.where(
    or_(rows.c.next_run_at > _AT, and_(rows.c.next_run_at == _AT, rows.c.id > _ID))
)


def _in_two_ranges() -> Select[Any]:
    """SQLite: the rest of `after_at`'s rows, then the later ones, each its own seek. On a row
    comparison (the id is its rowid) or the OR form, SQLite positions on ``next_run_at``
    only, and walks every entry of the burst's instant before the batch's."""
    same = _DUE.where(rows.c.next_run_at == _AT, rows.c.id > _ID).subquery()
    later = _DUE.where(rows.c.next_run_at > _AT).subquery()
    both = union_all(select(same), select(later)).subquery()
    return select(both).order_by(both.c.next_run_at, both.c.id).limit(_P("p_limit", type_=Integer))


_DUE_AFTER_TWO = _in_two_ranges()
_KEYSET = {"postgresql": _DUE_AFTER, "mysql": _DUE_AFTER_OR, "mariadb": _DUE_AFTER_OR}
_LAST_ID = select(func.max(rows.c.id))


def due(
    store: Store, conn: Connection, now: datetime, limit: int, after: Position | None
) -> list[DueRow]:
    """Up to `limit` due rows, in due order, past `after` (from the first if None)."""
    params: dict[str, Any] = {"p_now": now, "p_limit": limit}
    if after is None:
        found = store.read_rows(conn, _DUE, params)
    else:
        params.update(p_after_at=after[0], p_after_id=after[1])
        found = store.read_rows(conn, _KEYSET.get(store.caps.dialect, _DUE_AFTER_TWO), params)
    return [DueRow._make(row) for row in found]


def last_id(store: Store, conn: Connection) -> int:
    """The highest row id (0 with no rows): the range a tick picks a fresh position in."""
    [(found,)] = store.read_rows(conn, _LAST_ID, {})
    return int(found or 0)


def next_event(conn: Connection, after: datetime) -> datetime | None:
    """The earliest instant after ``after`` at which a tick or a worker has something to do:
    a row due, a job ready (a retry's back-off ends), a lease that expires
    (``scheduler.testing.drive`` jumps its clock there)."""
    due_at = select(func.min(rows.c.next_run_at)).where(
        rows.c.enabled == true(), rows.c.next_run_at > after
    )
    ready = select(func.min(jobs.c.run_at)).where(jobs.c.state == QUEUED, jobs.c.run_at > after)
    lease = select(func.min(jobs.c.lease_expires_at)).where(
        jobs.c.state == CLAIMED, jobs.c.lease_expires_at > after
    )
    found = conn.execute(
        select(due_at.scalar_subquery(), ready.scalar_subquery(), lease.scalar_subquery())
    ).one()
    times = [t for t in found if t is not None]
    return min(times) if times else None
