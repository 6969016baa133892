"""``scheduler tasks list|put|remove``: the application's tasks from the command line, run as a
real subprocess on SQLite files and PostgreSQL (directly and through PgBouncer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from scheduler import Scheduler
from scheduler._model.handlers import Registry

FILE_TASK = '[[tasks]]\nname = "nightly"\ncron = "0 3 * * *"\nhandler = "t.ok"\n'


def configure(directory: Path, url: str) -> None:
    (directory / "cli_jobs.py").write_text(
        "from scheduler import default_registry\n\n"
        '@default_registry.handler("t.ok")\ndef ok(job):\n    pass\n'
    )
    (directory / "app.toml").write_text(
        f'[database]\nurl = "{url}"\n\n[worker]\nimports = ["cli_jobs"]\n\n{FILE_TASK}'
    )


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """Exit 1, one line on stderr, no traceback."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.stderr
    return line


def test_put_list_change_and_remove(db_url_sp: str, tmp_path: Path) -> None:
    configure(tmp_path, db_url_sp)
    ok(run(tmp_path, "sync"))
    reader = Scheduler(db_url_sp, registry=Registry())
    try:
        put = ok(
            run(
                tmp_path,
                "tasks",
                "put",
                "acme-report",
                "--cron",
                "0 6 * * mon-fri",
                "--handler",
                "t.ok",
                "--timezone",
                "America/New_York",
                "--payload",
                '{"customer": 42}',
                "--group",
                "customer-42",
                "--tenant",
                "acme",
            )
        )
        assert put.splitlines()[0] == "created acme-report"
        assert "next fires in America/New_York | UTC" in put
        row = reader.get_row("acme-report")
        assert row is not None
        assert (row.source, row.group, row.tenant, row.payload) == (
            "api",
            "customer-42",
            "acme",
            {"customer": 42},
        )

        # A change gives only what changes; the rest of the row is kept.
        dry = ok(run(tmp_path, "tasks", "put", "acme-report", "--cron", "0 7 * * *", "--dry-run"))
        assert dry.splitlines()[0] == "dry run: nothing written; would be updated acme-report: cron"
        assert reader.get_row("acme-report") == row
        changed = ok(run(tmp_path, "tasks", "put", "acme-report", "--payload", '{"customer": 7}'))
        assert changed.splitlines()[0] == "updated acme-report: payload"
        after = reader.get_row("acme-report")
        assert after is not None
        assert (after.cron, after.timezone, after.payload, after.group) == (
            "0 6 * * mon-fri",
            "America/New_York",
            {"customer": 7},
            "customer-42",
        )

        # The list shows both owners; filters and pages.
        listed = ok(run(tmp_path, "tasks", "list"))
        assert listed.splitlines()[0].split()[:4] == ["NAME", "SOURCE", "GROUP", "TENANT"]
        names = [line.split()[:2] for line in listed.splitlines()[1:]]
        assert names == [["acme-report", "api"], ["nightly", "file"]]
        api_only = json.loads(ok(run(tmp_path, "tasks", "list", "--source", "api", "--json")))
        assert [(r["name"], r["group"], r["tenant"]) for r in api_only] == [
            ("acme-report", "customer-42", "acme")
        ]
        first = ok(run(tmp_path, "tasks", "list", "--limit", "1"))
        assert "(more after 'acme-report': --after 'acme-report')" in first
        second = ok(run(tmp_path, "tasks", "list", "--limit", "1", "--after", "acme-report"))
        assert [line.split()[0] for line in second.splitlines()[1:2]] == ["nightly"]
        assert ok(run(tmp_path, "tasks", "list", "--prefix", "zzz")).strip() == "no tasks"

        # Removal: the name is free again; a second removal and the file's task are refused.
        assert ok(run(tmp_path, "tasks", "remove", "acme-report")).startswith("removed acme-report")
        assert reader.get_row("acme-report") is None
        assert "no task created at runtime named 'acme-report'" in refused(
            run(tmp_path, "tasks", "remove", "acme-report")
        )
        refused(run(tmp_path, "tasks", "remove", "nightly"))
        assert reader.get_row("nightly") is not None
    finally:
        reader.close()


def test_bad_input_is_one_line_and_writes_nothing(db_url_sp: str, tmp_path: Path) -> None:
    configure(tmp_path, db_url_sp)
    ok(run(tmp_path, "sync"))
    reader = Scheduler(db_url_sp, registry=Registry())
    try:
        before = reader.rows(limit=None)
        new = ("tasks", "put", "x", "--handler", "t.ok")
        assert "task 'x'" in (line := refused(run(tmp_path, *new, "--cron", "61 * * * *")))
        assert "cron" in line
        assert "a new task needs --cron" in refused(run(tmp_path, *new))
        assert "key 'payload': not JSON" in refused(
            run(tmp_path, *new, "--cron", "* * * * *", "--payload", "{nope")
        )
        assert "key 'timezone'" in refused(
            run(tmp_path, *new, "--cron", "* * * * *", "--timezone", "Mars/Base")
        )
        # The file's task belongs to the file.
        assert "nightly" in refused(run(tmp_path, "tasks", "put", "nightly", "--cron", "0 4 * * *"))
        assert reader.rows(limit=None) == before
    finally:
        reader.close()


def test_a_change_keeps_what_the_command_has_no_option_for(tmp_path: Path) -> None:
    """``tasks put NAME --payload ...`` on an existing row keeps its ``timeout``, ``recovery``
    and ``probe_intervals`` (set through ``put_task``): the command has no option for them."""
    from scheduler import TaskSpec

    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    configure(tmp_path, url)
    ok(run(tmp_path, "migrate"))
    app = Scheduler(url, registry=Registry())
    try:
        app.put_task(
            TaskSpec(
                "crm-7",
                "0 6 * * *",
                "t.ok",
                {"v": 1},
                "UTC",
                timeout=30,
                recovery="probe",
                probe_intervals=(60, 600),
            )
        )
        ok(run(tmp_path, "tasks", "put", "crm-7", "--payload", '{"v": 2}'))
        row = app.get_row("crm-7")
        assert row is not None and row.payload == {"v": 2}
        assert (row.timeout, row.recovery, row.probe_intervals) == (30.0, "probe", (60.0, 600.0))
    finally:
        app.close()
