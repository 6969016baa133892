"""``scheduler status`` at scale: past 200 tasks it prints counts and at most 50 tasks that
need attention; ``status --json`` keeps every task, streamed a page at a time, in the same
text as one ``json.dumps`` of ``Scheduler.status()``. Real subprocesses on SQLite files,
PostgreSQL and MariaDB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.status import health


def run(cwd: Path, url: str, *args: str) -> str:
    (cwd / "app.toml").write_text(f'[database]\nurl = "{url}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    done = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def make(url: str, count: int, disabled: int) -> Scheduler:
    app = Scheduler(url, registry=Registry())
    specs = [TaskSpec(f"t-{i:04d}", "0 6 * * *", "t.ok", {"i": i}, "UTC") for i in range(count)]
    app.put_tasks(specs)
    for i in range(disabled):
        app.disable(f"t-{i:04d}", reason="paused by test")
    return app


def test_status_past_200_rows_prints_counts_and_who_needs_attention(
    db_url: str, tmp_path: Path
) -> None:
    app = make(db_url, 261, 60)
    try:
        out = run(tmp_path, db_url, "status")
        lines = out.splitlines()
        assert lines[0].startswith("tasks: 261 (201 enabled, 60 disabled); ")
        assert "disabled 60" in lines[0]
        assert "need attention (the first 50;" in out
        listed = [line.split()[0] for line in lines if line.startswith("t-")]
        assert listed == [f"t-{i:04d}" for i in range(50)]  # at most 50, by name
        assert "t-0100" not in out  # no table of every row
        assert any(line.startswith("jobs: ") for line in lines)
        assert any(line.startswith("health: ") for line in lines)
        summary = app.status_summary()
        assert summary is not None and summary["rows_total"] == 261
        assert "rows" not in summary and len(summary["attention"]) == 50
        assert summary["attention_more"] and summary["rows_counted"]["disabled"] == 60
    finally:
        app.close()


def test_status_at_200_rows_is_still_the_table(db_url: str, tmp_path: Path) -> None:
    app = make(db_url, 200, 1)
    try:
        assert app.status_summary() is None
        lines = run(tmp_path, db_url, "status").splitlines()
        assert lines[0].startswith("NAME ")
        assert len([line for line in lines if line.startswith("t-")]) == 200
    finally:
        app.close()


def test_status_json_streams_the_same_text_as_one_dump(db_url: str, tmp_path: Path) -> None:
    app = make(db_url, 5, 2)
    try:
        out = run(tmp_path, db_url, "status", "--json")
        data = json.loads(out)
        assert list(data) == ["rows", "jobs", "health"]
        assert len(data["rows"]) == 5
        health_now = data["health"]["now"]
        expected = app.status()
        expected["health"]["now"] = health_now
        assert out == json.dumps(expected, indent=2) + "\n"  # byte for byte, shape unchanged
        # pages of 2 rows walk every row once, in the order of status()
        assert list(health.status_rows(app.store, page=2)) == expected["rows"]
    finally:
        app.close()


def test_status_json_with_no_rows(db_url: str, tmp_path: Path) -> None:
    app = Scheduler(db_url, registry=Registry())
    try:
        out = run(tmp_path, db_url, "status", "--json")
        data = json.loads(out)
        assert data["rows"] == [] and list(data) == ["rows", "jobs", "health"]
        assert out.startswith('{\n  "rows": [],\n  "jobs": {')
    finally:
        app.close()
