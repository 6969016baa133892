"""The dashboard's Tasks page filters and its New task, Edit and Remove forms for the
application's tasks (``source`` ``api``), over HTTP (Starlette's TestClient) on every engine.

The forms call ``put_task`` and ``remove_task``: the same checks and messages (the error shown
beside the field its key names), the signed-in user as the actor in the audit; a refused form
writes nothing. A task of the file is never edited here: its page says which file manages it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from scheduler import Scheduler, TaskSpec
from scheduler._config import DashboardSettings
from scheduler._model.handlers import Registry
from scheduler.dashboard import create_app, hash_password
from scheduler.testing import ManualClock

PASSWORD = "correct horse"
HASH = hash_password(PASSWORD, ln=10)  # cheap for tests
NOW = datetime(2030, 3, 6, 12, 0, tzinfo=UTC)  # Chicago moves to CDT on Sunday 2030-03-10
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    scheduler = Scheduler(db_url, registry=Registry(), clock=ManualClock(NOW))
    scheduler.sync([TaskSpec("nightly", "0 3 * * *", "ok", {}, "Europe/Berlin")])
    yield scheduler
    scheduler.close()


def csrf_of(text: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', text)
    assert found, "no CSRF field on the page"
    return found.group(1)


def signed_in(app: Scheduler) -> tuple[TestClient, str]:
    settings = DashboardSettings(actions=True, username="ops", password_hash=HASH)
    c = TestClient(create_app(app, settings), follow_redirects=False)
    token = csrf_of(c.get("/login").text)
    r = c.post("/login", data={"username": "ops", "password": PASSWORD, "csrf": token})
    assert r.status_code == 303, r.text
    return c, csrf_of(c.get("/tasks").text)


def form(csrf: str, **changes: str) -> dict[str, str]:
    values = {
        "csrf": csrf,
        "name": "crm-sync-42",
        "cron": "0 6 * * *",
        "timezone": "America/Chicago",
        "handler": "crm.sync",
        "payload": '{"customer": 42}',
        "tenant": "acme",
        "group": "customer-42",
        "overlap": "hold",
        "catchup_window": "0",
        "jitter": "0",
        "max_consecutive_failures": "",
        "enabled": "on",
        "op": "save",
    }
    values.update(changes)
    return values


def error_beside(page: str, field: str) -> str:
    found = re.search(rf'<p class="field-error" id="err-{field}"[^>]*>([^<]*)</p>', page)
    assert found, f"no error slot for {field}"
    return html.unescape(found.group(1))


def listed(c: TestClient, query: str) -> list[str]:
    page = c.get(f"/tasks?{query}").text
    return [html.unescape(n) for n in re.findall(r'<tr data-task="([^"]*)"', page)]


def test_new_task_creates_an_api_row_audited_with_the_user(app: Scheduler) -> None:
    c, csrf = signed_in(app)
    page = c.get("/task-new")
    assert page.status_code == 200 and 'action="/task-new"' in page.text
    r = c.post("/task-new", data=form(csrf, reason="customer signed up"))
    assert r.status_code == 303 and r.headers["location"] == "/tasks/crm-sync-42"
    row = app.get_row("crm-sync-42")
    assert row is not None and (row.source, row.group, row.tenant) == ("api", "customer-42", "acme")
    assert row.payload == {"customer": 42} and row.timezone == "America/Chicago"
    [entry] = app.audit("crm-sync-42")
    assert (entry.action, entry.actor, entry.reason) == ("put_task", "ops", "customer signed up")
    assert "crm-sync-42 created." in c.get("/tasks/crm-sync-42").text


def test_preview_shows_the_next_fires_in_the_zone_and_utc_and_writes_nothing(
    app: Scheduler,
) -> None:
    c, csrf = signed_in(app)
    for url in ("/task-new", "/task-preview"):  # the Preview button and the live fragment
        r = c.post(url, data=form(csrf, op="preview"))
        assert r.status_code == 200, r.text
        assert "2030-03-07 06:00:00 CST" in r.text and "2030-03-07 12:00:00Z" in r.text
        # Sunday's change to summer time is marked; the fires after it are at 11:00 UTC
        assert "DST UTC-06:00 → UTC-05:00" in r.text and "2030-03-10 11:00:00Z" in r.text
    assert app.get_row("crm-sync-42") is None
    assert [e.action for e in app.audit(limit=10)] == ["sync"]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("cron", "61 * * * *", "task 'crm-sync-42': key 'cron'"),
        ("timezone", "Mars/Olympus", "task 'crm-sync-42': key 'timezone': unknown timezone"),
        ("payload", "[1, 2", "task 'crm-sync-42': key 'payload': not JSON"),
        ("payload", "[1, 2]", "task 'crm-sync-42': key 'payload': expected a JSON object"),
        ("jitter", "soon", "task 'crm-sync-42': key 'jitter': expected a whole number"),
        ("group", "g" * 201, "task 'crm-sync-42': key 'group': longer than 200 characters"),
        ("handler", "", "task 'crm-sync-42': key 'handler'"),
        ("name", "nightly", "task 'nightly' is managed by"),
    ],
)
def test_a_refused_form_shows_the_error_beside_its_field_and_writes_nothing(
    app: Scheduler, field: str, value: str, expected: str
) -> None:
    c, csrf = signed_in(app)
    before = app.get_row("nightly")
    r = c.post("/task-new", data=form(csrf, **{field: value}))
    assert r.status_code == 400
    assert error_beside(r.text, field).startswith(expected)
    assert app.get_row("crm-sync-42") is None and app.get_row("nightly") == before
    assert [e.action for e in app.audit(limit=10)] == ["sync"]
    live = c.post("/task-preview", data=form(csrf, **{field: value}))
    assert live.status_code == 400 and f'data-field="{field}"' in live.text


def test_new_task_refuses_the_name_of_an_existing_task(app: Scheduler) -> None:
    c, csrf = signed_in(app)
    c.post("/task-new", data=form(csrf))
    before = app.get_row("crm-sync-42")
    r = c.post("/task-new", data=form(csrf, cron="0 9 * * *"))
    assert r.status_code == 400
    assert error_beside(r.text, "name") == "task 'crm-sync-42' exists: edit it instead"
    assert app.get_row("crm-sync-42") == before


def test_edit_changes_only_what_changed_and_the_name_stays(app: Scheduler) -> None:
    c, csrf = signed_in(app)
    c.post("/task-new", data=form(csrf))
    page = c.get("/task-edit/crm-sync-42")
    assert page.status_code == 200 and 'value="0 6 * * *"' in page.text
    r = c.post(
        "/task-edit/crm-sync-42", data=form(csrf, name="renamed", cron="0 7 * * *", op="save")
    )
    assert r.status_code == 303 and r.headers["location"] == "/tasks/crm-sync-42"
    row = app.get_row("crm-sync-42")
    assert row is not None and row.cron == "0 7 * * *" and app.get_row("renamed") is None
    assert app.audit("crm-sync-42")[0].detail == "updated: cron"
    assert "crm-sync-42 updated: cron." in c.get("/tasks/crm-sync-42").text


def test_edit_keeps_what_the_form_has_no_field_for(app: Scheduler) -> None:
    """A task's ``timeout``, ``recovery`` and ``probe_intervals`` (set through ``put_task``)
    survive an edit on the form, which has no field for them."""
    c, csrf = signed_in(app)
    c.post("/task-new", data=form(csrf))
    row = app.get_row("crm-sync-42")
    assert row is not None
    spec = TaskSpec(
        row.name,
        row.cron,
        row.handler,
        row.payload,
        row.timezone,
        tenant=row.tenant,
        group=row.group,
        timeout=30,
        recovery="probe",
        probe_intervals=(60, 600),
    )
    app.put_task(spec)
    r = c.post("/task-edit/crm-sync-42", data=form(csrf, cron="0 7 * * *", op="save"))
    assert r.status_code == 303
    row = app.get_row("crm-sync-42")
    assert row is not None and row.cron == "0 7 * * *"
    assert (row.timeout, row.recovery, row.probe_intervals) == (30.0, "probe", (60.0, 600.0))


def test_a_file_task_says_who_manages_it_and_has_no_edit(app: Scheduler) -> None:
    c, csrf = signed_in(app)
    c.post("/task-new", data=form(csrf))
    page = c.get("/tasks/nightly").text
    assert "managed by" in page and "/task-edit/" not in page and "/actions/remove/" not in page
    api = c.get("/tasks/crm-sync-42").text
    assert "managed by" not in api and "/task-edit/crm-sync-42" in api
    assert "/actions/remove/crm-sync-42" in api
    before = app.get_row("nightly")
    assert c.get("/task-edit/nightly").status_code == 403
    assert c.post("/task-edit/nightly", data=form(csrf, cron="0 4 * * *")).status_code == 403
    r = c.post("/actions/remove/nightly", data={"csrf": csrf, "next": "/tasks"})
    assert r.status_code == 303 and app.get_row("nightly") == before
    assert "is managed by" in c.get("/tasks").text  # the refusal, as the flash message


def test_remove_stops_the_task_and_is_audited(app: Scheduler) -> None:
    c, csrf = signed_in(app)
    c.post("/task-new", data=form(csrf))
    r = c.post("/actions/remove/crm-sync-42", data={"csrf": csrf, "next": "/tasks"})
    assert r.status_code == 303 and r.headers["location"] == "/tasks"
    assert app.get_row("crm-sync-42") is None
    newest = app.audit("crm-sync-42")[0]
    assert (newest.action, newest.actor) == ("remove_task", "ops")


@pytest.mark.parametrize("url", ["/task-new", "/task-preview", "/task-edit/crm-sync-42"])
def test_forms_need_csrf_sign_in_and_actions(app: Scheduler, url: str) -> None:
    app.put_task(TaskSpec("crm-sync-42", "0 6 * * *", "crm.sync", {}, "UTC"))
    before = app.get_row("crm-sync-42")
    c, csrf = signed_in(app)
    assert c.post(url, data=form("forged", cron="0 9 * * *")).status_code == 403
    anonymous = TestClient(
        create_app(app, DashboardSettings(actions=True, username="ops", password_hash=HASH)),
        follow_redirects=False,
    )
    assert anonymous.post(url, data=form(csrf, cron="0 9 * * *")).status_code == 401
    read_only = TestClient(create_app(app, DashboardSettings()), follow_redirects=False)
    assert read_only.post(url, data=form(csrf, cron="0 9 * * *")).status_code == 403
    assert app.get_row("crm-sync-42") == before
    assert app.audit("crm-sync-42")[0].action == "put_task"  # the set-up's only


def test_read_only_dashboard_offers_no_forms(app: Scheduler) -> None:
    c = TestClient(create_app(app, DashboardSettings()), follow_redirects=False)
    assert "/task-new" not in c.get("/tasks").text
    assert c.get("/task-new").status_code == 403


def test_tasks_page_filters_by_prefix_group_tenant_and_source_and_pages(app: Scheduler) -> None:
    specs: list[Any] = [
        TaskSpec(f"cust-{i:03}", "0 6 * * *", "crm.sync", {}, "UTC", tenant=t, group=g)
        for i, (t, g) in enumerate(
            [("acme", "g1")] * 60 + [("globex", "g2")] * 3 + [("initech", HOSTILE)]
        )
    ]
    app.put_tasks(specs)
    c, _ = signed_in(app)
    assert listed(c, "source=file") == ["nightly"]
    assert listed(c, "group=g2") == ["cust-060", "cust-061", "cust-062"]
    assert listed(c, "tenant=globex&prefix=cust-06") == ["cust-060", "cust-061", "cust-062"]
    assert listed(c, "prefix=cust-00") == [f"cust-00{i}" for i in range(10)]
    assert listed(c, "prefix=ust") == []  # a prefix, not "contains"
    first = c.get("/tasks?source=api&group=g1").text
    assert len(re.findall(r"<tr data-task=", first)) == 50
    found = re.search(r'href="/tasks\?([^"]+)">next', first)
    assert found, "no next page"
    query = html.unescape(found.group(1))
    assert "group=g1" in query and "source=api" in query and "after=cust-049" in query
    assert listed(c, query) == [f"cust-{i:03}" for i in range(50, 60)]
    page = c.get(f"/tasks?group={HOSTILE}").text
    assert HOSTILE not in page and html.escape(HOSTILE, quote=False) in page
    assert "api · group" in page


def test_a_file_task_names_its_configuration_file(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "app.toml"
    path.write_text(
        f'[database]\nurl = "{db_url}"\n\n'
        '[[tasks]]\nname = "nightly"\ncron = "0 3 * * *"\nhandler = "ok"\n'
    )
    app = Scheduler.from_toml(path, registry=Registry())
    try:
        app.sync()
        c, _ = signed_in(app)
        assert "managed by app.toml" in c.get("/tasks/nightly").text
        r = c.get("/task-edit/nightly")
        assert r.status_code == 403 and "managed by app.toml" in r.text
    finally:
        app.close()
