"""What a new user trips over (issue 11): each test here failed before its fix.

The commands run as real subprocesses on real SQLite files (and the PostgreSQL server where
it matters), as a person at a terminal would run them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store import migrate as _migrate

COMMAND = [sys.executable, "-m", "scheduler.cli"]

JOBS = """
from scheduler import default_registry

@default_registry.handler("t.ok", retry_safe=True)
def ok(job):
    pass

class ServiceDown(Exception):
    code = "service_down"

@default_registry.handler("t.fail", retry_safe=True, max_attempts=1)
def fail(job):
    raise ServiceDown("the service did not answer")
"""

TASK_OK = '[[tasks]]\nname = "every-second"\ncron = "* * * * * *"\nhandler = "t.ok"\n'


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SCHEDULER_CONFIG", "SCHEDULER_DATABASE_URL")
    }
    return env | extra


def run(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    return lines[0]


def project(
    directory: Path, url: str, *, tasks: str = TASK_OK, worker: str = "", name: str = "app.toml"
) -> Path:
    """A config file and its handler module ``first_jobs.py`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "first_jobs.py").write_text(JOBS)
    path = directory / name
    path.write_text(
        f'[database]\nurl = "{url}"\n\n[worker]\nimports = ["first_jobs"]\n{worker}\n{tasks}'
    )
    return path


@pytest.fixture
def migrated(tmp_path: Path, sqlite_template: Path) -> str:
    db = tmp_path / "first.db"
    shutil.copy(sqlite_template, db)
    return f"sqlite:///{db}"


# -- 1. worker --once with concurrency 0 ---------------------------------------------------
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


# -- 10. TaskSpec takes the file's defaults -------------------------------------------------
def test_taskspec_takes_the_same_defaults_as_the_file(migrated: str) -> None:
    from scheduler import TaskSpec

    spec = TaskSpec(name="t", cron="0 3 * * *", handler="t.ok")  # TypeError before
    assert (spec.payload, spec.concurrent, spec.enabled, spec.max_consecutive_failures) == (
        {},
        False,
        True,
        None,
    )
    assert TaskSpec(name="u", cron="0 3 * * *", handler="t.ok").payload is not spec.payload
    # timezone: the app's [scheduler] timezone, as a task without one in the file gets.
    berlin = Scheduler(migrated, registry=Registry(), timezone="Europe/Berlin")
    try:
        berlin.sync(
            [spec, TaskSpec(name="tokyo", cron="0 3 * * *", handler="t.ok", timezone="Asia/Tokyo")]
        )
        assert berlin.get_row("t").timezone == "Europe/Berlin"  # type: ignore[union-attr]
        assert berlin.get_row("tokyo").timezone == "Asia/Tokyo"  # type: ignore[union-attr]
    finally:
        berlin.close()
    plain = Scheduler(migrated, registry=Registry(), tasks=[spec])
    try:
        plain.sync()
        assert plain.get_row("t").timezone == "UTC"  # type: ignore[union-attr]
        assert plain.get_row("t").payload == {}  # type: ignore[union-attr]
    finally:
        plain.close()


# -- 4. a relative SQLite path, and read-only commands ----------------------------------
def test_relative_sqlite_path_is_the_config_folders(tmp_path: Path) -> None:
    """`scheduler -c tutorial/app.toml ...` from the parent folder uses tutorial/tutorial.db,
    and imports the handler modules that sit next to the file."""
    project(tmp_path / "tutorial", "sqlite:///tutorial.db")
    ok(run(tmp_path, "-c", "tutorial/app.toml", "migrate"))
    assert (tmp_path / "tutorial" / "tutorial.db").is_file()
    assert not (tmp_path / "tutorial.db").exists()
    ok(run(tmp_path, "-c", "tutorial/app.toml", "sync"))
    ok(run(tmp_path, "-c", "tutorial/app.toml", "trigger", "every-second"))
    worker = run(tmp_path, "-c", "tutorial/app.toml", "worker", "--once")
    assert worker.returncode == 0, worker.stderr  # first_jobs.py sits next to app.toml
    assert "(t.ok) succeeded" in worker.stderr


def test_config_relative_url_in_load_config_and_env_url_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler import load_config

    path = project(tmp_path / "proj", "sqlite:///data/app.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    config = load_config("proj/app.toml")
    assert config.database_url == f"sqlite:///{tmp_path / 'proj' / 'data' / 'app.db'}"
    assert config.database_source == "[database] url in proj/app.toml"
    for same in ("sqlite:////abs/x.db", "sqlite://", "sqlite:///:memory:"):
        path.write_text(f'[database]\nurl = "{same}"\n')
        assert load_config(path).database_url == same
    # The environment's URL is the shell's: relative to the working directory, as given.
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", "sqlite:///here.db")
    config = load_config(path)
    assert (config.database_url, config.database_source) == (
        "sqlite:///here.db",
        "SCHEDULER_DATABASE_URL",
    )


def test_read_only_commands_never_create_the_database(tmp_path: Path) -> None:
    project(tmp_path / "proj", "sqlite:///missing.db")
    db = tmp_path / "proj" / "missing.db"
    commands = [
        ["status"],
        ["status", "--json"],
        ["sync", "--dry-run"],
        ["sync"],
        ["tick"],
        ["enable", "every-second"],
        ["disable", "every-second"],
        ["trigger", "every-second"],
        ["worker", "--once"],
    ]
    procs = [
        subprocess.Popen(
            [*COMMAND, "-c", "proj/app.toml", *args],
            cwd=tmp_path,
            env=clean_env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for args in commands
    ]
    for args, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        line = one_error_line(subprocess.CompletedProcess(args, proc.returncode, out, err))
        assert line == (
            f"error: database {db} ([database] url in {tmp_path / 'proj' / 'app.toml'})"
            " does not exist: create it with `scheduler --config proj/app.toml migrate`"
        ), args
    assert not db.exists() and sorted(p.name for p in (tmp_path / "proj").iterdir()) == [
        "app.toml",
        "first_jobs.py",
    ]
    assert not (tmp_path / "missing.db").exists()


def test_schema_errors_name_the_database(tmp_path: Path) -> None:
    project(tmp_path, "sqlite:///empty.db")
    (tmp_path / "empty.db").touch()  # exists, but no tables
    line = one_error_line(run(tmp_path, "status"))  # ./app.toml: `scheduler migrate` is right
    assert line == (
        f"error: database {tmp_path / 'empty.db'} ([database] url in {tmp_path / 'app.toml'}):"
        f" schema is at revision none, this version needs {_migrate.head_revision()}:"
        " run `scheduler migrate`"
    )


# -- 5. database URLs without a driver, and a database that does not exist ---------------
def test_postgres_urls_without_a_driver_use_psycopg(pg_url: str, tmp_path: Path) -> None:
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    short = pg_url.replace("postgresql+psycopg://", "postgres://")
    for url in (plain, short):
        app = Scheduler(url, registry=Registry())  # "Can't load plugin" before
        try:
            assert app.status()["jobs"] == {"queued": 0, "claimed": 0, "succeeded": 0, "aborted": 0}
        finally:
            app.close()
    from scheduler._store.settings import normalize_database_url

    assert normalize_database_url(plain, "x") == normalize_database_url(short, "x") == pg_url
    assert normalize_database_url("mysql://root@h/db", "x") == "mysql+pymysql://root@h/db"
    assert normalize_database_url("mariadb://root@h/db", "x") == "mariadb+pymysql://root@h/db"
    # The CLI, from the file and from the environment.
    project(tmp_path, plain)
    assert json.loads(ok(run(tmp_path, "status", "--json")))["rows"] == []
    env = clean_env(SCHEDULER_DATABASE_URL=short)
    project(tmp_path, "sqlite:///unused.db")
    assert json.loads(ok(run(tmp_path, "status", "--json", env=env)))["rows"] == []
    assert not (tmp_path / "unused.db").exists()


def test_a_database_that_does_not_exist_says_so_and_how_to_create_it(
    direct_pg_url: str, tmp_path: Path
) -> None:
    pg_url = direct_pg_url  # the server's own answer (PgBouncer answers "no such database")
    server = pg_url.split("?")[0].rsplit("/", 1)[0]  # postgresql+psycopg://postgres@host:port
    missing = f"{server}/sched_no_such_database_11".replace("+psycopg", "")
    project(tmp_path, missing)
    env = clean_env(SCHEDULER_DATABASE_URL=missing.replace("postgresql:", "postgres:"))
    from_file, from_env = (run(tmp_path, "status"), run(tmp_path, "sync", env=env))
    shown = missing.replace("postgresql:", "postgresql+psycopg:")
    how = "create it with `createdb -h 127.0.0.1 -p 5432 -U postgres sched_no_such_database_11`"
    assert one_error_line(from_file) == (
        f"error: database {shown} ([database] url in {tmp_path / 'app.toml'}) does not exist"
        f" on the server: {how}, then run `scheduler migrate`"
    )
    assert one_error_line(from_env) == (
        f"error: database {shown} (SCHEDULER_DATABASE_URL) does not exist on the server:"
        f" {how}, then run `scheduler migrate`"
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgress://u@h/db", "unknown database kind 'postgress': expected sqlite:///FILE.db,"),
        ("not a url", "not a database URL: expected sqlite:///FILE.db,"),
        (
            "postgresql+pg8000://u@h/db",
            "the database driver is not installed (No module named 'pg8000'): install it, or"
            " write postgresql://… for psycopg (pip install 'rerun-scheduler[postgres]')",
        ),
    ],
)
def test_a_bad_database_url_is_one_line_naming_its_source(
    tmp_path: Path, url: str, says: str
) -> None:
    project(tmp_path, "sqlite:///unused.db")
    line = one_error_line(run(tmp_path, "status", env=clean_env(SCHEDULER_DATABASE_URL=url)))
    assert line.startswith(f"error: SCHEDULER_DATABASE_URL: {says}"), line


# -- 6. a handler nobody registered ---------------------------------------------------------
UNKNOWN = (
    '[[tasks]]\nname = "t1"\ncron = "0 3 * * *"\nhandler = "t.okk"\n\n'
    '[[tasks]]\nname = "t2"\ncron = "0 3 * * *"\nhandler = "t.ok"\n\n'
    '[[tasks]]\nname = "t3"\ncron = "0 3 * * *"\nhandler = "nobody"\n'
)


def test_sync_warns_and_the_worker_refuses_an_unknown_handler(
    tmp_path: Path, migrated: str
) -> None:
    project(tmp_path, migrated, tasks=UNKNOWN)
    synced = run(tmp_path, "sync")
    assert synced.returncode == 0, synced.stderr
    assert synced.stdout.splitlines()[0] == "insert:    t1, t2, t3"
    imports = "not registered by [worker] imports (first_jobs)"
    assert synced.stderr.splitlines() == [
        f"warning: task 't1': handler 't.okk' is {imports}; did you mean 't.ok'?",
        f"warning: task 't3': handler 'nobody' is {imports}",
    ]
    refused, allowed = (
        run(tmp_path, "worker", "--once"),
        run(tmp_path, "worker", "--once", "--allow-unknown-handlers"),
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.splitlines() == [
        f"error: task 't1': handler 't.okk' is {imports}; did you mean 't.ok'?",
        f"error: task 't3': handler 'nobody' is {imports}",
        "error: the worker does not start with unknown handlers: fix the tasks or"
        " [worker] imports, or pass --allow-unknown-handlers",
    ]
    assert allowed.returncode == 0, allowed.stderr
    assert f"WARNING scheduler.cli: task 't1': handler 't.okk' is {imports}" in allowed.stderr


def test_many_tasks_on_one_unknown_handler_are_one_line(tmp_path: Path, migrated: str) -> None:
    tasks = "".join(
        f'[[tasks]]\nname = "c{i}"\ncron = "0 3 * * *"\nhandler = "billing.invoice"\n\n'
        for i in range(5)
    )
    project(tmp_path, migrated, tasks=tasks)
    synced = run(tmp_path, "sync")
    assert synced.returncode == 0, synced.stderr
    assert synced.stderr.splitlines() == [
        "warning: tasks 'c0', 'c1', 'c2' and 2 more (5): handler 'billing.invoice' is not"
        " registered by [worker] imports (first_jobs)"
    ]


def test_sync_says_when_it_cannot_check_the_handlers(tmp_path: Path, migrated: str) -> None:
    path = project(tmp_path, migrated, tasks=UNKNOWN)
    path.write_text(path.read_text().replace('"first_jobs"', '"first_jobs", "not_there"'))
    synced = run(tmp_path, "sync")
    assert synced.returncode == 0, synced.stderr
    assert synced.stderr.splitlines() == [
        "warning: handlers not checked: cannot import 'not_there' from [worker] imports:"
        " No module named 'not_there'"
    ]


# -- 2. status after ticks through the API, a --once worker, a clean stop -----------------
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
        record = ["SELECT", "UPDATE", "INSERT"]  # the first record registers the entry
        assert per_tick == [
            record,  # the first tick of the process
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


# -- 7. a failed run shows at once; 9. a disabled task has no next run ---------------------
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


# -- 8. "task" wherever a user reads ------------------------------------------------------
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


# -- 9. logs that tell runs apart ------------------------------------------------------------
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
