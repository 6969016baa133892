"""A first project on the command line: a config file and its handler module
(:func:`project`), the ``scheduler`` command run on it as a real subprocess with a clean
environment (:func:`run`), what a success and a one-line refusal look like, and a migrated
SQLite file (the :func:`migrated` fixture)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
