"""The ``scheduler`` command, run as a real subprocess on SQLite files and PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import COMMAND, run_cli, write_config
from sqlalchemy import create_engine, inspect, select

import scheduler
from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.migrate import head_revision
from scheduler._store.tables import workers


def run_all(cwd: Path, *commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run independent commands at once (each start-up costs half a second)."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SCHEDULER_CONFIG", "SCHEDULER_DATABASE_URL")
    }
    procs = [
        subprocess.Popen(
            [*COMMAND, *args],
            cwd=cwd,
            env=clean,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for args in commands
    ]
    results = []
    for args, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        results.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    return results


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exactly one line on stderr, and no traceback."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    return lines[0]


SPEC_ROW = (
    "name",
    "enabled",
    "next_run_at",
    "last_job_state",
    "consecutive_failures",
    "disabled_reason",
)
SPEC_HEALTH = ("waiting", "stopped", "overdue", "stalled", "warnings")
TASK = (
    '[[tasks]]\nname = "nightly"\ncron = "0 3 1 1 *"\nhandler = "t.ok"\n'
    'timezone = "Europe/Berlin"\n'
)


def test_version(tmp_path: Path) -> None:
    assert (
        ok(run_cli(tmp_path, "--version")).strip() == f"scheduler, version {scheduler.__version__}"
    )


def test_migrate_sync_tick_worker_status(db_url_sp: str, tmp_path: Path) -> None:
    write_config(tmp_path, db_url_sp, tasks=TASK)
    assert "(head)" in ok(run_cli(tmp_path, "migrate"))  # idempotent on a migrated database
    dry = ok(run_cli(tmp_path, "sync", "--dry-run"))
    assert dry.splitlines()[:2] == ["dry run: nothing written", "insert:    nightly"]
    reader = Scheduler(db_url_sp, registry=Registry())
    assert reader.rows(limit=None) == []
    assert ok(run_cli(tmp_path, "sync")).splitlines()[0] == "insert:    nightly"
    assert ok(run_cli(tmp_path, "tick")).splitlines()[0] == "dispatched: -"  # not due yet
    assert "triggered 'nightly'" in ok(run_cli(tmp_path, "trigger", "nightly"))
    assert json.loads(ok(run_cli(tmp_path, "tick", "--json"))) == {
        "dispatched": ["nightly"],
        "rerun": [],
        "held_back": [],
        "disabled": [],
        "lost_race": [],
        "skipped_overlap": [],
        "missed": [],
        "locked": [],
    }
    worker = run_cli(tmp_path, "worker", "--once", "--concurrency", "2")
    assert worker.returncode == 0, worker.stderr
    assert "(t.ok) succeeded" in worker.stderr

    data: dict[str, Any] = json.loads(ok(run_cli(tmp_path, "status", "--json")))
    assert data == reader.status() | {"health": data["health"]}
    assert list(data) == ["rows", "jobs", "health"]
    [row] = data["rows"]
    assert {k: row[k] for k in SPEC_ROW} == {
        "name": "nightly",
        "enabled": True,
        "next_run_at": row["next_run_at"],
        "last_job_state": "succeeded",
        "consecutive_failures": 0,
        "disabled_reason": None,
    }
    assert row["next_run_at"].endswith("Z") and row["timezone"] == "Europe/Berlin"
    assert data["jobs"] == {"queued": 0, "claimed": 0, "succeeded": 1, "aborted": 0}
    health = data["health"]
    assert {k: health[k] for k in SPEC_HEALTH} == {
        "waiting": 0,
        "stopped": 0,
        "overdue": 0,
        "stalled": False,
        "warnings": [],  # the one-shot ticks were recorded a moment ago
    }
    # The --once worker said goodbye (its row is gone); the one-shot ticks' row stays.
    assert health["workers"] == []  # the host's tick record is not a running worker
    reader.close()


def tick_records(db: Path) -> list[Any]:
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(workers)))
    finally:
        engine.dispose()


def iso(value: datetime) -> str:
    return value.replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")


def test_one_shot_tick_is_recorded_for_status(tmp_path: Path, sqlite_template: Path) -> None:
    """`scheduler tick` from cron(8) or a timer: `status` sees the ticks, as a worker's."""
    db = tmp_path / "cron.db"
    shutil.copy(sqlite_template, db)
    write_config(tmp_path, f"sqlite:///{db}", tasks=TASK)
    ok(run_cli(tmp_path, "sync"))
    before: dict[str, Any] = json.loads(ok(run_cli(tmp_path, "status", "--json")))
    assert before["health"]["warnings"] == ["no worker is running: start `scheduler worker`"]
    assert before["health"]["last_tick_at"] is None

    def tick() -> tuple[datetime, dict[str, Any], datetime]:
        started = datetime.now(UTC)
        assert ok(run_cli(tmp_path, "tick")).splitlines()[0] == "dispatched: -"
        ended = datetime.now(UTC)
        return started, json.loads(ok(run_cli(tmp_path, "status", "--json"))), ended

    started, data, ended = tick()
    assert list(data) == ["rows", "jobs", "health"]
    health = data["health"]
    assert list(health) == list(before["health"])  # no new keys
    assert {k: health[k] for k in SPEC_HEALTH} == {
        "waiting": 0,
        "stopped": 0,
        "overdue": 0,
        "stalled": False,
        "warnings": [],
    }
    first = datetime.fromisoformat(health["last_tick_at"])
    assert started <= first <= ended
    assert health["workers"] == []  # the tick's process exited: no worker is running
    [record] = tick_records(db)
    assert record.id == f"{socket.gethostname()}:tick"
    assert iso(record.last_tick_at) == health["last_tick_at"]
    status_text = ok(run_cli(tmp_path, "status"))
    assert f"last tick {health['last_tick_at']}, 0 worker(s)" in status_text
    assert "warning:" not in status_text

    # The next run updates that row: one row per host, however often cron runs the tick.
    started, data, ended = tick()
    [again] = tick_records(db)
    assert again.id == record.id and again.started_at == record.started_at
    assert first < again.last_tick_at and data["health"]["warnings"] == []
    assert started <= datetime.fromisoformat(data["health"]["last_tick_at"]) <= ended


def test_enable_disable_and_the_status_table(tmp_path: Path, sqlite_template: Path) -> None:
    db = tmp_path / "rows.db"
    db.write_bytes(sqlite_template.read_bytes())
    write_config(tmp_path, f"sqlite:///{db}", tasks=TASK)
    ok(run_cli(tmp_path, "sync"))
    assert ok(run_cli(tmp_path, "disable", "nightly")) == "disabled 'nightly'\n"
    table = ok(run_cli(tmp_path, "status")).splitlines()
    assert re.split(r"\s{2,}", table[0]) == [
        "NAME",
        "ENABLED",
        "NEXT RUN (LOCAL)",
        "NEXT RUN (UTC)",
        "LAST JOB",
        "FAILURES",
        "WHY DISABLED",
    ]
    assert table[1].split() == ["nightly", "no", "-", "-", "-", "0", "manual"]
    assert "jobs: queued 0, claimed 0, succeeded 0, aborted 0" in table
    assert "enabled 'nightly'" in ok(run_cli(tmp_path, "enable", "nightly"))
    assert "was already enabled" in ok(run_cli(tmp_path, "enable", "nightly"))
    row = ok(run_cli(tmp_path, "status")).splitlines()[1].split()
    assert row[:2] == ["nightly", "yes"] and row[3:5] == ["03:00:00", "Europe/Berlin"]
    assert row[6:] == ["02:00:00Z", "-", "0"]  # 03:00 CET on 1 January


def sqlite_tables(path: Path) -> set[str]:
    engine = create_engine(f"sqlite:///{path}")
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


COMMANDS = [["sync"], ["tick"], ["status", "--json"], ["enable", "x"], ["trigger", "x"], ["worker"]]


def test_outdated_schema_is_refused_until_migrate(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    db.touch()  # an empty database (a missing file: tests/cli/test_cli_database.py)
    write_config(tmp_path, f"sqlite:///{db}", tasks=TASK)
    for command, result in zip(COMMANDS, run_all(tmp_path, *COMMANDS), strict=True):
        assert "run `scheduler migrate`" in one_error_line(result), command
    assert sqlite_tables(db) == set()  # nothing was created
    ok(run_cli(tmp_path, "migrate"))
    ok(run_cli(tmp_path, "sync"))


def test_migrate_to_base_and_back(tmp_path: Path) -> None:
    db = tmp_path / "roll.db"
    write_config(tmp_path, f"sqlite:///{db}", tasks=TASK)
    assert f"revision {head_revision()} (head)" in ok(run_cli(tmp_path, "migrate"))
    assert "scheduler_jobs" in sqlite_tables(db)
    assert "revision base" in ok(run_cli(tmp_path, "migrate", "--revision", "base"))
    assert sqlite_tables(db) == {"scheduler_alembic_version"}
    assert "run `scheduler migrate`" in one_error_line(run_cli(tmp_path, "sync"))
    assert f"revision {head_revision()} (head)" in ok(run_cli(tmp_path, "migrate"))
    ok(run_cli(tmp_path, "sync"))


def test_status_into_a_closed_pipe_is_quiet(tmp_path: Path, sqlite_template: Path) -> None:
    db = tmp_path / "pipe.db"
    shutil.copy(sqlite_template, db)
    write_config(tmp_path, f"sqlite:///{db}", tasks=TASK)
    proc = subprocess.Popen(
        [*COMMAND, "status"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader went away before the first line
    proc.wait(60)  # click's convention for a closed pipe is status 1, with nothing printed
    assert proc.stderr.read() == b""
    proc.stderr.close()


BAD_TASK = TASK + '[[tasks]]\nname = "broken"\ncron = "61 * * * *"\nhandler = "t.ok"\n'
CREDENTIAL = TASK.replace("[[tasks]]", "[[tasks]]\npayload = { api_token = 's3cret' }")


@pytest.mark.parametrize(
    ("args", "tasks", "imports", "expected"),
    [
        (["--config", "missing.toml", "status"], None, "", "missing.toml: cannot read file"),
        (["status"], None, "", "no configuration: pass --config FILE, set SCHEDULER_CONFIG"),
        (["sync"], BAD_TASK, "", "task 'broken': key 'cron'"),
        (["sync"], CREDENTIAL, "", "task 'nightly': key 'payload.api_token'"),
        (
            ["sync"],
            TASK.replace("handler", "handlr"),
            "",
            "key 'handlr': unknown key (did you mean 'handler'?)",
        ),
        (["sync"], TASK + "[worker]\n", "", "invalid TOML"),
        (["enable", "nope"], TASK, "", "no task named 'nope'"),
        (
            ["worker", "--once"],
            TASK,
            "no_such_mod",
            "cannot import 'no_such_mod' from [worker] imports: No module named 'no_such_mod'",
        ),
    ],
    ids=[
        "missing-file",
        "no-config",
        "bad-cron",
        "credential",
        "unknown-key",
        "invalid-toml",
        "unknown-row",
        "bad-import",
    ],
)
def test_errors_are_one_line_and_change_nothing(
    tmp_path: Path,
    sqlite_template: Path,
    args: list[str],
    tasks: str | None,
    imports: str,
    expected: str,
) -> None:
    db = tmp_path / "app.db"
    db.write_bytes(sqlite_template.read_bytes())
    if tasks is not None:
        path = write_config(tmp_path, f"sqlite:///{db}", tasks=tasks)
        if imports:
            path.write_text(path.read_text().replace('"cli_jobs"', f'"cli_jobs", "{imports}"'))
    before = db.read_bytes()
    assert expected in one_error_line(run_cli(tmp_path, *args))
    assert db.read_bytes() == before


def test_unreachable_database_is_one_line(tmp_path: Path) -> None:
    write_config(tmp_path, "postgresql+psycopg://postgres@127.0.0.1:1/test", tasks=TASK)
    line = one_error_line(run_cli(tmp_path, "status"))
    url = "postgresql+psycopg://postgres@127.0.0.1:1/test"
    assert line.startswith(f"error: database {url} ([database] url in {tmp_path / 'app.toml'}): ")


def test_debug_shows_the_traceback_and_usage_errors_exit_2(tmp_path: Path) -> None:
    write_config(tmp_path, f"sqlite:///{tmp_path / 'fresh.db'}")
    result = run_cli(tmp_path, "--debug", "status")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "SchemaOutdated" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: database {tmp_path / 'fresh.db'} ([database] url in ")
    assert "does not exist: create it with `scheduler migrate`" in last

    usage, negative = run_all(tmp_path, ["frobnicate"], ["worker", "--concurrency", "-1"])
    assert usage.returncode == 2 and "No such command 'frobnicate'" in usage.stderr
    assert negative.returncode == 2


def test_config_from_environment(tmp_path: Path, sqlite_template: Path) -> None:
    db = tmp_path / "env.db"
    db.write_bytes(sqlite_template.read_bytes())
    path = write_config(tmp_path, f"sqlite:///{db}", tasks=TASK, name="elsewhere.toml")
    assert "insert:    nightly" in ok(
        run_cli(tmp_path, "sync", env={"SCHEDULER_CONFIG": str(path)})
    )


def test_explain_prints_the_state_and_json_and_refuses_an_unknown_name(
    tmp_path: Path, sqlite_template: Path
) -> None:
    db = tmp_path / "explain.db"
    db.write_bytes(sqlite_template.read_bytes())
    write_config(tmp_path, f"sqlite:///{db}", tasks=TASK + 'overlap = "skip"\njitter = 30\n')
    ok(run_cli(tmp_path, "sync"))
    ok(run_cli(tmp_path, "trigger", "nightly"))
    ok(run_cli(tmp_path, "tick"))
    text = ok(run_cli(tmp_path, "explain", "nightly")).splitlines()
    assert text[0].startswith("task nightly: waiting: job 1 is queued to run at ")
    assert text[1].startswith("policies: overlap skip, catchup_window unlimited, jitter 30 s")
    assert "next fires (Europe/Berlin | UTC):" in text
    assert any(" dispatched " in line and "job 1" in line for line in text)
    data = json.loads(ok(run_cli(tmp_path, "explain", "nightly", "--json")))
    assert [d["decision"] for d in data["decisions"]] == ["dispatched", "triggered"]
    assert len(data["next_fires"]) == 10 and data["policies"]["jitter"] == 30
    status = ok(run_cli(tmp_path, "status")).splitlines()
    assert "POLICY" in status[0] and "skip, jitter 30 s" in status[1]
    missing = run_cli(tmp_path, "explain", "nope")
    assert missing.returncode == 1
    assert one_error_line(missing) == "error: no task named 'nope' (run `scheduler sync`?)"


ONCE_MODULE = """
from scheduler import default_registry

@default_registry.handler("fragile", max_attempts=1, queue="slow")
def fragile(job):
    raise RuntimeError("always fails")
"""


def test_backfill_and_retry_take_the_registered_max_attempts_and_queue(
    tmp_path: Path, sqlite_template: Path
) -> None:
    """`backfill` and `retry` import [worker] imports, as `tick` and the worker do: a handler
    registered with max_attempts=1 on queue "slow" gives its backfilled jobs 1 attempt on that
    queue (a failure aborts them), and a retried job keeps them."""
    db = tmp_path / "once.db"
    shutil.copy(sqlite_template, db)
    (tmp_path / "once_jobs.py").write_text(ONCE_MODULE)
    (tmp_path / "app.toml").write_text(
        f'[database]\nurl = "sqlite:///{db}"\n\n[worker]\nimports = ["once_jobs"]\n'
        'queues = ["slow"]\n\n'
        '[[tasks]]\nname = "hourly"\ncron = "0 * * * *"\nhandler = "fragile"\n'
    )
    ok(run_cli(tmp_path, "sync"))
    out = ok(
        run_cli(
            tmp_path,
            "backfill",
            "hourly",
            "--from",
            "2026-01-01T00:00Z",
            "--to",
            "2026-01-01T03:00Z",
        )
    )
    assert "enqueued 3" in out
    listed = json.loads(ok(run_cli(tmp_path, "jobs", "--task", "hourly", "--json")))["jobs"]
    assert [(j["max_attempts"], j["queue"]) for j in listed] == [(1, "slow")] * 3
    ok(run_cli(tmp_path, "worker", "--once", "--concurrency", "1"))
    table = ok(run_cli(tmp_path, "jobs", "--task", "hourly")).splitlines()[1:]
    assert [line.split()[4:6] for line in table] == [["aborted", "1/1"]] * 3
    job_id = table[0].split()[0]
    assert f"job {job_id} queued again" in ok(run_cli(tmp_path, "retry", job_id))
    shown = ok(run_cli(tmp_path, "job", job_id))
    assert re.search(r"^attempts:\s+0 of 1$", shown, re.M), shown
    assert re.search(r"^queue:\s+slow ", shown, re.M)


# A module-level object whose finalizer writes a file: it runs at the interpreter's teardown.
# (What it needs is bound at import: at the teardown the modules' names may be gone.)
TEARDOWN_PROBE = """
import os
class Probe:
    def __del__(self, _open=open, _path=os.environ["TEARDOWN_FILE"]):
        with _open(_path, "a") as f:
            f.write("teardown")
probe = Probe()
"""


def test_the_command_ends_without_the_teardown_only_where_no_user_code_ran(
    tmp_path: Path, sqlite_template: Path
) -> None:
    """The console script (`console()`, which `python -m scheduler.cli` runs too, so every
    CLI test here goes through it) skips the interpreter's teardown after a command that ran
    only our code: its output and exit status are whole, its SQLite database closed (the WAL
    checkpointed, no `-wal` file left). After a command that imported the user's modules
    ([worker] imports) the teardown runs, for their finalizers."""
    (tmp_path / "teardown_probe.py").write_text(TEARDOWN_PROBE)
    db = tmp_path / "exit.db"
    shutil.copy(sqlite_template, db)
    write_config(tmp_path, f"sqlite:///{db}", tasks=TASK)
    ok(run_cli(tmp_path, "sync"))
    marker = tmp_path / "teardown.txt"

    def console(*args: str) -> subprocess.CompletedProcess[str]:
        marker.unlink(missing_ok=True)
        code = "import teardown_probe\nfrom scheduler.cli import console\nconsole()\n"
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=tmp_path,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")},
                "TEARDOWN_FILE": str(marker),
                "PYTHONPATH": str(tmp_path),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )

    shown = console("status")
    assert shown.returncode == 0, shown.stderr
    assert "nightly" in shown.stdout and "jobs: queued 0" in shown.stdout
    assert not marker.exists()  # no teardown
    assert "disabled" in ok(console("disable", "nightly", "--reason", "exit test"))
    assert not marker.exists()
    assert not Path(f"{db}-wal").exists()  # closed before the exit: checkpointed
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT enabled FROM scheduler_rows").scalar() == 0
    finally:
        engine.dispose()
    assert one_error_line(console("explain", "no-such-task")).startswith("error: no task named")
    assert not marker.exists()
    assert console("--no-such-option").returncode == 2  # click's usage error keeps its status
    ok(console("tick"))  # imports cli_jobs: the full exit
    assert marker.read_text() == "teardown"


IMPORT_PROBE = """
import atexit, sys
heavy = ("sqlalchemy", "sqlalchemy.orm", "alembic", "croniter")
heavy += ("sqlalchemy.dialects.postgresql", "sqlalchemy.dialects.mysql")
found = lambda: [m for m in heavy if m in sys.modules]
atexit.register(lambda: print("imported:", *found(), file=sys.stderr))
from scheduler.cli import main
main()
"""


def imported(cwd: Path, *args: str) -> list[str]:
    """The heavy libraries a `scheduler ARGS` process imported (a count, not a timing)."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, *args], cwd=cwd, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines()[-1].split()[1:]


def test_help_imports_no_database_or_cron_library(tmp_path: Path, sqlite_template: Path) -> None:
    """`--help` (of the program and of a command) and `--version` import none of SQLAlchemy,
    Alembic, croniter; `status` on an up-to-date schema imports no Alembic (the schema check
    reads the version table itself), and no command that reads the database imports
    SQLAlchemy's ORM (a sixth of a second here; only a caller's ``Session`` needs it), nor on
    SQLite the PostgreSQL and MySQL dialects (50 ms). See benchmarks/cli_startup.py for the
    timings."""
    for args in (["--help"], ["status", "--help"], ["backfill", "--help"], ["--version"]):
        assert imported(tmp_path, *args) == [], args
    db = tmp_path / "probe.db"
    shutil.copy(sqlite_template, db)
    write_config(tmp_path, f"sqlite:///{db}", tasks=TASK)
    for command in ("status", "jobs", "tick"):
        found = imported(tmp_path, command)
        assert "sqlalchemy" in found, command  # the probe sees what a command that reads imports
        assert "alembic" not in found, command
        assert "sqlalchemy.orm" not in found, command
        assert "sqlalchemy.dialects.postgresql" not in found, command
        assert "sqlalchemy.dialects.mysql" not in found, command
