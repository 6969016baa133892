"""``scheduler pause QUEUE`` / ``resume QUEUE`` in-process on each engine: what they print,
the audit entries, and how ``status`` (text and ``--json``) and ``jobs`` show a paused queue.
A refused name is one line on stderr, exit status 1, and nothing written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import Cli

from scheduler import Scheduler
from scheduler._model.handlers import Registry


@pytest.fixture
def cli(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.delenv("SCHEDULER_CONFIG", raising=False)
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    monkeypatch.setenv("SCHEDULER_ACTOR", "tester")
    config = tmp_path / "app.toml"
    config.write_text(f'[database]\nurl = "{db_url}"\n')
    return Cli(config, capsys)


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    found = Scheduler(db_url, registry=Registry())

    @found.handler("reports", queue="reports")
    def reports(job: Any) -> None:
        return None

    yield found
    found.close()


def test_pause_and_resume(cli: Cli, app: Scheduler) -> None:
    job_id = app.enqueue("reports")
    out = cli.ok("pause", "reports", "--reason", "vendor outage")
    assert out == "queue reports paused: workers claim none of its jobs until `resume reports`\n"
    assert cli.ok("pause", "reports") == "queue reports was paused already\n"
    status = cli.ok("status")
    line = next(x for x in status.splitlines() if x.startswith("queue reports paused since"))
    assert line.endswith(
        " by tester: vendor outage (its jobs wait; `scheduler resume` lets workers claim them)"
    )
    (paused,) = json.loads(cli.ok("status", "--json"))["health"]["paused_queues"]
    assert (paused["queue"], paused["paused_by"], paused["reason"]) == (
        "reports",
        "tester",
        "vendor outage",
    )
    table = cli.ok("jobs").splitlines()
    assert table[1].split()[:5] == [str(job_id), "-", "reports", "reports", "(paused)"]
    assert table[-1].startswith("queue reports paused since")
    listed = json.loads(cli.ok("jobs", "--json"))
    assert [p["queue"] for p in listed["paused_queues"]] == ["reports"]
    assert cli.ok("jobs", "--queue", "reports", "--state", "succeeded").startswith("no jobs\n")
    assert cli.ok("resume", "reports", "--actor", "ann") == "queue reports resumed\n"
    assert cli.ok("resume", "reports") == "queue reports was not paused\n"
    assert "paused" not in cli.ok("status") and "paused" not in cli.ok("jobs")
    found = json.loads(cli.ok("audit", "--json"))["entries"]
    assert [(e["action"], e["target"], e["actor"], e["reason"]) for e in found] == [
        ("resume", "queue reports", "ann", None),
        ("pause", "queue reports", "tester", "vendor outage"),
    ]


def test_a_bad_queue_name_is_one_line_and_nothing_written(cli: Cli, app: Scheduler) -> None:
    line = cli.refused("pause", " reports")
    assert line == (
        "error: ValueError: queue ' reports': must not have leading or trailing whitespace"
        " or control characters"
    )
    line = cli.refused("pause", "reports", "--reason", "r" * 501)
    assert line == "error: ValueError: reason is 501 characters, over the 500-character limit"
    assert app.paused_queues() == [] and app.audit() == []
