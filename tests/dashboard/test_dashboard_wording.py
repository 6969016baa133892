"""What the dashboard says: commands on the Task and health pages are code, not backticks; the
worker table before any worker reported and after the workers stopped.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers.dashboard_client import client

from scheduler import PermanentError, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.status.health import touch
from scheduler.testing import ManualClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def db(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "words.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def app(db: str, clock: ManualClock) -> Iterator[Scheduler]:
    found = Scheduler(db, registry=Registry(), clock=clock)

    @found.handler("fails")
    def fails(job: object) -> None:
        raise PermanentError("boom")

    @found.handler("works")
    def works(job: object) -> None:
        return None

    yield found
    found.close()


def test_commands_on_the_dashboard_are_code_not_backticks(
    app: Scheduler, clock: ManualClock
) -> None:
    app.sync([TaskSpec("flaky", "*/10 * * * *", "fails", max_consecutive_failures=1)])
    for minute in (10, 20):
        clock.set(T0 + timedelta(minutes=minute))
        app.tick()
        app.work()
    row = app.get_row("flaky")
    assert row is not None and not row.enabled  # disabled by its failures
    web = client(app)
    task_page = web.get("/tasks/flaky").text
    state = re.search(r'<p id="state-sentence">(.*?)</p>', task_page, re.S)
    assert state is not None and "`" not in state[1]
    assert "<code>scheduler enable flaky</code>" in state[1]
    health = web.get("/health").text
    assert "<code>scheduler enable flaky</code>" in health and "`scheduler" not in health


def test_the_worker_table_after_the_workers_stopped(app: Scheduler, clock: ManualClock) -> None:
    web = client(app)
    assert "No worker has reported yet." in web.get("/health").text
    touch(app.store, "host:1:abc", T0, T0)  # a worker ran, then stopped
    clock.set(T0 + timedelta(minutes=5))
    page = client(app).get("/health").text
    assert "No worker has reported yet." not in page
    assert "No worker is running now" in page
