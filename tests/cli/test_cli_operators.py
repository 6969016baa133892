"""The operators' commands (SPEC §10) run in-process through ``scheduler.cli.main`` on each
engine: ``jobs``, ``job``, ``retry``, ``cancel``, ``backfill``, ``audit``, and ``--reason`` /
``--actor`` on ``enable``, ``disable``, ``trigger`` and ``sync``.

Every refusal is one line on stderr, exit status 1, and leaves the database as it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.cli import Cli
from sqlalchemy import func, select, update

from scheduler import JobStateError, PermanentError, Scheduler, UnknownRow
from scheduler._model.handlers import Registry
from scheduler._store.tables import audit, jobs

TASKS = """
[[tasks]]
name = "nightly"
cron = "0 3 * * *"
handler = "works"
timezone = "Europe/Berlin"
"""


@pytest.fixture
def cli(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.delenv("SCHEDULER_CONFIG", raising=False)  # the CLI sets it: undone after
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    monkeypatch.setenv("SCHEDULER_ACTOR", "tester")
    config = tmp_path / "app.toml"
    config.write_text(f'[database]\nurl = "{db_url}"\n{TASKS}')
    return Cli(config, capsys)


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    found = Scheduler(db_url, registry=Registry())

    @found.handler("works")
    def works(job: object) -> None:
        return None

    @found.handler("fails", max_attempts=1)
    def fails(job: object) -> None:
        raise PermanentError("bad_input")

    yield found
    found.close()


def entries(app: Scheduler) -> int:
    with app.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(audit)).scalar_one())


def test_reason_and_actor_on_row_commands_and_status_shows_the_note(
    cli: Cli, app: Scheduler
) -> None:
    cli.ok("sync", "--reason", "first deploy")
    cli.ok("disable", "nightly", "--reason", "upstream down", "--actor", "ann")
    status = cli.ok("status")
    assert "manual: upstream down" in status
    (row,) = json.loads(cli.ok("status", "--json"))["rows"]
    assert row["disabled_note"] == "upstream down" and row["disabled_reason"] == "manual"
    assert "already enabled" not in cli.ok("enable", "nightly", "--reason", "back")
    assert "already enabled" in cli.ok("enable", "nightly")  # no change: no entry
    cli.ok("trigger", "nightly")
    found = json.loads(cli.ok("audit", "--json"))["entries"]
    assert [(e["action"], e["actor"], e["target"], e["reason"]) for e in found] == [
        ("trigger", "tester", "nightly", None),
        ("enable", "tester", "nightly", "back"),
        ("disable", "ann", "nightly", "upstream down"),
        ("sync", "tester", None, "first deploy"),
    ]
    assert found[-1]["detail"].endswith("app.toml: insert 1, update 0, disable 0")
    text = cli.ok("audit", "nightly", "--limit", "1")
    header = ["AT", "(UTC)", "ACTOR", "ACTION", "TARGET", "REASON", "DETAIL"]
    assert text.splitlines()[0].split() == header
    assert "trigger" in text and "enable" not in text
    assert cli.refused("audit", "ghost") == "error: no task named 'ghost' (run `scheduler sync`?)"
    line = cli.refused("disable", "ghost", "--reason", "x")
    assert line == "error: no task named 'ghost' (run `scheduler sync`?)"
    line = cli.refused("disable", "nightly", "--reason", "r" * 501)
    assert line == "error: ValueError: reason is 501 characters, over the 500-character limit"
    assert entries(app) == 4


def test_jobs_and_job(cli: Cli, app: Scheduler) -> None:
    cli.ok("sync")
    first = app.enqueue("works", {"n": 1})
    second = app.enqueue("fails", queue="slow")
    app.work()  # the first succeeds; the second waits on its queue
    table = cli.ok("jobs").splitlines()
    assert table[0].split()[:6] == ["ID", "TASK", "HANDLER", "QUEUE", "STATE", "ATTEMPTS"]
    assert [line.split()[0] for line in table[1:]] == [str(second), str(first)]
    assert table[2].split()[1:6] == ["-", "works", "default", "succeeded", "1/3"]
    only = json.loads(cli.ok("jobs", "--queue", "slow", "--json"))["jobs"]
    assert [(j["id"], j["state"], j["queue"]) for j in only] == [(second, "queued", "slow")]
    assert cli.ok("jobs", "--task", "nightly") == "no jobs\n"
    assert len(json.loads(cli.ok("jobs", "--limit", "1", "--json"))["jobs"]) == 1
    assert len(json.loads(cli.ok("jobs", "--state", "succeeded", "--json"))["jobs"]) == 1
    assert json.loads(cli.ok("jobs", "--handler", "fails", "--json"))["jobs"][0]["id"] == second
    acme = app.enqueue("works", tenant="acme")
    found = json.loads(cli.ok("jobs", "--tenant", "acme", "--json"))["jobs"]
    assert [(j["id"], j["tenant"]) for j in found] == [(acme, "acme")]
    assert cli.ok("jobs", "--tenant", "globex") == "no jobs\n"
    assert cli.refused("jobs", "--tenant", "bad tenant!").startswith(
        "error: ValueError: tenant: 'bad tenant!' is not a tenant id"
    )
    assert "tenant:   acme" in cli.ok("job", str(acme))
    code, _, err = cli("jobs", "--state", "dead")
    assert code == 2 and "'dead' is not one of" in err  # click's usage error
    shown = cli.ok("job", str(first))
    assert "state:    succeeded" in shown and "ATTEMPT" in shown and "succeeded" in shown
    data = json.loads(cli.ok("job", str(first), "--json"))
    assert data["id"] == first and data["runs"][0]["outcome"] == "succeeded"
    assert data["created_at"].endswith("Z")
    assert cli.refused("job", "999999") == "error: no job 999999"


def test_retry_and_cancel(cli: Cli, app: Scheduler) -> None:
    dead = app.enqueue("fails", queue="slow")
    queued = app.enqueue("works", queue="other")
    with app.store.begin() as conn:  # the dead job, as a worker would have left it
        conn.execute(
            update(jobs)
            .where(jobs.c.id == dead)
            .values(state="aborted", attempts=1, last_error_code="bad_input")
        )
    assert cli.refused("cancel", str(dead)) == (
        f"error: job {dead} is aborted: only a queued or running job can be cancelled"
    )
    assert cli.refused("retry", str(queued)) == (
        f"error: job {queued} is queued: only an aborted job can be retried"
    )
    assert cli.refused("retry", "999999") == "error: no job 999999"
    assert entries(app) == 0
    out = cli.ok("retry", str(dead), "--reason", "fixed the input")
    assert out.startswith(f"job {dead} queued again: attempts reset")
    job = app.get_job(dead)
    assert job is not None and (job.state, job.attempts, job.last_error_code) == ("queued", 0, None)
    out = cli.ok("cancel", str(queued), "--actor", "ops")
    assert out == f"job {queued} cancelled: aborted with code cancelled\n"
    found = json.loads(cli.ok("audit", "--json"))["entries"]
    assert [(e["action"], e["actor"], e["target"], e["reason"]) for e in found] == [
        ("cancel", "ops", f"job {queued}", None),
        ("retry", "tester", f"job {dead}", "fixed the input"),
    ]


def test_backfill(cli: Cli, app: Scheduler) -> None:
    cli.ok("sync")
    args = ("backfill", "nightly", "--from", "2025-10-24", "--to", "2025-10-28")
    dry = cli.ok(*args, "--dry-run").splitlines()
    assert dry[-1] == "dry run: nothing written; 4 slot(s), would enqueue 4, 0 already had a job"
    # 03:00 in Berlin, before and after the fall-back of 2025-10-26
    assert dry[0].startswith("2025-10-24 01:00:00Z  2025-10-24 03:00:00+0200  would enqueue")
    assert dry[3].startswith("2025-10-27 02:00:00Z  2025-10-27 03:00:00+0100  would enqueue")
    assert count_jobs(app) == 0
    done = cli.ok(*args, "--reason", "outage on the 24th").splitlines()
    assert done[-1] == "4 slot(s), enqueued 4, 0 already had a job"
    again = json.loads(cli.ok(*args, "--json"))
    assert again["enqueued"] == [] and len(again["taken"]) == 4
    assert count_jobs(app) == 4
    (entry,) = app.audit("nightly")
    assert (entry.action, entry.actor, entry.reason) == ("backfill", "tester", "outage on the 24th")
    line = cli.refused("backfill", "nightly", "--from", "2022-01-01", "--to", "2025-10-01")
    assert line.startswith("error: backfill 'nightly': more than 1,000 slots from")
    assert line.endswith("(--max 1000): narrow the range or raise --max")
    line = cli.refused(*args[:2], "--from", "2025-10-01", "--to", "2025-10-24", "--max", "5")
    assert "more than 5 slots" in line
    code, _, err = cli("backfill", "nightly", "--from", "yesterday", "--to", "2025-10-28")
    assert code == 2 and "'yesterday' is not an ISO-8601 date or time" in err
    assert cli.refused("backfill", "ghost", "--from", "2025-10-01", "--to", "2025-10-02") == (
        "error: no task named 'ghost' (run `scheduler sync`?)"
    )
    assert count_jobs(app) == 4 and entries(app) == 2  # the sync and the one backfill


def count_jobs(app: Scheduler) -> int:
    with app.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())


def test_unknown_names_and_ids_are_refused_everywhere(cli: Cli, app: Scheduler) -> None:
    """A task name, a job id or a value no job can have is one error line and exit status 1,
    as `explain` does, never an empty answer that looks like "nothing yet"; a task that exists
    (a row, even without jobs or audit entries) answers "nothing yet"."""
    cli.ok("sync")
    cli.ok("disable", "nightly", "--reason", "maintenance")  # the log is not empty
    unknown = "error: no task named 'no-such-task' (run `scheduler sync`?)"
    for args in (
        ["audit", "no-such-task"],
        ["jobs", "--task", "no-such-task"],
        ["jobs", "--task", "no-such-task", "--json"],
        ["explain", "no-such-task"],
        ["enable", "no-such-task"],
        ["disable", "no-such-task"],
        ["trigger", "no-such-task"],
        ["backfill", "no-such-task", "--from", "2025-10-24", "--to", "2025-10-25"],
    ):
        assert cli.refused(*args) == unknown, args
    for args in (["audit", "job 999999"], ["job", "999999"], ["retry", "999999"]):
        assert cli.refused(*args) == "error: no job 999999", args
    assert cli.refused("cancel", "999999") == "error: no job 999999"
    too_long = "error: ValueError: handler is 201 characters, over the 200-character limit"
    assert cli.refused("jobs", "--handler", "h" * 201) == too_long
    assert cli.refused("jobs", "--queue", "q" * 101).endswith("over the 100-character limit")
    # Known names with nothing to show: "nothing yet", exit status 0.
    assert cli.ok("jobs", "--task", "nightly") == "no jobs\n"
    assert cli.ok("jobs", "--handler", "never-used") == "no jobs\n"
    assert "disable" in cli.ok("audit", "nightly")
    # A task removed from the file stays a (disabled) row: still known.
    cli.config.write_text(cli.config.read_text().split("[[tasks]]")[0])
    cli.ok("sync")
    assert cli.ok("jobs", "--task", "nightly") == "no jobs\n"
    # `audit "job N"` of a task's job: its own entries, filed under the task.
    cli.config.write_text(cli.config.read_text() + TASKS)
    cli.ok("sync")
    cli.ok("backfill", "nightly", "--from", "2025-10-24", "--to", "2025-10-25")
    job_id = app.jobs(task="nightly")[0].id
    with app.store.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(state="aborted"))
    cli.ok("retry", str(job_id), "--reason", "one more go")
    found = json.loads(cli.ok("audit", f"job {job_id}", "--json"))["entries"]
    assert [(e["action"], e["target"], e["detail"]) for e in found] == [
        ("retry", "nightly", f"job {job_id}")
    ]
    other = app.enqueue("works")
    assert cli.ok("audit", f"job {other}") == "nothing audited yet\n"  # exists, no entries


def test_the_python_api_refuses_unknown_names_too(app: Scheduler) -> None:
    with pytest.raises(UnknownRow, match="no task named 'ghost'"):
        app.jobs(task="ghost")
    with pytest.raises(UnknownRow, match="no task named 'ghost'"):
        app.audit("ghost")
    with pytest.raises(JobStateError, match="no job 424242"):
        app.audit("job 424242")
    with pytest.raises(JobStateError, match="no job 424242"):
        app.history(424242)
    job_id = app.enqueue("works")
    assert app.history(job_id) == [] and app.audit(f"job {job_id}") == []
    assert app.audit() == [] and app.jobs(handler="nobody") == []
