"""What the CLI says to a user: "task" (never "row") in its help, errors, logs and
``status``; run numbers in a job's history and in the logs; a backfilled task's last job;
``explain`` of a UTC and of a disabled task; ``enable`` of a task whose last job aborted.
The dashboard's page for the same case is checked beside the command's output.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import Cli
from helpers.cli_project import migrated as migrated  # the fixture
from helpers.dashboard_client import client

from scheduler import PermanentError, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler.testing import ManualClock

ROW_WORD = re.compile(r"\brows?\b", re.IGNORECASE)  # row_disabled (a signal's name) is fine


def test_the_cli_help_says_task() -> None:
    from click.testing import CliRunner

    from scheduler.cli import cli

    runner = CliRunner()
    texts = {"": runner.invoke(cli, ["--help"]).output}
    for name in cli.list_commands(click_context()):
        texts[name] = runner.invoke(cli, [name, "--help"]).output
    assert {
        name: ROW_WORD.findall(text) for name, text in texts.items() if ROW_WORD.search(text)
    } == {}
    assert "Pause task NAME" in texts["disable"]


def click_context() -> Any:
    import click

    from scheduler.cli import cli

    return click.Context(cli)


def test_errors_logs_and_status_say_task(
    migrated: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    import logging

    from scheduler import SchedulerError, TaskSpec
    from scheduler.cli.output import print_status

    app = Scheduler(migrated, registry=Registry())
    try:
        print_status(app.status())
        assert capsys.readouterr().out.splitlines()[0] == "no tasks (run `scheduler sync`)"
        with pytest.raises(SchedulerError) as unknown:
            app.enable("nope")
        assert str(unknown.value) == "no task named 'nope' (run `scheduler sync`?)"

        @app.handler("t.fail", retry_safe=True, max_attempts=1)
        def fail(job: Any) -> None:
            raise ValueError("down")

        spec = TaskSpec(
            name="flaky", cron="0 3 * * *", handler="t.fail", max_consecutive_failures=1
        )
        app.sync([spec])
        with caplog.at_level(logging.DEBUG, logger="scheduler"):
            for _ in range(2):
                app.trigger("flaky")
                app.tick()
                app.work()
        with pytest.raises(SchedulerError) as disabled:
            app.trigger("flaky")
        assert str(disabled.value).startswith("task 'flaky' is disabled")
        said = [r.getMessage() for r in caplog.records if ROW_WORD.search(r.getMessage())]
        assert said == []
        assert any(
            "task flaky disabled after 1 consecutive failures" in r.getMessage()
            for r in caplog.records
        )
        print_status(app.status())
        out = capsys.readouterr().out
        assert "warning: task 'flaky' disabled" in out and not ROW_WORD.search(out)
    finally:
        app.close()


def test_reruns_log_their_run_number_and_the_worker_counts_runs(
    migrated: str, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from scheduler import TaskSpec
    from scheduler._worker.worker import Worker

    app = Scheduler(migrated, registry=Registry())
    try:

        @app.handler("t.fail", retry_safe=True, max_attempts=2, queue="default")
        def fail(job: Any) -> None:
            raise ValueError("down")

        app.sync(
            [TaskSpec(name="flaky", cron="0 3 * * *", handler="t.fail", max_consecutive_failures=0)]
        )
        with caplog.at_level(logging.INFO, logger="scheduler"):
            for _ in range(3):
                app.trigger("flaky")
                app.tick()
                app.work()  # attempt 1; attempt 2 waits out its back-off
                with app.store.begin() as conn:  # make the retry ready now
                    from sqlalchemy import update

                    from scheduler._store.tables import jobs

                    conn.execute(update(jobs).values(run_at=app.clock()))
                app.work()
        said = [
            r.getMessage().split(" raised")[0] for r in caplog.records if "raised" in r.getMessage()
        ]
        job = app.get_row("flaky").last_job_id  # type: ignore[union-attr]
        assert said == [  # every one was "attempt 1/2" or "attempt 2/2" before
            f"job {job} (t.fail, task flaky) run {run}, attempt {attempt}/2"
            for run in (1, 2, 3)
            for attempt in (1, 2)
        ]
        caplog.clear()
        app.trigger("flaky")
        with caplog.at_level(logging.INFO, logger="scheduler"):
            Worker(app, concurrency=1).run(once=True)
        assert any(r.getMessage().endswith("stopped after 1 run(s)") for r in caplog.records)
    finally:
        app.close()


T0 = datetime(2030, 1, 1, tzinfo=UTC)


FLAKY = TaskSpec("flaky", "*/10 * * * *", "fails", timezone="UTC")


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


@pytest.fixture
def cli(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.delenv("SCHEDULER_CONFIG", raising=False)
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    config = tmp_path / "app.toml"
    config.write_text(f'[database]\nurl = "{db}"\n')
    return Cli(config, capsys)


def three_runs(app: Scheduler, clock: ManualClock) -> int:
    """The task `flaky` dispatched at 00:10, rerun in place at 00:20 and 00:30: one job, three
    runs of attempt 1 each; returns the job's id."""
    app.sync([FLAKY])
    for minute in (10, 20, 30):
        clock.set(T0 + timedelta(minutes=minute))
        app.tick()
        app.work()
    row = app.get_row("flaky")
    assert row is not None and row.last_job_id is not None
    return row.last_job_id


def test_a_job_history_numbers_its_runs(app: Scheduler, clock: ManualClock, cli: Cli) -> None:
    job_id = three_runs(app, clock)
    assert [(r["run"], r["attempt"]) for r in app.history(job_id)] == [(1, 1), (2, 1), (3, 1)]
    lines = cli.ok("job", str(job_id)).splitlines()
    header = lines.index(next(line for line in lines if line.startswith("RUN")))
    assert lines[header].split()[:2] == ["RUN", "ATTEMPT"]
    assert [line.split()[:2] for line in lines[header + 1 :]] == [
        ["1", "1"],
        ["2", "1"],
        ["3", "1"],
    ]
    runs = json.loads(cli.ok("job", str(job_id), "--json"))["runs"]
    assert [r["run"] for r in runs] == [1, 2, 3]
    explained = app.explain("flaky")["runs"]  # newest first
    assert [(r["job_id"], r["run"]) for r in explained] == [(job_id, 3), (job_id, 2), (job_id, 1)]
    assert f"job {job_id} run 3 attempt 1" in cli.ok("explain", "flaky")
    web = client(app)
    task_page = web.get("/tasks/flaky").text
    assert "run 3 · attempt 1" in task_page and "run 1 · attempt 1" in task_page
    job_page = web.get(f"/jobs/{job_id}").text
    assert '<th class="num">Run</th>' in job_page


def test_a_backfilled_task_shows_its_last_job(app: Scheduler, clock: ManualClock, cli: Cli) -> None:
    app.sync([TaskSpec("backfilled", "0 * * * *", "works", timezone="UTC")])
    clock.set(T0 + timedelta(days=1))
    app.backfill("backfilled", T0, T0 + timedelta(hours=3))
    app.work()
    (row,) = app.status()["rows"]
    assert (row["last_job_state"], row["last_job_id"]) == ("succeeded", None)
    table = cli.ok("status").splitlines()
    assert "succeeded (backfill)" in table[1]
    tasks_page = client(app).get("/tasks").text
    assert "no run yet" not in tasks_page and "a backfilled job" in tasks_page


def test_explain_of_a_utc_task_and_of_a_disabled_one(app: Scheduler, cli: Cli) -> None:
    app.sync([TaskSpec("utc", "0 3 * * *", "works", timezone="UTC")])
    text = cli.ok("explain", "utc")
    assert "next fires (UTC):" in text and "UTC | UTC" not in text
    fire = next(line for line in text.splitlines() if line.startswith("  20"))
    assert fire.count("03:00:00") == 1  # each instant once
    app.disable("utc")
    text = cli.ok("explain", "utc")
    assert "none: the task is disabled (`scheduler enable utc` re-arms it)" in text
    assert app.explain("utc")["next_fires"] == []
    page = client(app).get("/tasks/utc").text
    assert "None while the task is disabled" in page


def test_enable_says_the_aborted_last_job_counts_at_its_next_slot(
    app: Scheduler, clock: ManualClock, cli: Cli
) -> None:
    app.sync([TaskSpec("flaky", "*/10 * * * *", "fails", max_consecutive_failures=1)])
    for minute in (10, 20):
        clock.set(T0 + timedelta(minutes=minute))
        app.tick()
        app.work()
    row = app.get_row("flaky")
    assert row is not None and not row.enabled
    out = cli.ok("enable", "flaky").splitlines()
    assert out[0] == "enabled 'flaky': failures reset, next run computed from now"
    assert out[1].startswith(f"its last job ({row.last_job_id}) is aborted: its next slot reruns")
    warnings = app.status()["health"]["warnings"]
    assert any("its last run aborted (boom)" in w and "(1 of 1 " in w for w in warnings)
