"""The figures of the Prometheus gauges read from the database, in one statement: jobs by
state and queue (with each queue's oldest ready job), each task's state, failure count and
last success, the workers seen; on PostgreSQL also each table's dead row versions and the age
of the oldest transaction holding the MVCC horizon (``horizon.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Float,
    String,
    case,
    cast,
    literal_column,
    null,
    select,
    type_coerce,
    union_all,
)

from ..._model.rules import SUCCEEDED
from ..engine import Store
from ..tables import UTCDateTime, jobs, rows, workers
from . import counts as _counts
from . import horizon as _horizon

Figure = tuple[str, Any, Any, Any, Any]
"""One row of :func:`read`: (kind, a, b, n, at); the kinds: ``jobs`` (state, queue, count,
oldest ready run_at), ``task`` (name, enabled|disabled, failures, last success), ``worker``
(id, -, -, last seen), ``dead`` (table, -, dead tuples, -), ``horizon`` (-, -, age, -)."""


def read(store: Store, now: datetime) -> list[Figure]:
    """Every figure the gauges need, at `now`, in one statement."""
    with store.read() as conn:
        postgresql = conn.dialect.name == "postgresql"
        return [tuple(row) for row in conn.execute(_state_statement(now, postgresql))]


def _state_statement(now: datetime, postgresql: bool = False) -> Any:
    """Every figure the gauges need, in one statement: (kind, a, b, n, at) rows."""

    def kind(name: str) -> Any:
        return literal_column(f"'{name}'", String).label("kind")

    def text(value: Any) -> Any:
        return cast(value, String(200))

    no_text, no_number = cast(null(), String(200)), cast(null(), Float)
    # Per task, its newest succeeded job's end: the task's jobs read newest first through
    # ix_scheduler_jobs_task, usually one of them (a max over every succeeded job took 0.5 s
    # on SQLite at 1,000,000 jobs).
    last_success = (
        select(jobs.c.finished_at)
        .where(jobs.c.task_name == rows.c.name, jobs.c.state == SUCCEEDED)
        .order_by(jobs.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    return union_all(
        # kind, a, b, n, at
        _counts.by_state_and_queue(now, kind("jobs"), text),
        select(
            kind("task"),
            text(rows.c.name),
            case((rows.c.enabled, "enabled"), else_="disabled"),
            cast(rows.c.consecutive_failures, Float),
            last_success,
        ),
        select(kind("worker"), text(workers.c.id), no_text, no_number, workers.c.last_seen_at),
        *_vacuum_selects(kind, text, no_text) if postgresql else (),
    )


def _vacuum_selects(kind: Any, text: Any, no_text: Any) -> tuple[Any, ...]:
    """PostgreSQL: each scheduler table's dead row versions, and the age of the oldest
    transaction holding the MVCC horizon (``horizon.py`` beside this module), as rows of the same
    union."""
    dead = _horizon.DEAD_TUPLES.subquery()
    no_time = type_coerce(null(), UTCDateTime)
    return (
        select(
            kind("dead"), text(dead.c.relname), no_text, cast(dead.c.n_dead_tup, Float), no_time
        ),
        select(kind("horizon"), no_text, no_text, cast(_horizon.OLDEST_AGE, Float), no_time),
    )
