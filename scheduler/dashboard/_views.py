"""What each page shows, built from the app's reads; no HTTP here.

The Task page's data has the shape ``explain`` will return (issue 13): a state sentence, the
next fires, decisions and runs. Until ``Scheduler.explain`` exists, the sentence and the fires
are worked out here from the row and its last job, and ``decisions`` is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from .. import _cron
from .._store.jobs import Job
from .._store.rows import TaskRow
from . import _queries

if TYPE_CHECKING:
    from .._app import Scheduler

NEXT_FIRES = 10


@dataclass(frozen=True)
class Fire:
    at: datetime  # UTC
    dst: str | None  # "UTC+01:00 → UTC+02:00" when the zone's offset changes before this fire


def next_fires(row: TaskRow, now: datetime, count: int = NEXT_FIRES) -> list[Fire]:
    """The next ``count`` slots in the row's zone, each marked where the UTC offset shifts."""
    zone = ZoneInfo(row.timezone)
    at = row.next_run_at if row.enabled and row.next_run_at is not None else None
    if at is None:
        at = _cron.next_after(row.cron, row.timezone, now, row.name)
    fires: list[Fire] = []
    previous = now.astimezone(zone).utcoffset()
    for _ in range(count):
        offset = at.astimezone(zone).utcoffset()
        mark = None
        if offset != previous and previous is not None and offset is not None:
            mark = f"{_offset(previous)} → {_offset(offset)}"
        fires.append(Fire(at, mark))
        previous = offset
        at = _cron.next_after(row.cron, row.timezone, at, row.name)
    return fires


def _offset(delta: Any) -> str:
    minutes = int(delta.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _at(value: datetime | None, zone: str = "UTC") -> str:
    if value is None:
        return "-"
    local = value.astimezone(ZoneInfo(zone))
    utc = "" if zone == "UTC" else f" ({value:%H:%M:%S}Z)"
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}{utc}"


def state_sentence(row: TaskRow, job: Job | None, limit: int) -> tuple[str, str]:
    """(tone, sentence): what the row is doing now, in one sentence, times in its zone."""

    def at(value: datetime | None) -> str:
        return _at(value, row.timezone)

    if not row.enabled:
        after = (
            f" after {row.consecutive_failures} consecutive failure(s)"
            if row.consecutive_failures
            else ""
        )
        return "bad" if row.consecutive_failures else "off", (
            f"Disabled ({row.disabled_reason or 'manual'}) since {at(row.disabled_at)}{after}."
            + (f" Reason: {row.disabled_note}" if row.disabled_note else "")
        )
    nxt = f"next slot {at(row.next_run_at)}"
    if job is None:
        return "ok", f"Scheduled: no run yet; {nxt}."
    if job.state == "claimed":
        return "run", (
            f"Running: job {job.id} is claimed by {job.lease_owner} (attempt {job.attempts} of"
            f" {job.max_attempts}), lease until {at(job.lease_expires_at)}; {nxt}."
        )
    if job.state == "queued" and job.attempts:
        return "warn", (
            f"Retrying: job {job.id} failed attempt {job.attempts} of {job.max_attempts}"
            f" ({job.last_error_code}); next attempt at {at(job.run_at)}."
        )
    if job.state == "queued":
        return "run", f"Waiting: job {job.id} is queued to run at {at(job.run_at)}."
    if job.state == "aborted":
        failures = row.consecutive_failures + 1
        then = (
            f"failure {failures} of {limit} before the task is disabled"
            if limit
            else f"failure {failures}"
        )
        return "bad", (
            f"Failing: job {job.id} aborted ({job.last_error_code}); the {nxt} reruns it in"
            f" place ({then})."
        )
    return "ok", f"Healthy: job {job.id} succeeded; {nxt}."


def task_page(app: Scheduler, name: str, now: datetime) -> dict[str, Any] | None:
    """Three statements: the row (with its last job's state), its last job, its last runs."""
    explain = getattr(app, "explain", None)
    with app.store.read() as conn:
        from .._store.jobs import get_job
        from .._store.rows import get_row

        row = get_row(conn, name)
        if row is None:
            return None
        job = get_job(conn, row.last_job_id) if row.last_job_id is not None else None
        task_runs = _queries.task_runs(conn, name)
    limit = row.max_consecutive_failures
    if limit is None:
        limit = app.settings.max_consecutive_failures
    tone, sentence = state_sentence(row, job, limit)
    return {
        "row": row,
        "job": job,
        "tone": tone,
        "state": sentence,
        "fires": next_fires(row, now),
        "runs": task_runs,
        # Filled by Scheduler.explain once it exists (issue 13); the page shows it then.
        "decisions": None if explain is None else _decisions(explain, name),
        "policies": {
            "cron": row.cron,
            "timezone": row.timezone,
            "handler": row.handler,
            "overlap": "allow" if row.concurrent else "hold",
            "max_consecutive_failures": limit or "unlimited",
        },
    }


def _decisions(explain: Any, name: str) -> list[dict[str, Any]] | None:
    try:
        data = explain(name)
    except Exception:  # a newer API we do not know yet: show the page without them
        return None
    found = data.get("decisions") if isinstance(data, dict) else getattr(data, "decisions", None)
    return list(found) if found is not None else None
