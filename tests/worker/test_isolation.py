"""``@app.handler(isolation="process")``: each attempt in a spawned child process with the job
API inside, sent SIGTERM when stopped (timeout, cancel) and killed after ``cancel_grace``.
Real workers, real child processes, real signals, real time."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import isolated_jobs
from helpers.worker_thread import Running, wait_until

from scheduler import Scheduler
from scheduler._model.handlers import Registry

LIMIT = 0.5
GRACE = 1.5


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    found = Scheduler(db_url, registry=Registry(), concurrency=2, cancel_grace=GRACE)
    yield found
    found.close()


def _ended(app: Scheduler, job_id: int) -> tuple[str, str | None] | None:
    job = app.get_job(job_id)
    assert job is not None
    return (job.state, job.last_error_code) if job.state in ("succeeded", "aborted") else None


def _seen(out: Path) -> dict[str, Any]:
    return wait_until(lambda: out.exists() and out.read_text() and json.loads(out.read_text()))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_busy_loop_is_stopped_at_its_timeout_by_sigterm(app: Scheduler, tmp_path: Path) -> None:
    app.handler("p.busy", timeout=LIMIT, max_attempts=1, isolation="process")(isolated_jobs.busy)
    out = tmp_path / "busy.json"
    job_id = app.enqueue("p.busy", {"out": str(out)})
    with Running(app) as worker:
        pid = _seen(out)["pid"]
        began = time.monotonic()
        assert pid != os.getpid() and not _gone(pid)
        assert wait_until(lambda: _ended(app, job_id)) == ("aborted", "timeout")
        took = time.monotonic() - began
        assert took < LIMIT + GRACE  # SIGTERM stopped it: no wait for the kill
        assert _gone(pid)
        assert worker.stuck_threads() == 0  # the thread that waited on it is free again


def test_a_busy_loop_is_stopped_by_a_cancel(app: Scheduler, tmp_path: Path) -> None:
    app.handler("p.busy", isolation="process")(isolated_jobs.busy)
    out = tmp_path / "busy.json"
    job_id = app.enqueue("p.busy", {"out": str(out)})
    with Running(app):
        pid = _seen(out)["pid"]
        time.sleep(0.6)  # the worker looks for cancels of attempts running half a second
        asked = time.monotonic()
        assert app.cancel_job(job_id).state == "claimed"
        assert wait_until(lambda: _ended(app, job_id)) == ("aborted", "cancelled")
        assert time.monotonic() - asked < 2.0 + GRACE
        wait_until(lambda: _gone(pid))


def test_a_child_that_ignores_sigterm_in_a_blocking_call_is_killed_after_the_grace(
    app: Scheduler, tmp_path: Path
) -> None:
    app.handler("p.stubborn", timeout=LIMIT, max_attempts=1, isolation="process")(
        isolated_jobs.stubborn
    )
    out = tmp_path / "stubborn.json"
    job_id = app.enqueue("p.stubborn", {"out": str(out)})
    with Running(app) as worker:
        pid = _seen(out)["pid"]
        began = time.monotonic()
        assert wait_until(lambda: _gone(pid), 15)
        killed = time.monotonic() - began
        assert LIMIT + GRACE - 0.3 <= killed < LIMIT + GRACE + 8.0  # not before the grace; slack
        assert wait_until(lambda: _ended(app, job_id)) == ("aborted", "timeout")
        wait_until(lambda: worker.stuck_threads() == 0)  # its thread came back


def test_the_child_sees_the_job_api_and_its_errors_are_outcomes(
    app: Scheduler, tmp_path: Path
) -> None:
    app.handler("p.reports", isolation="process")(isolated_jobs.reports)
    app.handler("p.refuses", isolation="process")(isolated_jobs.refuses)
    out = tmp_path / "reports.json"
    job_id = app.enqueue("p.reports", {"out": str(out), "n": 7})
    refused = app.enqueue("p.refuses", {"out": str(tmp_path / "unused.json")})
    assert app.work() == 2  # app.work() runs it in a child as well
    seen = json.loads(out.read_text())
    assert seen["pid"] != os.getpid()
    assert {k: seen[k] for k in ("id", "handler", "attempt", "max_attempts", "queue")} == {
        "id": job_id,
        "handler": "p.reports",
        "attempt": 1,
        "max_attempts": 3,
        "queue": "default",
    }
    assert seen["payload"] == {"out": str(out), "n": 7}
    assert seen["slot"] is None and seen["cancel_requested"] is False
    assert _ended(app, job_id) == ("succeeded", None)
    assert _ended(app, refused) == ("aborted", "bad_input")


def test_a_child_starts_with_the_handler_and_the_scheduler_imported(
    app: Scheduler, tmp_path: Path
) -> None:
    """The fork server imports the handler's module and the scheduler once, before it forks:
    a child does not import them again at each attempt (it would cost a few tenths of a second
    where SQLAlchemy comes with them)."""
    app.handler("p.where", isolation="process")(isolated_jobs.where_imported)
    out = tmp_path / "where.json"
    first = app.enqueue("p.where", {"out": str(out)})
    with Running(app):
        assert wait_until(lambda: _ended(app, first), 30) == ("succeeded", None)
        seen = json.loads(out.read_text())
        second = app.enqueue("p.where", {"out": str(out)})
        assert wait_until(lambda: _ended(app, second), 30) == ("succeeded", None)
        again = json.loads(out.read_text())
    assert seen["pid"] != os.getpid() and again["pid"] != seen["pid"]  # children of their own
    for each in (seen, again):
        assert each["imported_in"] not in (each["pid"], os.getpid())  # the fork server's import
        assert each["worker_module"] is True
    assert seen["imported_in"] == again["imported_in"]  # one server, imported once


def test_bad_isolation_is_refused_at_registration() -> None:
    registry = Registry()
    with pytest.raises(ValueError) as refused:
        registry.handler("p.x", isolation="fork")
    assert (
        str(refused.value) == "handler 'p.x': isolation must be 'thread' or 'process', got 'fork'"
    )

    def local(job: Any) -> None:
        return None

    with pytest.raises(ValueError, match="needs a function defined at the top level"):
        registry.handler("p.local", isolation="process")(local)

    async def later(job: Any) -> None:
        return None

    with pytest.raises(ValueError, match="is for sync functions"):
        registry.handler("p.async", isolation="process")(later)
    assert registry.names() == []
