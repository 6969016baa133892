"""The PostgreSQL writer (psycopg): a fresh dispatch is one statement, and a batch's fresh
dispatches run at once over several connections.

The statement is a data-modifying CTE: the row's compare-and-swap takes the new job's id from
the jobs' sequence, and the job's INSERT and its ``dispatched`` log entry run only for the row
it returns (none if the swap missed: ``lost_race``). One statement is one round trip, and it
is its own transaction (the driver's implicit one, committed at once). Run one after another,
every row would wait for its commit's WAL flush; run on several connections at once
(``pipeline.py``), the commits that wait together share a flush.

The other decisions (rerun, disable, the first hold back of a slot, skip, missed), and a
dispatch with more entries than its ``dispatched`` one (``coalesced``, a DST case), are few;
they go through the portable writes, one by one on the tick's connection, before the fresh
dispatches are sent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    case,
    exists,
    func,
    insert,
    literal_column,
    null,
    select,
    update,
)
from sqlalchemy.sql import ClauseElement

from ..._model.decide import Action, Decision, Logged
from ..._model.report import Outcome
from ..._model.rows import DueRow
from .. import Store
from .. import decisions as _decisions
from ..driver import PreparedSet
from ..pipeline import UNSENT, Spread
from ..tables import decisions, jobs, rows
from .base import Carried, Decided, Work
from .portable import (
    DISPATCHED_ENTRY,
    JOB_COLUMNS,
    JOB_PARAMS,
    ROWS_PER_CONNECTION,
    SWAP_VALUES,
    SWAP_WHERE,
    carry_out_row,
    dispatched,
    fresh_params,
)

log = logging.getLogger(__name__)

DEFAULT_CONNECTIONS = 4
"""Connections a batch's fresh dispatches are spread over unless configured."""


LOCKED_ROW = -1
"""What the dispatch statement returns for a row another transaction holds locked."""


def build_dispatch(_dialect: str) -> ClauseElement:
    """The one-statement fresh dispatch: lock the row unless someone else holds it (``SKIP
    LOCKED``: never wait), compare-and-swap, then INSERT for the row it returns. Returns the
    new job's id; NULL when the swap missed (a lost race); ``LOCKED_ROW`` when the row was
    locked by another transaction (passed over)."""
    sequence: Any = literal_column("pg_get_serial_sequence('scheduler_jobs', 'id')")
    mine = select(rows.c.id).where(SWAP_WHERE[0]).with_for_update(skip_locked=True).cte("mine")
    swapped = (
        update(rows)
        .where(*SWAP_WHERE, rows.c.id.in_(select(mine.c.id)))
        .values(last_job_id=func.nextval(sequence), **SWAP_VALUES)
        .returning(rows.c.last_job_id)
        .cte("swapped")
    )
    # The entry takes the job's task and slot and the swap's now from the dispatch's own
    # parameters (as the portable DISPATCHED_ENTRY does); only its detail is a parameter of its
    # own (the job it runs beside, under overlap allow).
    entry = {
        **DISPATCHED_ENTRY,
        "job_id": swapped.c.last_job_id,
        "reason": null(),
        "detail": bindparam("d_detail", type_=decisions.c.detail.type),
    }
    logged = (
        insert(decisions)
        .from_select(list(_decisions.COLUMNS), select(*(entry[c] for c in _decisions.COLUMNS)))
        .cte("logged")
    )
    source = select(swapped.c.last_job_id, *(JOB_PARAMS[c] for c in JOB_COLUMNS))
    columns = [jobs.c.id, *(jobs.c[c] for c in JOB_COLUMNS)]
    inserted = insert(jobs).from_select(columns, source).returning(jobs.c.id).cte("inserted")
    passed_over = case((exists(select(mine.c.id)), null()), else_=literal_column(str(LOCKED_ROW)))
    # Every data-modifying CTE runs once, to completion, whether the query reads it or not.
    found = func.coalesce(select(inserted.c.id).scalar_subquery(), passed_over)
    return select(found).add_cte(logged)


def _one_statement(row: DueRow, decision: Decision) -> bool:
    """A fresh dispatch whose only log entry is its ``dispatched`` one (for the job's slot,
    without a reason)."""
    if decision.action is not Action.DISPATCH or len(decision.log) != 1:
        return False
    [entry] = decision.log
    slot = decision.slot if decision.slot is not None else row.next_run_at
    return (
        entry.decision is Logged.DISPATCHED
        and entry.new_job
        and entry.reason is None
        and entry.slot == slot
    )


def _params(row: DueRow, decision: Decision, work: Work) -> dict[str, Any]:
    params = fresh_params(row, decision, work)
    detail = decision.log[0].detail
    params["d_detail"] = None if detail is None else detail[:500]
    return params


_DISPATCH = PreparedSet(build_dispatch, Spread)


class PostgresWriter:
    """PostgreSQL with psycopg: the batch's fresh dispatches over several connections at once."""

    def carry_out(
        self, store: Store, conn: Connection, decided: Sequence[Decided], work: Work
    ) -> Carried:
        carried = Carried()
        fresh: list[Decided] = []
        try:
            for row, decision in decided:
                if _one_statement(row, decision):
                    fresh.append((row, decision))
                else:
                    carried.done[row.id] = carry_out_row(conn, row, decision, work)
            if fresh:
                self._spread(store, conn, fresh, work, carried)
        except BaseException as exc:  # report what committed first
            carried.failures.append(exc)
        return carried

    def _spread(
        self, store: Store, conn: Connection, fresh: list[Decided], work: Work, carried: Carried
    ) -> None:
        connections = 1 if work.connections < 0 else work.connections or DEFAULT_CONNECTIONS
        lanes = max(1, min(connections, len(fresh) // ROWS_PER_CONNECTION))
        with contextlib.ExitStack() as stack:

            def lane_connections() -> Iterator[Connection]:
                yield conn  # its first row is on its way before the next checkout
                for _ in range(lanes - 1):
                    try:
                        extra = stack.enter_context(store.engine.connect())
                    except Exception:  # the lanes already open go on with every row
                        log.debug("tick: no more connections for the batch", exc_info=True)
                        return
                    yield extra

            found = _DISPATCH.on(conn).run(
                lane_connections(),
                fresh,
                lambda item: _params(item[0], item[1], work),
                stop_on_none=True,  # a lost race: the rest of the batch is likely stale too
            )
        for (row, decision), job_id in zip(fresh, found, strict=True):
            if job_id is UNSENT:
                continue  # still due: the tick comes back for it, or another process has it
            if isinstance(job_id, BaseException):
                carried.failures.append(job_id)
            elif job_id is None:
                carried.done[row.id] = (Outcome.LOST_RACE, None)
            elif job_id == LOCKED_ROW:
                carried.done[row.id] = (Outcome.LOCKED, None)
            else:
                carried.done[row.id] = dispatched(row, job_id, decision.slot)
