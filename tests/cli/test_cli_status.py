"""What ``status`` shows after the first runs: a ``worker --once`` with no job threads ticks and
exits, ticks through the Python API count (recorded at most every few seconds), a worker
that ran once or stopped cleanly, and a failed run at once.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers.cli_project import COMMAND, clean_env, ok, project, run
from helpers.cli_project import migrated as migrated  # the fixture

from scheduler import Scheduler
from scheduler._model.handlers import Registry


@pytest.mark.parametrize("how", ["config", "flag"])
def test_worker_once_with_concurrency_0_ticks_and_exits(
    tmp_path: Path, migrated: str, how: str
) -> None:
    """The "tick only" node of a web/worker split: tick, housekeeping, exit 0."""
    worker = "concurrency = 0\n" if how == "config" else ""
    project(tmp_path, migrated, worker=worker)
    ok(run(tmp_path, "sync"))
    ok(run(tmp_path, "trigger", "every-second"))
    args = ["worker", "--once"] + (["--concurrency", "0"] if how == "flag" else [])
    result = run(tmp_path, *args, timeout=20)  # looped for ever before the fix
    assert result.returncode == 0, result.stderr
    assert "tick: dispatched every-second" in result.stderr
    reader = Scheduler(migrated, registry=Registry())
    try:
        assert reader.status()["jobs"]["queued"] == 1  # dispatched, and not run here
    finally:
        reader.close()


def test_ticks_through_the_python_api_count_for_status(migrated: str) -> None:
    from scheduler import TaskSpec

    app = Scheduler(migrated, registry=Registry())
    try:
        app.handler("t.ok", retry_safe=True)(lambda job: None)
        app.sync([TaskSpec(name="every-second", cron="* * * * * *", handler="t.ok")])
        before = datetime.now(UTC)
        app.tick()
        app.work()
        health = app.status()["health"]
        assert health["warnings"] == []  # "no worker is running" before
        assert before <= datetime.fromisoformat(health["last_tick_at"]) <= datetime.now(UTC)
        assert health["workers"] == []  # no `scheduler worker` runs
    finally:
        app.close()


def test_the_api_records_its_ticks_at_most_every_few_seconds(migrated: str) -> None:
    """The idle tick stays one statement; the record is one more, once per TICK_RECORD_SECONDS
    of the app's clock (per Scheduler object, so per process)."""
    from sqlalchemy import event

    from scheduler._app import TICK_RECORD_SECONDS

    now = [datetime(2030, 1, 7, 12, 0, tzinfo=UTC)]
    app = Scheduler(migrated, registry=Registry(), clock=lambda: now[0])
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            statements.append(statement.split()[0].upper())

    try:
        app.check_schema()
        event.listen(app.store.engine, "before_cursor_execute", count)
        per_tick = []
        for step in (0, 1, TICK_RECORD_SECONDS - 1.5, 0.5, 1, TICK_RECORD_SECONDS):
            now[0] += timedelta(seconds=step)
            statements.clear()
            app.tick()
            per_tick.append(list(statements))
        # the first tick of the process: due rows, probing rows (read once, then only when
        # one is due); then its record registers the entry
        first = ["SELECT", "SELECT", "UPDATE", "INSERT"]
        assert per_tick == [
            first,
            ["SELECT"],
            ["SELECT"],
            ["SELECT", "UPDATE"],  # TICK_RECORD_SECONDS after the first record
            ["SELECT"],
            ["SELECT", "UPDATE"],
        ]
        last = app.status()["health"]["last_tick_at"]
        assert last == (now[0]).isoformat().replace("+00:00", "Z")
    finally:
        app.close()


def _status_text(cwd: Path) -> str:
    return ok(run(cwd, "status"))


def test_status_after_a_once_worker_and_after_a_clean_stop(tmp_path: Path, migrated: str) -> None:
    import signal
    import time

    project(tmp_path, migrated)
    ok(run(tmp_path, "sync"))
    ok(run(tmp_path, "worker", "--once"))
    text = _status_text(tmp_path)
    assert ", 0 worker(s)" in text and "last tick -" not in text  # "1 worker(s)" before
    assert "warning:" not in text

    reader = Scheduler(migrated, registry=Registry())
    worker = subprocess.Popen(
        [*COMMAND, "worker"], cwd=tmp_path, env=clean_env(), stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while not reader.status()["health"]["workers"]:
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.2)
        ticked = reader.status()["health"]["last_tick_at"]
        while reader.status()["health"]["last_tick_at"] == ticked:  # a tick of its own
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    health = reader.status()["health"]
    reader.close()
    assert health["workers"] == [] and health["warnings"] == []
    last = datetime.fromisoformat(health["last_tick_at"])
    assert datetime.now(UTC) - last < timedelta(seconds=10)  # "last tick -" before
    text = _status_text(tmp_path)
    assert f"last tick {health['last_tick_at']}, 0 worker(s)" in text


def test_a_failed_run_shows_in_status_at_once(migrated: str) -> None:
    from scheduler import TaskSpec

    class ServiceDown(Exception):
        code = "service_down"

    app = Scheduler(migrated, registry=Registry())
    try:

        @app.handler("t.fail", retry_safe=True, max_attempts=1)
        def fail(job: Any) -> None:
            raise ServiceDown("down")

        app.sync(
            [
                TaskSpec(
                    name="check", cron="0 3 * * *", handler="t.fail", max_consecutive_failures=3
                ),
                TaskSpec(
                    name="free", cron="0 3 * * *", handler="t.fail", max_consecutive_failures=0
                ),
            ]
        )
        app.trigger("check")
        app.trigger("free")
        app.tick()
        app.work()
        data = app.status()
        check, free = data["rows"]
        assert (check["last_job_state"], check["consecutive_failures"]) == ("aborted", 0)
        assert (check["failing"], check["last_error_code"]) == (True, "service_down")
        assert data["health"]["warnings"] == [  # no warning before
            "task 'check': its last run aborted (service_down); the failure is counted at"
            " its next slot, which reruns the job in place (1 of 3 before the task is"
            " disabled)",
            "task 'free': its last run aborted (service_down); the failure is counted at"
            " its next slot, which reruns the job in place (no limit)",
        ]
        app.disable("free")
        free = app.status()["rows"][1]
        assert free["failing"] is False and free["next_run_at"] is None  # a time before
        assert free["next_run_local"] is None
    finally:
        app.close()
