"""Job counts, every variant in one place, each tuned for its reader and answered from an
index, never a scan of the jobs' rows:

- :func:`health_figures`: ``status`` and the dashboard's health (the live states exactly, the
  finished ones on request, and what the warnings need);
- :func:`finished_counts`: the finished states alone (the dashboard takes them in the
  background: each walks an index entry per finished job);
- :func:`by_state_and_queue`: the Prometheus gauge, per state and queue, with each queue's
  oldest ready job (a branch of the metrics' one statement, ``metrics.py``).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Float, case, cast, func, select, type_coerce

from ..._model.rules import ABORTED, CLAIMED, QUEUED, STATES, SUCCEEDED
from ..tables import UTCDateTime, jobs, paused_queues, runs
from ..tables import rows as task_rows

LIVE = (QUEUED, CLAIMED)  # few: counted exactly on every read
FINISHED = (SUCCEEDED, ABORTED)  # as many as the jobs kept


def count_where(*where: Any) -> Any:
    return select(func.count()).select_from(jobs).where(*where).scalar_subquery()


def health_figures(
    conn: Any,
    now: datetime,
    overdue_after: float,
    *,
    finished: bool,
    paused: Collection[str] = (),
) -> Any:
    """One statement of scalar subqueries, each answered from an index, never a scan of the
    jobs' rows: the counts per state (without ``finished``, only the live states', which are
    few) and the queued and claimed figures from the ready index (``state`` first), the latest
    finished attempt from the history's newest row (runs are appended as attempts finish, so
    the highest id is the latest within a few seconds), and whether any row is enabled.

    ``paused``: the paused queues, whose waiting jobs are neither overdue nor stalled (the
    statement is unchanged while no queue is paused); ``any_paused`` says whether one is."""
    overdue_at = now - timedelta(seconds=overdue_after)
    queued, ready = jobs.c.state == QUEUED, jobs.c.run_at <= now
    late = queued if not paused else queued & jobs.c.queue.not_in(sorted(paused))
    stmt = select(
        *(
            count_where(jobs.c.state == state).label(state)
            for state in (STATES if finished else LIVE)
        ),
        count_where(queued, ready).label("waiting"),
        count_where(late, jobs.c.run_at <= overdue_at).label("overdue"),
        count_where(jobs.c.state == CLAIMED, jobs.c.lease_expires_at <= now).label("stopped"),
        select(func.min(jobs.c.run_at)).where(late, ready).scalar_subquery().label("oldest_ready"),
        select(runs.c.finished_at)
        .order_by(runs.c.id.desc())
        .limit(1)
        .scalar_subquery()
        .label("last_finished"),
        select(task_rows.c.id)
        .where(task_rows.c.enabled.is_(True))
        .limit(1)
        .scalar_subquery()
        .label("any_enabled"),
        select(paused_queues.c.queue).limit(1).scalar_subquery().label("any_paused"),
    )
    return conn.execute(stmt).one()


def finished_counts(conn: Any) -> dict[str, int]:
    """One statement: how many jobs are in each finished state. Each count walks the state's
    entries in an index: about 100 ms per million jobs, so the dashboard takes it in the
    background (``scheduler status`` takes it with the rest)."""
    found = conn.execute(
        select(*(count_where(jobs.c.state == state).label(state) for state in FINISHED))
    ).one()
    return {state: int(found._mapping[state]) for state in FINISHED}


def by_state_and_queue(now: datetime, kind: Any, text: Any) -> Any:
    """(kind, state, queue, count, oldest ready run_at) per state and queue."""
    ready = (jobs.c.state == QUEUED) & (jobs.c.run_at <= now)
    return select(
        kind,
        text(jobs.c.state).label("a"),
        text(jobs.c.queue).label("b"),
        cast(func.count(), Float).label("n"),
        type_coerce(func.min(case((ready, jobs.c.run_at))), UTCDateTime).label("at"),
    ).group_by(jobs.c.state, jobs.c.queue)
