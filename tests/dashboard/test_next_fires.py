"""A task's next fires are the same wherever they are shown: ``explain``, the dashboard's Task
page and ``status`` (its next run), for a task with ``jitter`` too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler.dashboard._views import task_page
from scheduler.testing import ManualClock

NOW = datetime(2030, 3, 30, 22, 0, tzinfo=UTC)  # Berlin springs forward in a few hours


@pytest.mark.parametrize("jitter", [0, 45])
@pytest.mark.parametrize("cron", ["*/20 * * * *", "30 2 * * *"])
def test_explain_the_dashboard_and_status_show_the_same_next_fires(
    tmp_path, cron: str, jitter: int
) -> None:
    clock = ManualClock(NOW)
    app = Scheduler(f"sqlite:///{tmp_path / 'x.db'}", registry=Registry(), clock=clock)
    app.migrate()
    app.sync([TaskSpec("t", cron, "h", timezone="Europe/Berlin", jitter=jitter)])
    explained = [datetime.fromisoformat(f["at"]) for f in app.explain("t")["next_fires"]]
    page = task_page(app, "t", clock())
    assert page is not None
    shown = [fire.at for fire in page["fires"]]
    assert len(explained) == 10 and shown == explained
    [row] = app.status()["rows"]
    assert datetime.fromisoformat(row["next_run_at"]) == explained[0]
    if jitter:  # each fire is its own slot's jittered instant, not the first one's
        slots = [datetime.fromisoformat(f["slot"]) for f in app.explain("t")["next_fires"]]
        pairs = list(zip(slots, shown, strict=True))
        assert all(slot <= at < slot + timedelta(seconds=jitter) for slot, at in pairs)
        assert len({at - slot for slot, at in pairs}) > 1
    app.close()
