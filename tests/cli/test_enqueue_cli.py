"""``scheduler enqueue`` and ``scheduler worker --queues --concurrency``, run as a real
subprocess on SQLite files and PostgreSQL (directly and through PgBouncer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from scheduler import Scheduler
from scheduler._model.handlers import Registry

HANDLERS = """\
from scheduler import default_registry


@default_registry.handler("crm.push", queue="crm", max_attempts=1)
def push(job):
    pass


@default_registry.handler("plain.job")
def plain(job):
    pass
"""


def configure(directory: Path, url: str, worker: str = "") -> None:
    (directory / "cli_enqueue_jobs.py").write_text(HANDLERS)
    (directory / "app.toml").write_text(
        f'[database]\nurl = "{url}"\n\n[worker]\nimports = ["cli_enqueue_jobs"]\n{worker}'
    )


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    keep = ("SCHEDULER_DATABASE_POOLER", "SCHEDULER_DATABASE_LISTEN_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") or k in keep}
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
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


def test_enqueue_prints_the_id_and_uses_the_recorded_settings(
    db_url_sp: str, tmp_path: Path
) -> None:
    configure(tmp_path, db_url_sp)
    reader = Scheduler(db_url_sp, registry=Registry())
    try:
        # No worker yet: the handler is unknown everywhere: enqueued, with one warning line.
        before = run(tmp_path, "enqueue", "crm.push")
        first = int(ok(before).strip())
        [warning] = before.stderr.strip().splitlines()
        assert warning.startswith("warning: handler 'crm.push' is not registered")
        job = reader.get_job(first)
        assert job is not None and (job.queue, job.max_attempts) == ("default", 3)
        ok(run(tmp_path, "worker", "--once", "--queues", "crm"))  # registers the handlers
        text = run(
            tmp_path,
            "enqueue",
            "crm.push",
            "--payload",
            '{"customer": 42}',
            "--run-at",
            "2030-01-02T03:04:05Z",
        )
        second = int(ok(text).strip())
        assert text.stderr == ""
        job = reader.get_job(second)
        assert job is not None
        assert (job.queue, job.max_attempts, job.payload) == ("crm", 1, {"customer": 42})
        assert job.run_at.isoformat() == "2030-01-02T03:04:05+00:00"
        as_json = json.loads(ok(run(tmp_path, "enqueue", "crm.push", "--queue", "q2", "--json")))
        assert as_json["enqueued"] is True and as_json["job"]["queue"] == "q2"
        assert as_json["job"]["id"] == as_json["id"] and as_json["job"]["max_attempts"] == 1
    finally:
        reader.close()


def test_a_held_dedupe_key_prints_the_holder_and_exits_1(db_url_sp: str, tmp_path: Path) -> None:
    configure(tmp_path, db_url_sp)
    ok(run(tmp_path, "worker", "--once"))
    held = int(ok(run(tmp_path, "enqueue", "plain.job", "--dedupe-key", "k-1")).strip())
    again = run(tmp_path, "enqueue", "plain.job", "--dedupe-key", "k-1")
    assert refused(again) == (
        f"error: dedupe key 'k-1' is held by job {held} (queued): nothing enqueued"
    )
    assert again.stdout.strip() == str(held)
    as_json = run(tmp_path, "enqueue", "plain.job", "--dedupe-key", "k-1", "--json")
    refused(as_json)
    assert json.loads(as_json.stdout)["enqueued"] is False
    assert json.loads(as_json.stdout)["id"] == held
    reader = Scheduler(db_url_sp, registry=Registry())
    try:
        assert len(reader.jobs(handler="plain.job")) == 1
    finally:
        reader.close()


def test_bad_input_is_one_line_and_writes_nothing(db_url_sp: str, tmp_path: Path) -> None:
    configure(tmp_path, db_url_sp)
    line = refused(run(tmp_path, "enqueue", "plain.job", "--payload", "{not json"))
    assert line.startswith("error: enqueue 'plain.job': --payload: not JSON")
    line = refused(run(tmp_path, "enqueue", "plain.job", "--payload", "[1, 2]"))
    assert line == "error: enqueue 'plain.job': --payload: expected a JSON object"
    line = refused(run(tmp_path, "enqueue", "plain.job", "--run-at", "tomorrow"))
    assert line.startswith("error: enqueue 'plain.job': --run-at: 'tomorrow' is not an ISO-8601")
    line = refused(run(tmp_path, "enqueue", "plain.job", "--payload", '{"password": "x"}'))
    assert "password" in line
    reader = Scheduler(db_url_sp, registry=Registry())
    try:
        assert reader.jobs() == []
    finally:
        reader.close()


def test_worker_queues_and_concurrency_win_over_the_file(db_url_sp: str, tmp_path: Path) -> None:
    configure(tmp_path, db_url_sp, 'queues = ["default"]\nconcurrency = 1\n')
    reader = Scheduler(db_url_sp, registry=Registry())
    try:
        ok(run(tmp_path, "worker", "--once"))  # registers the handlers
        crm = int(ok(run(tmp_path, "enqueue", "crm.push")).strip())
        plain = int(ok(run(tmp_path, "enqueue", "plain.job")).strip())
        started = run(
            tmp_path, "worker", "--once", "--queues", " crm ,billing", "--concurrency", "2"
        )
        ok(started)
        assert "concurrency 2" in started.stderr
        states = {j.id: j.state for j in reader.jobs()}
        assert states == {crm: "succeeded", plain: "queued"}  # the file's queue is not served
        line = refused(run(tmp_path, "worker", "--once", "--queues", "crm,,billing"))
        assert line == (
            "error: command line (--queues, --concurrency): [worker]: key 'queues[1]':"
            " must not be empty"
        )
        refused(run(tmp_path, "worker", "--once", "--queues", ""))
    finally:
        reader.close()
