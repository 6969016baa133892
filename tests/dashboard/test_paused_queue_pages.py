"""A paused queue on the dashboard (Starlette's TestClient, real databases): the Queues page
marks it paused, even with no job, and the health page says so, without an overdue or
stalled warning for its waiting jobs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.testclient import TestClient

from scheduler import Scheduler
from scheduler._config import DashboardSettings
from scheduler._model.handlers import Registry
from scheduler.dashboard import create_app
from scheduler.testing import ManualClock

T0 = datetime(2026, 12, 5, 10, 30, tzinfo=UTC)


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    found = Scheduler(db_url, registry=Registry(), clock=ManualClock(T0))

    @found.handler("reports", queue="reports")
    def reports(job: Any) -> None:
        return None

    yield found
    found.close()


def _row(page: str, queue: str) -> str:
    return page.split(f'<tr data-queue="{queue}"', 1)[1].split("</tr>", 1)[0]


def _client(app: Scheduler) -> TestClient:
    """A dashboard of its own: the health page's status is cached per refresh interval."""
    return TestClient(create_app(app, DashboardSettings()), follow_redirects=False)


def test_the_queues_and_health_pages_show_a_paused_queue(app: Scheduler) -> None:
    c = _client(app)
    app.pause_queue("idle", reason="no jobs yet")  # listed though it has no job
    app.enqueue("reports", run_at=T0 - timedelta(hours=1))
    page = c.get("/queues").text
    assert ">paused</span>" in _row(page, "idle")
    assert "paused" not in _row(page, "reports")
    health = c.get("/health").text
    assert "overdue" in health and "work has stalled" in health  # before the pause
    app.pause_queue("reports", reason="vendor outage", actor="ann")
    assert 'class="paused"' in _row(c.get("/queues").text, "reports")
    c = _client(app)
    health = c.get("/health").text
    assert "Queue <code>reports</code> is paused (since 2026-12-05T10:30:00Z, by ann:" in health
    assert "vendor outage" in health
    assert "work has stalled" not in health and "not claimed" not in health
