"""The dashboard's view of the present: the jobs running now, each queue's counts and
throughput, and the run history by time for the Queues page's chart. Each a bounded statement
on an index, whatever the table sizes:

- running: the claimed jobs, on the lease index ``(state, lease_expires_at)``, at most
  :data:`RUNNING_LIMIT`;
- queue counts: the active jobs by ``(state, queue)`` (the ready index), and the jobs finished
  in the last hour by ``(state, finished_at)`` (the finished index);
- the chart: the runs of a window by ``(finished_at, outcome)`` (``ix_scheduler_runs_finished``,
  revision 0009), counted in buckets by the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Integer, String, and_, case, func, literal, select, union_all

from ..._model.rules import ABORTED, CLAIMED, QUEUED, SUCCEEDED
from ..tables import jobs, paused_queues, runs

PAUSED = "paused"  # not a job state: the line of a paused queue in :func:`queues`' statement

RUNNING_LIMIT = 500
THROUGHPUT_WINDOW = timedelta(hours=1)


def running(conn: Connection, *, limit: int = RUNNING_LIMIT) -> list[dict[str, Any]]:
    """The jobs claimed now (a lease held), the lease ending soonest first: at most ``limit``."""
    stmt = (
        select(
            jobs.c.id,
            jobs.c.handler,
            jobs.c.task_name,
            jobs.c.queue,
            jobs.c.lease_owner,
            jobs.c.started_at,
            jobs.c.lease_expires_at,
            jobs.c.slot,
            jobs.c.attempts,
            jobs.c.max_attempts,
            jobs.c.tenant,
        )
        .where(jobs.c.state == CLAIMED, jobs.c.lease_expires_at.is_not(None))
        .order_by(jobs.c.lease_expires_at, jobs.c.id)
        .limit(limit)
    )
    return [dict(r._mapping) for r in conn.execute(stmt)]


@dataclass
class QueueCounts:
    """One queue's line on the Queues page."""

    queue: str
    ready: int = 0  # queued, due now
    scheduled: int = 0  # queued, due later (a retry's back-off, a run_at)
    running: int = 0  # claimed
    succeeded: int = 0  # finished in the last hour
    failed: int = 0  # ended aborted in the last hour
    paused: bool = False  # an operator paused it (`scheduler pause`): no worker claims from it

    @property
    def per_minute(self) -> float:
        """Jobs done (succeeded) per minute over the last hour."""
        return self.succeeded / (THROUGHPUT_WINDOW.total_seconds() / 60)


def queues(conn: Connection, now: datetime) -> list[QueueCounts]:
    """Every queue that has an active job or a job finished in the last hour, or is paused, by
    name."""
    found: dict[str, QueueCounts] = {}

    def line(queue: str) -> QueueCounts:
        return found.setdefault(queue, QueueCounts(queue))

    due = case((jobs.c.run_at <= now, 1), else_=0)
    active = (
        select(jobs.c.state, jobs.c.queue, func.sum(due), func.count())
        .where(jobs.c.state.in_([QUEUED, CLAIMED]))
        .group_by(jobs.c.state, jobs.c.queue)
    )
    # The paused queues ride in the same statement: a line each, state PAUSED.
    paused = select(
        literal(PAUSED, String(16)), paused_queues.c.queue, literal(0, Integer), literal(0, Integer)
    )
    for state, queue, ready, count in conn.execute(union_all(active, paused)):
        if state == PAUSED:
            line(queue).paused = True
        elif state == QUEUED:
            line(queue).ready += int(ready or 0)
            line(queue).scheduled += int(count) - int(ready or 0)
        else:
            line(queue).running += int(count)
    finished = (
        select(jobs.c.state, jobs.c.queue, func.count())
        .where(
            jobs.c.state.in_([SUCCEEDED, ABORTED]),
            jobs.c.finished_at.is_not(None),
            jobs.c.finished_at >= now - THROUGHPUT_WINDOW,
        )
        .group_by(jobs.c.state, jobs.c.queue)
    )
    for state, queue, count in conn.execute(finished):
        if state == SUCCEEDED:
            line(queue).succeeded += int(count)
        else:
            line(queue).failed += int(count)
    return [found[q] for q in sorted(found)]


@dataclass(frozen=True)
class Bucket:
    """One bar of the chart: the attempts that ended in ``[start, end)``."""

    start: datetime
    end: datetime
    succeeded: int
    failed: int  # every other outcome: failed (retried), aborted, abandoned, lost


def run_history(
    conn: Connection, end: datetime, *, window: timedelta, buckets: int
) -> list[Bucket]:
    """The attempts that ended in the ``window`` before ``end``, in ``buckets`` equal bars,
    oldest first: one statement, a range of ``ix_scheduler_runs_finished``."""
    now = end
    size = window / buckets
    since = now - window
    edges = [since + size * (i + 1) for i in range(buckets)]
    # The bar of each run, found by the database: the first edge it ends before.
    bar = case(*((runs.c.finished_at < edge, i) for i, edge in enumerate(edges)), else_=buckets)
    ok = case((runs.c.outcome == SUCCEEDED, 1), else_=0)
    ended = (
        select(bar.label("bar"), ok.label("ok"))
        .where(and_(runs.c.finished_at >= since, runs.c.finished_at < now))
        .subquery()
    )
    stmt = select(ended.c.bar, func.sum(ended.c.ok), func.count()).group_by(ended.c.bar)
    counts = {int(i): (int(s or 0), int(n)) for i, s, n in conn.execute(stmt)}
    out = []
    for i in range(buckets):
        succeeded, total = counts.get(i, (0, 0))
        out.append(Bucket(since + size * i, edges[i], succeeded, total - succeeded))
    return out


def matching_ids(
    conn: Connection,
    *,
    state: str,
    task: str = "",
    handler: str = "",
    queue: str = "",
    upto: int | None = None,
    limit: int,
) -> list[int]:
    """The ids of the jobs in ``state`` that the Jobs page's filter selects, newest first, at
        most ``limit``, none newer than ``upto``: a bulk action's selection (``state`` leads every
    index a filter uses; ``upto`` keeps jobs newer than the confirmation out)."""
    conditions: list[Any] = [jobs.c.state == state]
    if task:
        conditions.append(jobs.c.task_name == task)
    if handler:
        conditions.append(jobs.c.handler == handler)
    if queue:
        conditions.append(jobs.c.queue == queue)
    if upto is not None:
        conditions.append(jobs.c.id <= upto)
    stmt = select(jobs.c.id).where(and_(*conditions)).order_by(jobs.c.id.desc()).limit(limit)
    return [int(i) for i in conn.execute(stmt).scalars()]
