"""The decision log (``scheduler_decisions``): one entry per slot and outcome of a row.

Users read it in docs/howto/why-didnt-my-task-run.md.

The tick's entries are written by the decision writers (``scheduler/_store/writers/``) in the
transaction that carries the decision out, on the driver's cursor: a fresh dispatch's own
``dispatched`` entry through a statement of four parameters taken from the dispatch's
(``portable.DISPATCHED_ENTRY``; on PostgreSQL a CTE of the dispatch's one statement), the tick's
other entries through :data:`INSERT`. The operators' entries (``paused`` at enable, ``triggered``,
``disabled`` by hand) go through :func:`record` in the operator's transaction. :func:`recent` reads
a row's newest entries (explain, the dashboard); :func:`purge` drops the entries older than the
jobs' retention (by id range: no index on the entries' time, which every entry would pay for).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, func, insert, select

from . import partitions as _partitions
from .driver import Prepared, PreparedSet
from .tables import decisions

_P = bindparam
COLUMNS = ("task_name", "slot", "decided_at", "decision", "job_id", "reason", "detail")
PARAMS = {c: _P(f"d_{c}", type_=decisions.c[c].type) for c in COLUMNS}
"""The entry's values as parameters named ``d_`` + its column."""

INSERT = PreparedSet(lambda _dialect: insert(decisions).values(PARAMS), Prepared)
"""One entry, on the driver's cursor (``_store/driver.py``)."""

_RECENT = (
    select(decisions)
    .where(decisions.c.task_name == _P("p_name"))
    .order_by(decisions.c.id.desc())
    .limit(_P("p_limit"))
)


def entry_params(
    task_name: str,
    decision: str,
    slot: datetime | None,
    decided_at: datetime,
    job_id: int | None = None,
    reason: str | None = None,
    detail: str | None = None,
) -> dict[str, Any]:
    """The parameters of :data:`INSERT` for one entry (`detail` cut to its column)."""
    return {
        "d_task_name": task_name,
        "d_slot": slot,
        "d_decided_at": decided_at,
        "d_decision": str(decision),
        "d_job_id": job_id,
        "d_reason": reason,
        "d_detail": None if detail is None else detail[:500],
    }


def write(conn: Connection, entries: Iterable[dict[str, Any]]) -> None:
    """Write `entries` (:func:`entry_params`) in `conn`'s transaction."""
    prepared = INSERT.on(conn)
    for params in entries:
        prepared.run(conn, params)


def record(
    conn: Connection,
    task_name: str,
    decision: str,
    slot: datetime | None,
    decided_at: datetime,
    **kw: Any,
) -> None:
    """One entry, outside the tick (an operator's transaction)."""
    write(conn, [entry_params(task_name, decision, slot, decided_at, **kw)])


def recent(conn: Connection, task_name: str, limit: int = 20) -> list[dict[str, Any]]:
    """The row's newest `limit` entries, newest first (through its index on (task, id))."""
    found = conn.execute(_RECENT, {"p_name": task_name, "p_limit": limit})
    return [{key: value for key, value in r._mapping.items() if key != "task_name"} for r in found]


def purge(conn: Connection, *, before: datetime) -> int:
    """Delete the entries decided before `before`; how many.

    There is no index on ``decided_at`` (revision 0006: the tick would pay for it on every
    entry). Entries are written in id order, each at its writer's "now", so their times grow
    with their ids: the first id decided at or after `before` is found by bisection on the
    primary key (about log2(ids) lookups), and the ids below it are deleted if they are older
    than `before`. An entry whose time is out of that order (a clock set back, a tick given
    an earlier ``now``) is never deleted early: at worst it stays until a later purge.

    Where the log is partitioned by day (PostgreSQL), this is the default partition's purge
    (it holds few entries: a day partition's go with it, ``_store/partitions.py``)."""
    log = _partitions.default_partition(conn, decisions)
    first_at = select(log.c.decided_at).where(log.c.id >= _P("p_id")).order_by(log.c.id).limit(1)
    low, high = conn.execute(select(func.min(log.c.id), func.max(log.c.id))).one()
    if low is None:
        return 0
    high += 1  # the cut is in [low, high]: high when every entry is older than `before`
    while low < high:
        middle = (low + high) // 2
        at = conn.execute(first_at, {"p_id": middle}).scalar_one()
        if at < before:
            low = middle + 1
        else:
            high = middle
    done = conn.execute(delete(log).where(log.c.id < low, log.c.decided_at < before))
    return int(done.rowcount or 0)
