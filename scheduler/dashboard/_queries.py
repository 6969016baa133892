"""The dashboard's reads: each page is a few bounded statements, whatever the table sizes.

Lists are keyset-paginated (tasks by name, jobs by id, newest first), never OFFSET: a page deep
in a million jobs costs what the first one does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, func, or_, select

from .._tables import jobs, rows, runs

PAGE_SIZE = 50
STRIP_LENGTH = 12
TASK_STATES = ("enabled", "disabled", "failing")


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: Any  # pass back as the cursor for the next page; None on the last page


def tasks(
    conn: Connection,
    *,
    name: str = "",
    state: str = "",
    after: str | None = None,
    limit: int = PAGE_SIZE,
) -> Page:
    """One statement: a page of rows by name, with their last job's state and error code."""
    stmt = (
        select(
            rows.c.name,
            rows.c.handler,
            rows.c.cron,
            rows.c.timezone,
            rows.c.enabled,
            rows.c.next_run_at,
            rows.c.last_job_id,
            rows.c.consecutive_failures,
            rows.c.disabled_reason,
            rows.c.disabled_at,
            jobs.c.state.label("last_job_state"),
            jobs.c.last_error_code.label("last_error_code"),
        )
        .select_from(rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id))
        .order_by(rows.c.name)
        .limit(limit + 1)
    )
    if name:
        stmt = stmt.where(rows.c.name.like(_like(name), escape="\\"))
    if state == "enabled":
        stmt = stmt.where(rows.c.enabled.is_(True))
    elif state == "disabled":
        stmt = stmt.where(rows.c.enabled.is_(False))
    elif state == "failing":
        stmt = stmt.where(or_(rows.c.consecutive_failures > 0, jobs.c.state == "aborted"))
    if after is not None:
        stmt = stmt.where(rows.c.name > after)
    found = [dict(r._mapping) for r in conn.execute(stmt)]
    more = len(found) > limit
    found = found[:limit]
    return Page(found, found[-1]["name"] if more else None)


def strips(
    conn: Connection, names: Sequence[str], length: int = STRIP_LENGTH
) -> dict[str, list[dict[str, Any]]]:
    """One statement: the last ``length`` runs of each named task, newest first."""
    if not names:
        return {}
    numbered = (
        select(
            jobs.c.task_name,
            runs.c.job_id,
            runs.c.attempt,
            runs.c.outcome,
            runs.c.error_code,
            runs.c.finished_at,
            func.row_number()
            .over(partition_by=jobs.c.task_name, order_by=runs.c.id.desc())
            .label("n"),
        )
        .select_from(runs.join(jobs, jobs.c.id == runs.c.job_id))
        .where(jobs.c.task_name.in_(list(names)))
        .subquery()
    )
    stmt = (
        select(numbered).where(numbered.c.n <= length).order_by(numbered.c.task_name, numbered.c.n)
    )
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in conn.execute(stmt):
        found[r.task_name].append(dict(r._mapping))
    return found


def task_runs(conn: Connection, name: str, limit: int = 20) -> list[dict[str, Any]]:
    """One statement: the task's last runs, newest first."""
    stmt = (
        select(runs)
        .select_from(runs.join(jobs, jobs.c.id == runs.c.job_id))
        .where(jobs.c.task_name == name)
        .order_by(runs.c.id.desc())
        .limit(limit)
    )
    return [dict(r._mapping) for r in conn.execute(stmt)]


JOB_COLUMNS = (
    jobs.c.id,
    jobs.c.handler,
    jobs.c.queue,
    jobs.c.state,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.run_at,
    jobs.c.last_error_code,
    jobs.c.lease_owner,
    jobs.c.task_name,
    jobs.c.created_at,
    jobs.c.finished_at,
)


def job_list(
    conn: Connection,
    *,
    state: str = "",
    task: str = "",
    handler: str = "",
    queue: str = "",
    before: int | None = None,
    limit: int = PAGE_SIZE,
) -> Page:
    """One statement: a page of jobs, newest first, with their task's timezone."""
    conditions: list[Any] = []
    if state:
        conditions.append(jobs.c.state == state)
    if task:
        conditions.append(jobs.c.task_name == task)
    if handler:
        conditions.append(jobs.c.handler == handler)
    if queue:
        conditions.append(jobs.c.queue == queue)
    if before is not None:
        conditions.append(jobs.c.id < before)
    stmt = (
        select(*JOB_COLUMNS, rows.c.timezone)
        .select_from(jobs.outerjoin(rows, rows.c.name == jobs.c.task_name))
        .where(and_(True, *conditions))
        .order_by(jobs.c.id.desc())
        .limit(limit + 1)
    )
    found = [dict(r._mapping) for r in conn.execute(stmt)]
    more = len(found) > limit
    found = found[:limit]
    return Page(found, found[-1]["id"] if more else None)


def task_timezone(conn: Connection, name: str | None) -> str | None:
    if name is None:
        return None
    zone: str | None = conn.execute(select(rows.c.timezone).where(rows.c.name == name)).scalar()
    return zone
