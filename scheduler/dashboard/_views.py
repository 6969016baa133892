"""What each page shows, built from the app's reads; no HTTP here.

The Task page shows what ``explain`` returns (scheduler/_ops/explain.py): the state sentence, the
decisions and the policies, read in explain's three statements; the next fires are drawn here
(the :class:`Fire` the template marks).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from .._model import slots as _slots
from .._model.rows import TaskRow
from .._model.time import in_zone

if TYPE_CHECKING:
    from .._app import Scheduler


def _at(value: datetime | None, zone: str = "UTC") -> str:
    if value is None:
        return "-"
    local = in_zone(value, ZoneInfo(zone))
    utc = "" if zone == "UTC" else f" ({value:%H:%M:%S}Z)"
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}{utc}"


def _fires(row: TaskRow, now: datetime) -> list[_slots.Fire]:
    """The Task page's next fires: the same as ``explain``'s (an enabled row's only)."""
    if not row.enabled:
        return []
    return _slots.next_fires(row, now, _slots.NEXT_FIRES, next_run_at=row.next_run_at)


def task_page(app: Scheduler, name: str, now: datetime) -> dict[str, Any] | None:
    """Three statements (``scheduler/_store/status/explain.py``): the row with its last job,
    its decisions, its last runs; the sentence, the fires and the policies are ``explain``'s."""
    from .._ops import explain as _explain
    from .._store.status.explain import read

    with app.store.read() as conn:
        found = read(conn, name, runs=20)
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
        "fires": _fires(row, now),
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
