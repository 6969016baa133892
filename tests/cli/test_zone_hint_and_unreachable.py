"""Two error lines of issue 37 (item 8): a mistyped time zone gets a did-you-mean in the line
that names the file, the task and the key (difflib imported only then), and a database that
refuses the connection is named with where its URL came from, as the other database errors
are. Real subprocesses; the refused connection is a real port nothing listens on."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler import ConfigError, Scheduler
from scheduler._config import parse_config
from scheduler._model.handlers import Registry

TASK = '[[tasks]]\nname = "nightly"\ncron = "0 3 * * *"\nhandler = "t.ok"\ntimezone = "{zone}"\n'


def run(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SCHEDULER_CONFIG", "SCHEDULER_DATABASE_URL")
    }
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize(
    ("zone", "hint"),
    [
        ("Europe/Berlinn", " (did you mean 'Europe/Berlin'?)"),
        ("europe/berlin", " (did you mean 'Europe/Berlin'?)"),
        ("America/NewYork", " (did you mean 'America/New_York'?)"),
        ("Asia/Kolkatta", " (did you mean 'Asia/Kolkata'?)"),
        ("Mars/Olympus_Mons", ""),
    ],
)
def test_a_mistyped_zone_gets_a_did_you_mean(zone: str, hint: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            {"tasks": [{"name": "nightly", "cron": "0 3 * * *", "handler": "h", "timezone": zone}]},
            "app.toml",
        )
    assert str(caught.value) == (
        f"app.toml: task 'nightly': key 'timezone': unknown timezone {zone!r}{hint}"
    )


def test_sync_names_file_task_key_and_the_zone_meant_and_writes_nothing(
    tmp_path: Path, sqlite_template: Path
) -> None:
    db = tmp_path / "app.db"
    shutil.copy(sqlite_template, db)
    config = tmp_path / "app.toml"
    config.write_text(
        f'[database]\nurl = "sqlite:///{db}"\n\n' + TASK.format(zone="Europe/Berlinn")
    )
    line = one_error_line(run(tmp_path, "sync"))
    assert line == (
        f"error: {config}: task 'nightly': key 'timezone': unknown timezone 'Europe/Berlinn'"
        " (did you mean 'Europe/Berlin'?)"
    )
    app = Scheduler(f"sqlite:///{db}", registry=Registry())
    try:
        assert app.rows() == []
    finally:
        app.close()


def test_difflib_is_imported_only_for_a_mistake() -> None:
    code = (
        "import sys\n"
        "from scheduler._config import parse_config\n"
        "task = {'name': 'a', 'cron': '0 3 * * *', 'handler': 'h', 'timezone': 'Europe/Berlin'}\n"
        "parse_config({'tasks': [task]}, 'app.toml')\n"
        "print('difflib' in sys.modules)\n"
        "task['timezone'] = 'Europe/Berlinn'\n"
        "try:\n"
        "    parse_config({'tasks': [task]}, 'app.toml')\n"
        "except Exception:\n"
        "    print('difflib' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "True"], result.stderr


@pytest.mark.parametrize(
    ("scheme", "user"), [("postgresql+psycopg", "postgres"), ("mysql+pymysql", "root")]
)
def test_a_refused_connection_says_where_the_url_came_from(
    tmp_path: Path, scheme: str, user: str
) -> None:
    url = f"{scheme}://{user}@127.0.0.1:{free_port()}/test"
    config = tmp_path / "app.toml"
    config.write_text(f'[database]\nurl = "{url}"\n')
    line = one_error_line(run(tmp_path, "status"))
    assert line.startswith(f"error: database {url} ([database] url in {config}): ")
    assert "refused" in line

    hidden = url.replace(f"{user}@", f"{user}:hunter2@")
    line = one_error_line(run(tmp_path, "status", env={"SCHEDULER_DATABASE_URL": hidden}))
    shown = url.replace(f"{user}@", f"{user}:***@")
    assert line.startswith(f"error: database {shown} (SCHEDULER_DATABASE_URL): ")
    assert "hunter2" not in line
