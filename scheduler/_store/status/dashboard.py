"""The dashboard's reads: each page is a few bounded statements, whatever the table sizes.

Lists are keyset-paginated (tasks by name, jobs by id, newest first), never OFFSET: a page deep
in a million jobs costs what the first one does.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, bindparam, or_, select, union_all

from ..._model.rules import Thresholds
from ..tables import jobs, rows, runs
from . import warned as _warned

PAGE_SIZE = 50
STRIP_LENGTH = 12
TASK_STATES = ("enabled", "disabled", "failing", "overdue", "held_back")
"""The Tasks page's filters; ``overdue`` and ``held_back`` are the rows ``status`` warns about
(``scheduler/_store/status/warned.py``, with its thresholds)."""


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
    now: datetime | None = None,
    limits: Thresholds | None = None,
    prefix: str = "",
    group: str = "",
    tenant: str = "",
    source: str = "",
) -> Page:
    """One statement: a page of rows by name, with their last job's state and error code.
    The ``overdue`` and ``held_back`` states need `now` (and `limits`, else the defaults).
    ``prefix``, ``group``, ``tenant`` and ``source`` each narrow the page when given; each walks
    an index in name order (the name's own, or ``(source|task_group|tenant, name)``), so a
    page costs the same among a million rows."""
    stmt = (
        select(
            rows.c.name,
            rows.c.source,
            rows.c.task_group.label("group"),
            rows.c.tenant,
            rows.c.handler,
            rows.c.cron,
            rows.c.timezone,
            rows.c.enabled,
            rows.c.next_run_at,
            rows.c.last_job_id,
            rows.c.consecutive_failures,
            rows.c.disabled_reason,
            rows.c.disabled_at,
            rows.c.disabled_note,
            rows.c.probe_at,
            jobs.c.state.label("last_job_state"),
            jobs.c.last_error_code.label("last_error_code"),
        )
        .select_from(rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id))
        .order_by(rows.c.name)
        .limit(limit + 1)
    )
    if name:
        stmt = stmt.where(rows.c.name.like(_like(name), escape="\\"))
    if prefix:
        # As rows(prefix=): the range lets the name's index start at the prefix (a LIKE alone
        # is no range under a database's collation); LIKE keeps the names that start with it.
        stmt = stmt.where(rows.c.name >= prefix, rows.c.name.startswith(prefix, autoescape=True))
    if group:
        stmt = stmt.where(rows.c.task_group == group)
    if tenant:
        stmt = stmt.where(rows.c.tenant == tenant)
    if source:
        stmt = stmt.where(rows.c.source == source)
    if state == "enabled":
        stmt = stmt.where(rows.c.enabled.is_(True))
    elif state == "disabled":
        stmt = stmt.where(rows.c.enabled.is_(False))
    elif state == "failing":
        stmt = stmt.where(or_(rows.c.consecutive_failures > 0, jobs.c.state == "aborted"))
    params: dict[str, Any] = {}
    if state in ("overdue", "held_back"):
        if now is None:
            raise ValueError(f"the {state!r} filter needs now")
        stmt = stmt.where(_warned.condition(state))
        params = _warned.instants(now, limits or Thresholds())
    if after is not None:
        stmt = stmt.where(rows.c.name > after)
    found = [dict(r._mapping) for r in conn.execute(stmt, params)]
    more = len(found) > limit
    found = found[:limit]
    return Page(found, found[-1]["name"] if more else None)


@functools.lru_cache(maxsize=64)
def _strips_statement(count: int, length: int) -> Any:
    """The UNION ALL for ``count`` tasks, built once (building it costs more than running it);
    the task names are the parameters ``t0``, ``t1`` and so on."""
    parts = []
    for i in range(count):
        # The task's newest jobs, newest first, through the index; their runs are the newest.
        recent = (
            select(jobs.c.id, jobs.c.task_name)
            .where(jobs.c.task_name == bindparam(f"t{i}"))
            .order_by(jobs.c.id.desc())
            .limit(length)
            .subquery()
        )
        inner = (
            select(
                recent.c.task_name,
                runs.c.id,
                runs.c.job_id,
                runs.c.attempt,
                runs.c.outcome,
                runs.c.error_code,
                runs.c.finished_at,
            )
            .select_from(recent.join(runs, runs.c.job_id == recent.c.id))
            # Not ``runs.id`` alone: SQLite would then walk the whole history backwards by its
            # primary key, probing each run; a task's newer job has the newer runs anyway.
            .order_by(recent.c.id.desc(), runs.c.id.desc())
            .limit(length)
            .subquery()
        )
        parts.append(select(inner))
    return union_all(*parts) if count > 1 else parts[0]


def strips(
    conn: Connection, names: Sequence[str], length: int = STRIP_LENGTH
) -> dict[str, list[dict[str, Any]]]:
    """One statement: the last ``length`` runs of each named task, newest first.

    A UNION ALL of one small select per task: its ``length`` newest jobs (through an index on
    ``(task_name, id)`` where there is one) and their runs, where a window function over all
    the tasks' runs would rank every one of them. A run strip of a task whose newest jobs never
    ran (queued) is shorter.
    """
    unique = list(dict.fromkeys(names))
    if not unique:
        return {}
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in unique}
    params = {f"t{i}": name for i, name in enumerate(unique)}
    for r in conn.execute(_strips_statement(len(unique), length), params):
        found[r.task_name].append(dict(r._mapping))
    for cells in found.values():
        cells.sort(key=lambda cell: cell["id"], reverse=True)
    return found


def task_runs(conn: Connection, name: str, limit: int = 20) -> list[dict[str, Any]]:
    """One statement: the task's last runs, newest first."""
    stmt = (
        select(runs)
        .select_from(jobs.join(runs, jobs.c.id == runs.c.job_id))
        .where(jobs.c.task_name == name)
        .order_by(jobs.c.id.desc(), runs.c.id.desc())  # see _strips_statement
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
