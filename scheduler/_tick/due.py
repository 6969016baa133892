"""Which rows are due: the tick's one read, and the typed row it returns.

The due query takes the enabled rows whose ``next_run_at <= now``, oldest first (then by id),
in bounded batches with keyset pagination, each with its last job's state. It is a read on its
own, outside any write transaction, so an idle tick costs one statement and takes no lock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, Integer, and_, bindparam, func, or_, select, true

from .._store import Store
from .._store.tables import jobs, rows


class DueRow(NamedTuple):
    """One due scheduler row as the due query read it, with its last job's state."""

    id: int
    name: str
    handler: str
    payload: str
    """The stored payload text, copied as it is into the job the row dispatches."""
    cron: str
    timezone: str
    concurrent: bool
    next_run_at: datetime
    """The slot being served (the row's ``next_run_at`` when read)."""
    last_job_id: int | None
    consecutive_failures: int
    max_consecutive_failures: int | None
    version: int
    """The compare-and-swap token: every write to the row bumps it."""
    job_state: str | None
    """The last job's state (a :class:`~scheduler._store.tables.JobState` value), None if none."""
    job_error: str | None
    """The last job's ``last_error_code``."""
    tenant: str | None = None
    """The row's tenant, copied into the jobs it dispatches (and reruns)."""


Position = tuple[datetime, int]
"""Where a batch ended, in due order: (``next_run_at``, id)."""

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
        rows.c.tenant,
    )
    .select_from(rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id))
    .where(rows.c.enabled == true(), rows.c.next_run_at <= _P("p_now"))
    .order_by(rows.c.next_run_at, rows.c.id)
    .limit(_P("p_limit", type_=Integer))
)
_DUE_AFTER = _DUE.where(  # the next batch: keyset pagination past the last row seen
    or_(
        rows.c.next_run_at > _P("p_after_at"),
        and_(rows.c.next_run_at == _P("p_after_at"), rows.c.id > _P("p_after_id")),
    )
)
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
        found = store.read_rows(conn, _DUE_AFTER, params)
    return [DueRow._make(row) for row in found]


def last_id(store: Store, conn: Connection) -> int:
    """The highest row id (0 with no rows): the range a tick picks a fresh position in."""
    [(found,)] = store.read_rows(conn, _LAST_ID, {})
    return int(found or 0)
