"""What ``explain`` reads of one row, in three statements, each through an index: the row
with its last job, the row's newest decisions, the task's newest jobs' runs
(``scheduler/_ops/explain.py`` works out the rest)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select

from ..._model.job import Job
from ..._model.rows import TaskRow
from .. import decisions as _decisions
from ..jobs import run_number
from ..rows import _view
from ..tables import jobs, rows, runs

DECISIONS = 20
RUNS = 10

_JOB_COLUMNS = [c.label(f"job_{c.name}") for c in jobs.c]
_ROW = (  # the row, its last job's state (as get_row reads it) and all of that job
    select(
        rows,
        jobs.c.state.label("last_job_state"),
        jobs.c.last_error_code.label("last_job_error"),
        *_JOB_COLUMNS,
    )
    .select_from(rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id))
    .where(rows.c.name == bindparam("p_name"))
)


def _runs_statement() -> Any:
    # The task's newest jobs through ix_scheduler_jobs_task, then their runs: a task's newer
    # job has the newer runs. (A LIMIT inside IN is refused by MariaDB; in FROM it is not.)
    recent = (
        select(jobs.c.id)
        .where(jobs.c.task_name == bindparam("p_name"))
        .order_by(jobs.c.id.desc())
        .limit(bindparam("p_limit"))
        .subquery()
    )
    return (
        select(runs, run_number())
        .select_from(recent.join(runs, runs.c.job_id == recent.c.id))
        .order_by(recent.c.id.desc(), runs.c.id.desc())
        .limit(bindparam("p_limit"))
    )


_RUNS = _runs_statement()


@dataclass(frozen=True)
class Read:
    """What explain reads of one row (three statements)."""

    row: TaskRow
    job: Job | None
    job_started_at: datetime | None
    decisions: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    note: str | None


class _JobRow:
    """The last job's columns of the row's statement, shaped for :meth:`Job.from_row`."""

    def __init__(self, mapping: dict[str, Any]) -> None:
        self._mapping = mapping


def read(conn: Connection, name: str, runs: int = RUNS) -> Read | None:
    """The row named `name` with its last job, its last 20 decisions and its task's last
    `runs` runs; None without such a row."""
    found = conn.execute(_ROW, {"p_name": name}).first()
    if found is None:
        return None
    m = found._mapping
    job = None
    if m["job_id"] is not None:
        columns = {c.name: m[f"job_{c.name}"] for c in jobs.c}
        job = Job.from_row(_JobRow(columns))
    entries = _decisions.recent(conn, name, DECISIONS)
    found_runs = [dict(r._mapping) for r in conn.execute(_RUNS, {"p_name": name, "p_limit": runs})]
    return Read(
        row=_view(found),
        job=job,
        job_started_at=m["job_started_at"],
        decisions=entries,
        runs=found_runs,
        note=m.get("disabled_note"),
    )
