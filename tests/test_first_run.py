"""What a new user trips over (issue 11): each test here failed before its fix.

The commands run as real subprocesses on real SQLite files (and the PostgreSQL server where
it matters), as a person at a terminal would run them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler import Scheduler
from scheduler._handlers import Registry

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
