"""The tick: each due row in its own transaction, decided by a compare-and-swap on its version.

For one due row (SPEC §2): a terminally ``aborted`` last job counts a failure and either
disables the row (committed, reported *not dispatched*) or is reset and rerun in place; a
non-concurrent row whose last job is still in flight is held back (nothing written); otherwise
a fresh job is dispatched. The outcome reported is tracked apart from commit/rollback.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Integer, and_, bindparam, or_, select, true, update

from . import _cron, _jobs, signals
from ._alerts import Alert, cause, deliver
from ._jobs import ABORTED, CLAIMED, QUEUED, SUCCEEDED
from ._store import Store
from ._tables import jobs, rows

log = logging.getLogger(__name__)

DISPATCHED, RERUN, HELD_BACK, DISABLED, LOST_RACE = (
    "dispatched",
    "rerun",
    "held_back",
    "disabled",
    "lost_race",
)
REASON_FAILURES = "max_consecutive_failures"

# (handler name) -> (max_attempts, queue) for the jobs the tick creates
JobDefaults = Callable[[str], tuple[int, str]]


@dataclass
class TickReport:
    """Row names per outcome of one tick."""

    dispatched: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    lost_race: list[str] = field(default_factory=list)

    def add(self, outcome: str, name: str) -> None:
        getattr(self, outcome).append(name)

    def as_dict(self) -> dict[str, list[str]]:
        return {
            k: list(getattr(self, k)) for k in (DISPATCHED, RERUN, HELD_BACK, DISABLED, LOST_RACE)
        }

    def __bool__(self) -> bool:
        return any(self.as_dict().values())


class _Rollback(Exception):
    def __init__(self, outcome: str) -> None:
        self.outcome = outcome


_due_columns = [
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
]


# Built once with bound parameters (building costs more than running on SQLite).
_P = bindparam
_DUE = (
    select(*_due_columns)
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
_RESET_JOB = (
    update(jobs)
    .where(jobs.c.id == _P("p_id"), jobs.c.state == ABORTED)
    .values(
        state=QUEUED,
        attempts=0,
        max_attempts=_P("p_max_attempts"),
        queue=_P("p_queue"),
        handler=_P("p_handler"),
        payload=_P("p_payload"),
        run_at=_P("p_now"),
        last_error_code=None,
        lease_owner=None,
        lease_expires_at=None,
        started_at=None,
        finished_at=None,
    )
)


def _due(
    conn: Connection, now: datetime, limit: int, after: tuple[datetime, int] | None
) -> list[Any]:
    if after is None:
        return list(conn.execute(_DUE, {"p_now": now, "p_limit": limit}))
    params = {"p_now": now, "p_limit": limit, "p_after_at": after[0], "p_after_id": after[1]}
    return list(conn.execute(_DUE_AFTER, params))


@functools.lru_cache(maxsize=16)
def _swap_statement(keys: tuple[str, ...]) -> Any:
    return (
        update(rows)
        .where(rows.c.id == _P("p_id"), rows.c.version == _P("p_version"))
        .values(
            version=rows.c.version + 1,
            updated_at=_P("p_now"),
            **{key: _P(f"p_{key}", type_=rows.c[key].type) for key in keys},
        )
    )


def _swap(conn: Connection, row: Any, now: datetime, **values: Any) -> None:
    """The compare-and-swap on the row's version; a miss means another process won."""
    params = {f"p_{key}": value for key, value in values.items()}
    params.update(p_id=row.id, p_version=row.version, p_now=now)
    if conn.execute(_swap_statement(tuple(sorted(values))), params).rowcount != 1:
        raise _Rollback(LOST_RACE)


def tick(
    store: Store,
    *,
    now: datetime,
    max_consecutive_failures: int,
    batch_size: int,
    job_defaults: JobDefaults,
) -> TickReport:
    """Run one tick over every due row, oldest ``next_run_at`` first, in bounded batches."""
    report = TickReport()
    after: tuple[datetime, int] | None = None
    while True:
        # A read transaction: an idle tick takes no write lock (SQLite) and 2 statements.
        with store.read() as reader:
            batch = _due(reader, now, batch_size, after)
        if batch:
            with store.engine.connect() as conn:
                for row in batch:
                    _one(conn, row, now, max_consecutive_failures, job_defaults, report)
        if len(batch) < batch_size:
            return report
        after = (batch[-1].next_run_at, batch[-1].id)


def _one(
    conn: Connection,
    row: Any,
    now: datetime,
    global_limit: int,
    job_defaults: JobDefaults,
    report: TickReport,
) -> None:
    after_commit: Callable[[], object] | None = None
    try:
        with conn.begin():
            outcome, after_commit = _decide(conn, row, now, global_limit, job_defaults)
    except _Rollback as rolled_back:
        outcome = rolled_back.outcome
    report.add(outcome, row.name)
    log.debug(
        "tick: row %s %s", row.name, outcome, extra={"action": f"row_{outcome}", "row": row.name}
    )
    if after_commit is not None:
        after_commit()


def _decide(
    conn: Connection, row: Any, now: datetime, global_limit: int, job_defaults: JobDefaults
) -> tuple[str, Callable[[], object] | None]:
    state = row.job_state
    if state == ABORTED:
        failures = row.consecutive_failures + 1
        limit = row.max_consecutive_failures
        limit = global_limit if limit is None else limit
        if limit and failures >= limit:
            alert_id = uuid.uuid4().hex
            _swap(
                conn,
                row,
                now,
                enabled=False,
                disabled_reason=REASON_FAILURES,
                disabled_at=now,
                consecutive_failures=failures,
                alert_id=alert_id,
            )
            code = cause(conn, row.last_job_id, row.job_error)
            log.warning(
                "row %s disabled after %s consecutive failures (last error %s)",
                row.name,
                failures,
                code,
                extra={"action": "row_disabled", "row": row.name, "code": code},
            )
            alert = Alert(row.id, row.name, failures, code, row.last_job_id, now, alert_id)
            return DISABLED, lambda: deliver(conn, alert)
        max_attempts, queue = job_defaults(row.handler)
        _swap(
            conn,
            row,
            now,
            consecutive_failures=failures,
            next_run_at=_cron.next_after(row.cron, row.timezone, now, row.name),
        )
        reset = conn.execute(
            _RESET_JOB,
            {
                "p_id": row.last_job_id,
                "p_max_attempts": max_attempts,
                "p_queue": queue,
                "p_handler": row.handler,
                "p_payload": row.payload,
                "p_now": now,
            },
        )
        if reset.rowcount != 1:
            raise _Rollback(LOST_RACE)
        return RERUN, lambda: signals.send(
            signals.job_rerun,
            row.name,
            row=row.name,
            job_id=row.last_job_id,
            consecutive_failures=failures,
        )
    if state in (QUEUED, CLAIMED) and not row.concurrent:
        raise _Rollback(HELD_BACK)
    failures = 0 if state in (SUCCEEDED, None) else row.consecutive_failures
    max_attempts, queue = job_defaults(row.handler)
    job_id = _jobs.insert_job(
        conn,
        _jobs.new_job_values(
            handler=row.handler,
            payload=row.payload,
            now=now,
            max_attempts=max_attempts,
            queue=queue,
            task_name=row.name,
        ),
    )
    _swap(
        conn,
        row,
        now,
        last_job_id=job_id,
        consecutive_failures=failures,
        next_run_at=_cron.next_after(row.cron, row.timezone, now, row.name),
    )
    return DISPATCHED, lambda: signals.send(
        signals.job_dispatched,
        row.name,
        row=row.name,
        job_id=job_id,
        slot=row.next_run_at,
    )
