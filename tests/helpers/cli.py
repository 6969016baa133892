"""The ``scheduler`` command for tests: as a real subprocess (:func:`run_cli`, :data:`COMMAND`)
or in this process (:class:`Cli`), and a config file whose handlers are importable
(:func:`write_config`)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import main

COMMAND = [sys.executable, "-m", "scheduler.cli"]

JOBS_MODULE = """
import pathlib, time
from scheduler import default_registry

@default_registry.handler("t.ok", retry_safe=True)
def ok(job):
    pass

@default_registry.handler("t.slow", retry_safe=True)
def slow(job):
    pathlib.Path(job.payload["started"]).touch()
    time.sleep(job.payload["seconds"])
"""


def write_config(
    directory: Path, url: str, *, tasks: str = "", worker: str = "", name: str = "app.toml"
) -> Path:
    """A config whose handlers come from ``cli_jobs.py`` in ``directory``."""
    (directory / "cli_jobs.py").write_text(JOBS_MODULE)
    path = directory / name
    path.write_text(
        f'[database]\nurl = "{url}"\n\n[scheduler]\ntick_interval = 0.2\n\n'
        f'[worker]\nimports = ["cli_jobs"]\nlease_seconds = 5\n{worker}\n{tasks}'
    )
    return path


def run_cli(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SCHEDULER_CONFIG", "SCHEDULER_DATABASE_URL")
    }
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Cli:
    """``scheduler --config FILE ...`` in this process: (exit status, stdout, stderr)."""

    def __init__(self, config: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.config = config
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        root = logging.getLogger()
        handlers = list(root.handlers)
        exported = os.environ.get("SCHEDULER_CONFIG")  # the command exports its config file
        try:
            main(["--config", str(self.config), *args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            if exported is None:  # not left to the next test of this process
                os.environ.pop("SCHEDULER_CONFIG", None)
            else:
                os.environ["SCHEDULER_CONFIG"] = exported
            for handler in root.handlers[:]:  # the CLI adds a stderr handler each time
                if handler not in handlers:
                    root.removeHandler(handler)
        out = self.capsys.readouterr()
        return code, out.out, out.err

    def ok(self, *args: str) -> str:
        code, out, err = self(*args)
        assert code == 0, err
        return out

    def refused(self, *args: str) -> str:
        code, out, err = self(*args)
        lines = err.strip().splitlines()
        assert code != 0 and len(lines) == 1, (code, out, err)
        assert "Traceback" not in err
        return lines[0]
