"""``[dashboard] username`` in the file with the password hash only in the environment (as the
dashboard how-to suggests): every process loads the file without that variable, and only
``scheduler dashboard`` needs it, with one error line naming the file and the key (issue 37,
item 5). A second ``scheduler disable`` without ``--reason`` keeps the first one's note."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler import Scheduler
from scheduler._model.handlers import Registry

HASH_ENV = "SCHEDULER_DASHBOARD_PASSWORD_HASH"
HASH = "$scrypt$ln=10,r=8,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43
TASK = '[[tasks]]\nname = "nightly"\ncron = "0 3 * * *"\nhandler = "t.ok"\n'


def run(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SCHEDULER_CONFIG", "SCHEDULER_DATABASE_URL", HASH_ENV)
    }
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def config(tmp_path: Path, sqlite_template: Path) -> Path:
    db = tmp_path / "app.db"
    shutil.copy(sqlite_template, db)
    path = tmp_path / "app.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{db}"\n\n[dashboard]\nusername = "ops"\n\n{TASK}'
    )
    return path


def test_every_other_command_loads_without_the_hash(config: Path, tmp_path: Path) -> None:
    for args in (["sync"], ["status"], ["explain", "nightly"], ["tick"]):
        result = run(tmp_path, *args)
        assert result.returncode == 0, (args, result.stderr)


def test_the_python_api_loads_without_the_hash(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(HASH_ENV, raising=False)
    app = Scheduler.from_toml(config, registry=Registry())
    try:
        assert app.dashboard_settings.username == "ops"
        assert app.dashboard_settings.password_hash is None
    finally:
        app.close()


def test_only_the_dashboard_needs_the_hash(config: Path, tmp_path: Path) -> None:
    result = run(tmp_path, "dashboard")
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"error: {config}: [dashboard]: key 'password_hash': missing")
    assert HASH_ENV in lines[0]


def test_a_hash_in_the_file_still_needs_a_username(tmp_path: Path) -> None:
    path = tmp_path / "app.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path / "x.db"}"\n\n'
        f'[dashboard]\npassword_hash = "{HASH}"\n'
    )
    result = run(tmp_path, "status")
    assert result.returncode == 1
    assert f"{path}: [dashboard]: key 'username': missing" in result.stderr


def test_a_second_disable_without_a_reason_keeps_the_note(config: Path, tmp_path: Path) -> None:
    assert run(tmp_path, "sync").returncode == 0
    first = run(tmp_path, "disable", "nightly", "--reason", "vendor API down")
    assert first.returncode == 0, first.stderr
    second = run(tmp_path, "disable", "nightly")
    assert second.returncode == 0, second.stderr
    app = Scheduler.from_toml(config, registry=Registry())
    try:
        row = app.get_row("nightly")
        assert row is not None and row.disabled_note == "vendor API down"
    finally:
        app.close()
