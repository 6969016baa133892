"""What each page shows, built from the app's reads; no HTTP here.

The Task page shows what ``explain`` returns (scheduler/_explain.py): the state sentence, the
decisions and the policies, read in explain's three statements; the next fires are drawn here
(the :class:`Fire` the template marks).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from .. import _cron
from .._store.rows import TaskRow
from .._time import in_zone, offset_in

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
    previous = offset_in(zone, now)
    for _ in range(count):
        offset = offset_in(zone, at)
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
    local = in_zone(value, ZoneInfo(zone))
    utc = "" if zone == "UTC" else f" ({value:%H:%M:%S}Z)"
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}{utc}"


def task_page(app: Scheduler, name: str, now: datetime) -> dict[str, Any] | None:
    """Three statements (``_explain.read``): the row with its last job, its decisions, its
    last runs; the sentence, the fires and the policies are ``explain``'s."""
    from .. import _explain

    with app.store.read() as conn:
        found = _explain.read(conn, name, runs=20)
    if found is None:
        return None
    row, job, task_runs = found.row, found.job, found.runs
    explained = _explain.build(found, now, app.settings.max_consecutive_failures)
    limit = row.max_consecutive_failures
    if limit is None:
        limit = app.settings.max_consecutive_failures
    return {
        "row": row,
        "job": job,
        "tone": explained["tone"],
        "state": explained["state"],
        "fires": next_fires(row, now) if row.enabled else [],
        "runs": task_runs,
        "decisions": explained["decisions"],
        "policies": {
            "cron": row.cron,
            "timezone": row.timezone,
            "handler": row.handler,
            "overlap": row.overlap,
            "catchup_window": row.catchup_window,
            "jitter": row.jitter,
            "max_consecutive_failures": limit or "unlimited",
        },
    }
