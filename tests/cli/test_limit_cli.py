"""Limits at the command line: a bad ``[[limits]]`` table fails ``sync`` with one line and
syncs nothing; a job a limit holds back says what it waits for in ``job ID``, ``jobs --json``,
``explain`` and the dashboard's job page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import Cli, write_config
from helpers.dashboard_client import client

from scheduler import Scheduler
from scheduler._model.handlers import Registry

TASK = '[[tasks]]\nname = "nightly"\ncron = "0 3 * * *"\nhandler = "t.ok"\n'
LIMIT = '\n[[limits]]\nname = "crm-api"\nhandlers = ["t.ok"]\n'


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)


@pytest.fixture
def url(tmp_path: Path, sqlite_template: Path) -> str:
    from conftest import make_url

    return make_url("sqlite", tmp_path, sqlite_template)


@pytest.mark.parametrize(
    ("limit", "key"),
    [
        ('rate = "lots"', "rate"),
        ("concurrency = 0", "concurrency"),
        ("concurrency = 1\nper = 'customer'", "per"),
    ],
)
def test_a_bad_limit_fails_sync_with_one_line_and_syncs_nothing(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], limit: str, key: str
) -> None:
    config = write_config(tmp_path, url, tasks=TASK + LIMIT + limit + "\n")
    code, out, err = Cli(config, capsys)("sync")
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert f"{config}: limit 'crm-api': key '{key}': " in err
    app = Scheduler(url, registry=Registry())
    try:
        assert app.status()["rows"] == []  # nothing synced
    finally:
        app.close()


def test_two_limits_with_one_name_fail_sync(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twice = LIMIT + "concurrency = 1\n" + LIMIT + "concurrency = 2\n"
    config = write_config(tmp_path, url, tasks=TASK + twice)
    code, _, err = Cli(config, capsys)("sync")
    assert code != 0
    assert err.strip().endswith(
        f"{config}: limit 'crm-api': key 'name': duplicate limit name (also limits[0])"
    )


@pytest.fixture
def held(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[dict[str, Any]]:
    """One job of t.ok running (claimed) under a limit of 1, and the task's job held back."""
    config = write_config(tmp_path, url, tasks=TASK + LIMIT + "concurrency = 1\n")
    cli = Cli(config, capsys)
    assert cli("sync")[0] == 0
    app = Scheduler.from_toml(config, registry=Registry())

    @app.handler("t.ok")
    def ok(job: object) -> None:
        pass

    running = app.enqueue("t.ok", {})
    assert [j.id for j in app.runner().claim(5)] == [running]
    app.trigger("nightly")
    app.tick()
    task_job = app.get_row("nightly").last_job_id
    assert task_job is not None and app.runner().claim(5) == []
    yield {"cli": cli, "app": app, "job": task_job}
    app.close()


def test_job_shows_what_it_waits_for(held: dict[str, Any]) -> None:
    code, out, _ = held["cli"]("job", str(held["job"]))
    assert code == 0
    assert "waiting for: limit crm-api: 1 of 1 running" in out
    code, out, _ = held["cli"]("job", str(held["job"]), "--json")
    data = json.loads(out)
    assert (data["state"], data["attempts"]) == ("queued", 0)
    assert data["waiting_for"] == "limit crm-api: 1 of 1 running"


def test_jobs_json_shows_what_each_waits_for(held: dict[str, Any]) -> None:
    code, out, _ = held["cli"]("jobs", "--json")
    assert code == 0
    waiting = {j["id"]: j["waiting_for"] for j in json.loads(out)["jobs"]}
    assert waiting[held["job"]] == "limit crm-api: 1 of 1 running"
    assert [w for i, w in waiting.items() if i != held["job"]] == [None]  # the running one


def test_explain_names_the_limit(held: dict[str, Any]) -> None:
    code, out, _ = held["cli"]("explain", "nightly", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["last_job"]["waiting_for"] == "limit crm-api: 1 of 1 running"
    assert (
        f"job {held['job']} is queued, held by a limit (limit crm-api: 1 of 1 running)"
        in (data["state"])
    )
    assert held["app"].get_row("nightly").consecutive_failures == 0


def test_dashboard_job_page_shows_what_it_waits_for(held: dict[str, Any]) -> None:
    page = client(held["app"]).get(f"/jobs/{held['job']}")
    assert page.status_code == 200
    assert "Waiting for limit crm-api: 1 of 1 running." in page.text
