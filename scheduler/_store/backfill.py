"""Backfill's statements (``scheduler/_ops/backfill.py`` decides what they write): the task's
row, the compare-and-swap that orders two backfills of one task, the slots already taken, and
the jobs with their ``backfilled`` decisions."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, insert, select, update

from . import jobs as _jobs
from .tables import decisions, jobs, rows, runs

_CHUNK = 500  # slots per IN list


class Task(NamedTuple):
    """What a backfill needs of the task's row."""

    handler: str
    payload: str
    cron: str
    timezone: str
    version: int
    tenant: str | None


def read_task(conn: Connection, name: str) -> Task | None:
    found = conn.execute(
        select(
            rows.c.handler,
            rows.c.payload,
            rows.c.cron,
            rows.c.timezone,
            rows.c.version,
            rows.c.tenant,
        ).where(rows.c.name == name)
    ).first()
    return None if found is None else Task._make(found)


def swap_version(conn: Connection, name: str, version: int) -> bool:
    """Bump the row's version if it is still `version` (else another writer moved it)."""
    swapped = conn.execute(
        update(rows)
        .where(rows.c.name == name, rows.c.version == version)
        .values(version=rows.c.version + 1)
    )
    return swapped.rowcount == 1


def taken(conn: Connection, name: str, wanted: list[datetime]) -> set[datetime]:
    """The slots of ``wanted`` that a job of the task carries, or an attempt of one ran for."""
    found: set[datetime] = set()
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        found.update(
            conn.execute(
                select(jobs.c.slot).where(jobs.c.task_name == name, jobs.c.slot.in_(chunk))
            ).scalars()
        )
        found.update(
            conn.execute(
                select(runs.c.slot)
                .select_from(runs.join(jobs, jobs.c.id == runs.c.job_id))
                .where(jobs.c.task_name == name, runs.c.slot.in_(chunk))
            ).scalars()
        )
    return found


def enqueue(
    conn: Connection,
    name: str,
    task: Task,
    slots: Iterable[datetime],
    *,
    now: datetime,
    queue: str,
    max_attempts: int,
) -> dict[datetime, int]:
    """One job of the task per slot, and a ``backfilled`` decision for each; slot -> job id."""
    enqueued: dict[datetime, int] = {}
    for slot in slots:
        values: dict[str, Any] = _jobs.new_job_values(
            handler=task.handler,
            payload=task.payload,
            now=now,
            queue=queue,
            max_attempts=max_attempts,
            task_name=name,
        )
        values["slot"] = slot
        if task.tenant is not None:
            values["tenant"] = task.tenant
        enqueued[slot] = _jobs.insert_job(conn, values)
    if enqueued:
        conn.execute(
            insert(decisions),
            [
                {
                    "task_name": name,
                    "slot": slot,
                    "decided_at": now,
                    "decision": _jobs.BACKFILLED,
                    "job_id": job_id,
                    "reason": "operator",
                    "detail": None,
                }
                for slot, job_id in enqueued.items()
            ],
        )
    return enqueued
