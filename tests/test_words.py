"""What the CLI and the dashboard say, where it was wrong or confusing (issue 24): run numbers
in a job's history, a backfilled task's last job, `explain` of a UTC and of a disabled task,
commands on the Task and health pages, `enable` of a task whose last job aborted, the worker
table after the workers stopped, ``TaskSpec.overlap``'s default, the clock warning's mode."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from test_cli_operators import Cli
from test_dashboard_http import client

from scheduler import ConfigError, PermanentError, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.status.health import touch
from scheduler.testing import ManualClock

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


def test_the_worker_table_after_the_workers_stopped(app: Scheduler, clock: ManualClock) -> None:
    web = client(app)
    assert "No worker has reported yet." in web.get("/health").text
    touch(app.store, "host:1:abc", T0, T0)  # a worker ran, then stopped
    clock.set(T0 + timedelta(minutes=5))
    page = client(app).get("/health").text
    assert "No worker has reported yet." not in page
    assert "No worker is running now" in page


def test_task_spec_overlap_defaults_to_hold_and_concurrent_is_allow(app: Scheduler) -> None:
    assert TaskSpec("x", "* * * * *", "h").overlap == "hold"
    assert TaskSpec("x", "* * * * *", "h", concurrent=True).overlap == "allow"
    assert TaskSpec("x", "* * * * *", "h", overlap="skip").policy == "skip"
    assert TaskSpec("x", "* * * * *", "h", overlap=None).overlap == "hold"  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="contradicting 'skip'"):
        app.sync([TaskSpec("x", "* * * * *", "works", concurrent=True, overlap="skip")])
    app.sync([TaskSpec("x", "* * * * *", "works", concurrent=True)])
    assert app.rows(limit=None)[0].overlap == "allow"


def test_the_clock_warning_names_the_clock_in_force(app: Scheduler) -> None:
    assert app.clock_mode == "local"  # SQLite: the host's clock, always
    touch(app.store, "far-host:1:x", T0, None, clock_offset=-5.0)
    (warning,) = [w for w in app.status()["health"]["warnings"] if "clock" in w]
    assert 'with clock = "local"' in warning and '"database"' not in warning
