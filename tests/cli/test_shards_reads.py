"""The commands that read, with ``[database] shards = 4``: each reads every shard of a database
whose tasks and jobs are spread over the shards. ``status --json`` as a real ``scheduler``
process; the other commands through the command's ``main`` in this process (:class:`Cli`: the
same parsing, config and reads, without a Python start-up of a second or more per command)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.cli import Cli, run_cli
from helpers.shard_reads import SHARDS, Seeded, seed, sharded_app

from scheduler import Scheduler
from scheduler._model.handlers import Registry

# On PostgreSQL directly only: the commands merge what the app reads from each shard, and each
# shard's reads and writes through PgBouncer (its search_path set in each transaction) are
# proved by tests/store/test_shards.py, test_shards_status.py and test_sharded_worker.py's
# pooled cases; through the pooler these were the same cases again at a few seconds each.
pytestmark = pytest.mark.direct


@pytest.fixture
def seeded(sharded_url: str) -> Iterator[Seeded]:
    app = sharded_app(sharded_url)
    yield seed(app)
    app.close()


def config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "app.toml"
    path.write_text(f'[database]\nurl = "{url}"\nshards = {SHARDS}\n')
    return path


def process(tmp_path: Path, url: str, *args: str) -> str:
    """``scheduler --config ... ARGS`` as a real process: its stdout (exit status 0)."""
    done = run_cli(tmp_path, "--config", str(config(tmp_path, url)), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def cli(sharded_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Callable[..., str]:
    """``scheduler --config ... ARGS`` in this process: its stdout (exit status 0)."""
    made = Cli(config(tmp_path, sharded_url), capsys)

    def ok(*args: str) -> str:
        capsys.readouterr()  # what the test printed before: not the command's
        return made.ok(*args)

    return ok


def one_shard_shape(tmp_path: Path) -> dict[str, set[str]]:
    """The keys of ``status --json`` with one shard (SQLite): the shape to keep."""
    with pytest.MonkeyPatch.context() as env:  # not the pgbouncer run's pooler settings
        env.delenv("SCHEDULER_DATABASE_POOLER", raising=False)
        env.delenv("SCHEDULER_DATABASE_LISTEN_URL", raising=False)
        app = Scheduler(f"sqlite:///{tmp_path / 'one.db'}", registry=Registry())
        app.migrate()
        data = app.status()
        app.close()
    return {"": set(data), "health": set(data["health"]), "jobs": set(data["jobs"])}


def test_status_json_has_every_shards_rows_jobs_and_health(
    seeded: Seeded, sharded_url: str, tmp_path: Path
) -> None:
    data = json.loads(process(tmp_path, sharded_url, "status", "--json"))
    shape = one_shard_shape(tmp_path)
    assert set(data) == shape[""]
    assert set(data["jobs"]) == shape["jobs"]
    assert set(data["health"]) == shape["health"] | {"shards"}  # the one key sharded adds

    assert [row["name"] for row in data["rows"]] == seeded.names  # all, by name
    assert sum(data["jobs"].values()) == len(seeded.job_ids)
    assert data["jobs"]["aborted"] == SHARDS and data["jobs"]["queued"] == 15 * SHARDS
    assert data["health"]["waiting"] == 15 * SHARDS
    assert data["health"]["rows_disabled"] == sorted(seeded.disabled.values())
    shards = data["health"]["shards"]
    assert [s["shard"] for s in shards] == list(range(SHARDS))
    for shard in shards:
        assert sum(shard["jobs"].values()) == len(seeded.jobs[shard["shard"]])
        assert shard["waiting"] == 15
        assert shard["last_tick_at"] is not None  # a tick (work) went to every shard


def test_status_text_lists_every_shards_tasks(seeded: Seeded, cli: Callable[..., str]) -> None:
    out = cli("status")
    for name in seeded.names:
        assert name in out
    counted = f"jobs: queued {15 * SHARDS}, claimed 0, succeeded {SHARDS}, aborted {SHARDS}"
    assert counted in out


def test_jobs_job_explain_audit_and_tasks_read_every_shard(
    seeded: Seeded, cli: Callable[..., str]
) -> None:
    listed = json.loads(cli("jobs", "--json", "--limit", "1000"))
    assert sorted(j["id"] for j in listed["jobs"]) == seeded.job_ids
    aborted = json.loads(cli("jobs", "--json", "--state", "aborted"))
    assert sorted(j["id"] for j in aborted["jobs"]) == sorted(
        i for ids in seeded.aborted.values() for i in ids
    )
    for index in range(SHARDS):
        job_id = seeded.aborted[index][0]
        shown = json.loads(cli("job", str(job_id), "--json"))
        assert shown["id"] == job_id and shown["state"] == "aborted"
        assert [r["outcome"] for r in shown["runs"]] == ["aborted"]

        name = seeded.tasks[index][0]  # triggered and run in its shard
        explained = json.loads(cli("explain", name, "--json"))
        assert explained["name"] == name
        assert [r["outcome"] for r in explained["runs"]] == ["succeeded"]

    entries = json.loads(cli("audit", "--json"))
    reasons = {e["reason"] for e in entries["entries"]}
    assert {f"seed shard {k}" for k in range(SHARDS)} <= reasons
    for index, name in seeded.disabled.items():
        mine = json.loads(cli("audit", name, "--json"))
        assert [e["reason"] for e in mine["entries"]] == [f"seed shard {index}"]

    rows = json.loads(cli("tasks", "list", "--limit", "1000", "--json"))
    assert [r["name"] for r in rows] == seeded.names
    page = json.loads(cli("tasks", "list", "--limit", "7", "--json"))
    assert [r["name"] for r in page] == seeded.names[:7]
    after = page[-1]["name"]
    rest = json.loads(cli("tasks", "list", "--limit", "7", "--after", after, "--json"))
    assert [r["name"] for r in rest] == seeded.names[7:14]
    tenant = json.loads(cli("tasks", "list", "--tenant", "tenant-5", "--json"))
    assert [r["name"] for r in tenant] == [n for n in seeded.names if int(n[-2:]) % 12 == 5]


def test_the_runtime_task_commands_and_the_job_actions_reach_the_right_shard(
    seeded: Seeded, cli: Callable[..., str]
) -> None:
    app = seeded.app
    cli(
        *("tasks", "put", "cli-task", "--cron", "0 4 * * *", "--handler", "t.ok"),
        *("--tenant", "tenant-3"),
    )
    holder = app.shard_for("tenant-3", "cli-task")
    assert holder.get_row("cli-task") is not None
    assert [s.shard_index for s in app.shards if s.get_row("cli-task")] == [holder.shard_index]
    shown = json.loads(cli("explain", "cli-task", "--json"))
    assert shown["name"] == "cli-task"
    cli("tasks", "remove", "cli-task")
    assert app.get_row("cli-task") is None

    retried, cancelled = seeded.aborted[2][0], seeded.queued[3][0]
    cli("retry", str(retried), "--reason", "fixed")
    cli("cancel", str(cancelled), "--reason", "not needed")
    assert app.shards[2].get_job(retried).state == "queued"  # type: ignore[union-attr]
    assert app.shards[3].get_job(cancelled).state == "aborted"  # type: ignore[union-attr]
    name = seeded.tasks[1][2]
    cli("disable", name, "--reason", "from the cli")
    assert app.shards[1].get_row(name).enabled is False  # type: ignore[union-attr]
    data = json.loads(cli("status", "--json"))
    assert name in data["health"]["rows_disabled"]
