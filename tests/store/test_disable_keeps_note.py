"""A second ``disable`` without a reason keeps the note the first one left (issue 37, item 5),
on SQLite, PostgreSQL (also through PgBouncer) and MariaDB."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler.testing import ManualClock

NOW = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)


@pytest.fixture
def sched(db_url: str) -> Any:
    app = Scheduler(db_url, registry=Registry(), clock=ManualClock(NOW))
    app.put_task(TaskSpec(name="nightly", cron="0 3 * * *", handler="t.ok", payload={}))
    yield app
    app.close()


def note(app: Scheduler) -> str | None:
    row = app.get_row("nightly")
    assert row is not None and not row.enabled
    return row.disabled_note


def test_a_second_disable_without_a_reason_keeps_the_note(sched: Scheduler) -> None:
    sched.disable("nightly", reason="vendor API down until Monday", actor="ops")
    sched.disable("nightly", actor="ops")
    assert note(sched) == "vendor API down until Monday"


def test_a_second_disable_with_a_reason_replaces_the_note(sched: Scheduler) -> None:
    sched.disable("nightly", reason="vendor API down")
    sched.disable("nightly", reason="waiting for the new contract")
    assert note(sched) == "waiting for the new contract"


def test_enable_then_disable_without_a_reason_has_no_note(sched: Scheduler) -> None:
    sched.disable("nightly", reason="vendor API down")
    sched.enable("nightly")
    sched.disable("nightly")
    assert note(sched) is None
