"""The dashboard's security rules and pages over HTTP (Starlette's TestClient, real databases).

Each refusal is checked twice: the status code, and that the database did not change.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers.dashboard_client import client
from sqlalchemy import event, update
from starlette.testclient import TestClient

from scheduler import ConfigError, PermanentError, Scheduler, TaskSpec
from scheduler._config import DashboardSettings, parse_config
from scheduler._model.handlers import Registry
from scheduler._store.tables import rows
from scheduler.dashboard import create_app, hash_password, verify_password
from scheduler.dashboard._auth import check_bind, check_hash_format
from scheduler.testing import ManualClock

HOSTILE = "<script>alert(1)</script>"
HOSTILE_CODE = "bad\"'<b>code</b>"
PASSWORD = "correct horse"
HASH = hash_password(PASSWORD, ln=10)  # cheap for tests; the default is ln=14


def seed(app: Scheduler) -> None:
    @app.handler("ok")
    def ok(job: object) -> None:
        return None

    @app.handler("bad", max_attempts=1)
    def bad(job: object) -> None:
        raise PermanentError(HOSTILE_CODE)

    app.sync(
        [
            TaskSpec("nightly", "0 3 * * *", "ok", {"region": "eu"}, "Europe/Berlin"),
            TaskSpec(HOSTILE, "*/5 * * * *", "bad", {}, "UTC"),
        ]
    )
    for name in ("nightly", HOSTILE):
        app.trigger(name)
    app.tick()
    app.work()


@pytest.fixture
def app(db_url_sp: str) -> Iterator[Scheduler]:
    scheduler = Scheduler(db_url_sp, registry=Registry())
    seed(scheduler)
    yield scheduler
    scheduler.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def signed_in(app: Scheduler) -> tuple[TestClient, str]:
    c = client(app, actions=True, username="ops", password_hash=HASH)
    token = csrf_of(c.get("/login").text)
    r = c.post("/login", data={"username": "ops", "password": PASSWORD, "csrf": token})
    assert r.status_code == 303, r.text
    return c, csrf_of(c.get("/tasks").text)


def state(app: Scheduler) -> tuple[Any, ...]:
    row = app.get_row("nightly")
    assert row is not None
    job = app.get_job(row.last_job_id) if row.last_job_id else None
    return row.enabled, row.next_run_at, row.version, job and job.state


# -- pages ----------------------------------------------------------------------------------
def test_every_page_renders_and_escapes_what_users_wrote(app: Scheduler) -> None:
    c = client(app)
    bad = app.get_row(HOSTILE)
    assert bad is not None and bad.last_job_id is not None
    pages = ["/tasks", "/tasks/nightly", f"/jobs/{bad.last_job_id}", "/jobs", "/health"]
    pages.append("/tasks/%3Cscript%3Ealert%281%29%3C%2Fscript%3E")
    for path in pages:
        r = c.get(path)
        assert r.status_code == 200, path
        assert "<script>alert" not in r.text and "<b>code</b>" not in r.text, path
        assert "script-src 'self'" in r.headers["content-security-policy"]
    tasks = c.get("/tasks").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in tasks
    assert "bad&#34;&#39;&lt;b&gt;code&lt;/b&gt;" in tasks  # the error code, escaped
    assert 'data-outcome="aborted"' in tasks and 'data-outcome="succeeded"' in tasks
    assert c.get("/tasks/no-such-task").status_code == 404
    assert c.get("/jobs/999999").status_code == 404


def test_filters_and_the_live_fragment(app: Scheduler) -> None:
    c = client(app)
    failing = c.get("/tasks?state=failing").text
    assert "&lt;script&gt;" in failing and ">nightly<" not in failing
    assert ">nightly<" in c.get("/tasks?name=nigh").text
    live = c.get("/jobs?state=aborted", headers={"X-Dashboard-Live": "1"}).text
    assert live.lstrip().startswith("<table") and "<html" not in live
    assert "succeeded" not in live and "aborted" in live
    assert "no job matches" in c.get("/jobs?handler=nope").text.lower()


def test_overdue_and_held_back_filters_list_the_rows_status_warns_about(db_url: str) -> None:
    """The Tasks page's ``overdue`` and ``held_back`` filters, on every engine: the rows the
    health warnings name (the same conditions and thresholds), linked from Workers & health."""
    t0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
    app = Scheduler(db_url, registry=Registry(), clock=ManualClock(t0))
    try:
        app.sync([TaskSpec(n, "0 3 * * *", "h", {}, "UTC") for n in ("late", "held", "fine")])
        held_job = app.enqueue("h")  # queued: the held row's job in flight
        with app.store.begin() as conn:
            two_hours_ago = t0 - timedelta(hours=2)
            conn.execute(
                update(rows)
                .where(rows.c.name.in_(["late", "held"]))
                .values(next_run_at=two_hours_ago)
            )
            conn.execute(update(rows).where(rows.c.name == "held").values(last_job_id=held_job))
        health = app.status()["health"]["warnings"]
        assert any("late" in w and "overdue" in w for w in health), health
        assert any("held" in w and "in flight" in w for w in health), health
        c = client(app)

        def listed(state: str) -> list[str]:
            page = c.get(f"/tasks?state={state}")
            assert page.status_code == 200
            return re.findall(r'href="/tasks/([^"]+)"', page.text)

        assert listed("overdue") == ["late"]
        assert listed("held_back") == ["held"]
        assert sorted(listed("")) == ["fine", "held", "late"]
        page = c.get("/tasks?state=held_back").text
        assert 'value="held_back" checked' in page and ">held back</label>" in page
        health_page = c.get("/health").text
        assert 'href="/tasks?state=overdue">1 overdue task(s)' in health_page
        assert 'href="/tasks?state=held_back">1 task(s) held back' in health_page
    finally:
        app.close()


def test_ad_hoc_job_payload_shows_keys_not_values(app: Scheduler) -> None:
    job_id = app.enqueue("ok", {"customer": "ACME-SECRET-ISH"})
    html = client(app).get(f"/jobs/{job_id}").text
    assert "customer" in html and "ACME-SECRET-ISH" not in html
    row_page = client(app).get("/tasks/nightly").text
    assert "region" in row_page and "eu" in row_page  # the TOML's payload: the user wrote it


def test_live_refresh_costs_at_most_three_statements_per_page(app: Scheduler) -> None:
    c = client(app, refresh_seconds=60)  # the health cache below outlives a slow machine
    bad = app.get_row(HOSTILE)
    assert bad is not None
    counted: list[str] = []

    def count(*args: Any) -> None:
        counted.append(args[2])

    event.listen(app.store.engine, "before_cursor_execute", count)
    try:
        for path in ("/tasks", "/tasks/nightly", "/jobs", f"/jobs/{bad.last_job_id}"):
            counted.clear()
            assert c.get(path, headers={"X-Dashboard-Live": "1"}).status_code == 200
            assert len(counted) <= 3, (path, counted)
        # Workers & health is _health.overview() (three statements), computed at most once
        # per refresh interval for every viewer: a second tab within it costs nothing. The
        # finished states' counts are one statement in the background, at most once per
        # interval too (the first request starts it; waited for here, so it is not counted).
        dash = c.app.state.dashboard  # type: ignore[attr-defined]
        dash.finished.get()
        dash.finished.wait()
        counted.clear()
        c.get("/health", headers={"X-Dashboard-Live": "1"})
        assert 0 < len(counted) <= 3, counted
        assert not any("'succeeded'" in s or "AS succeeded" in s for s in counted), counted
        counted.clear()
        client(app).get("/health")  # another dashboard process: its own cache
        counted.clear()
        assert c.get("/health", headers={"X-Dashboard-Live": "1"}).status_code == 200
        assert counted == []
    finally:
        event.remove(app.store.engine, "before_cursor_execute", count)


# -- security ------------------------------------------------------------------------------
def test_read_only_by_default_no_buttons_and_actions_refused(app: Scheduler) -> None:
    c = client(app)
    before = state(app)
    assert "/actions/" not in c.get("/tasks/nightly").text
    dash = c.app.state.dashboard  # type: ignore[attr-defined]
    session = dash.signer.loads(c.cookies.get("scheduler_dashboard"))
    token = dash.signer.csrf_token(session["sid"])  # a valid token: refused all the same
    r = c.post("/actions/trigger/nightly", data={"csrf": token})
    assert r.status_code == 403 and state(app) == before


def test_actions_need_credentials(app: Scheduler) -> None:
    with pytest.raises(ConfigError, match="key 'actions': true needs a signed-in user"):
        create_app(app, DashboardSettings(actions=True))


def test_with_credentials_pages_need_sign_in(app: Scheduler) -> None:
    c = client(app, actions=True, username="ops", password_hash=HASH)
    r = c.get("/tasks?state=failing")
    assert r.status_code == 303 and r.headers["location"].startswith("/login?next=")
    assert c.get("/tasks", headers={"X-Dashboard-Live": "1"}).status_code == 401
    before = state(app)
    token = csrf_of(c.get("/login").text)
    assert c.post("/actions/trigger/nightly", data={"csrf": token}).status_code == 401
    assert state(app) == before


def test_wrong_password_or_user_is_401_and_signs_nobody_in(app: Scheduler) -> None:
    c = client(app, actions=True, username="ops", password_hash=HASH)
    for user, password in (("ops", "wrong"), ("root", PASSWORD), ("", "")):
        token = csrf_of(c.get("/login").text)
        r = c.post("/login", data={"username": user, "password": password, "csrf": token})
        assert r.status_code == 401 and "Wrong username or password" in r.text
        assert c.get("/tasks").status_code == 303  # still signed out


def test_sign_in_sets_a_strict_httponly_cookie_and_then_actions_work(app: Scheduler) -> None:
    c = client(app, actions=True, username="ops", password_hash=HASH)
    token = csrf_of(c.get("/login").text)
    r = c.post("/login", data={"username": "ops", "password": PASSWORD, "csrf": token})
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    page = c.get("/tasks/nightly").text
    r = c.post("/actions/disable/nightly", data={"csrf": csrf_of(page), "reason": "maintenance"})
    assert r.status_code == 303
    row = app.get_row("nightly")
    assert row is not None and not row.enabled
    assert "Disabled nightly: maintenance" in c.get(r.headers["location"]).text


def test_missing_or_stale_csrf_is_403_and_changes_nothing(app: Scheduler) -> None:
    c, token = signed_in(app)
    before = state(app)
    assert c.post("/actions/trigger/nightly", data={}).status_code == 403
    assert c.post("/actions/trigger/nightly", data={"csrf": "forged"}).status_code == 403
    # Sign out and in again: the old session's token is stale.
    assert c.post("/logout", data={"csrf": token}).status_code == 303
    fresh = csrf_of(c.get("/login").text)
    c.post("/login", data={"username": "ops", "password": PASSWORD, "csrf": fresh})
    assert c.post("/actions/trigger/nightly", data={"csrf": token}).status_code == 403
    assert state(app) == before
    # The login form is guarded too.
    other = client(app, actions=True, username="ops", password_hash=HASH)
    r = other.post("/login", data={"username": "ops", "password": PASSWORD})
    assert r.status_code == 403


def test_get_to_an_action_url_is_405_and_changes_nothing(app: Scheduler) -> None:
    c, _token = signed_in(app)
    before = state(app)
    bad = app.get_row(HOSTILE)
    assert bad is not None
    for path in (
        "/actions/trigger/nightly",
        "/actions/enable/nightly",
        "/actions/disable/nightly",
        f"/actions/retry/{bad.last_job_id}",
        f"/actions/cancel/{bad.last_job_id}",
    ):
        assert c.get(path).status_code == 405, path
    assert state(app) == before
    assert app.get_job(bad.last_job_id).state == "aborted"  # type: ignore[arg-type, union-attr]


def test_every_action_changes_the_database(app: Scheduler) -> None:
    c, token = signed_in(app)
    bad = app.get_row(HOSTILE)
    assert bad is not None and bad.last_job_id is not None
    r = c.post(f"/actions/retry/{bad.last_job_id}", data={"csrf": token, "next": "/jobs"})
    assert r.status_code == 303 and r.headers["location"] == "/jobs"
    assert app.get_job(bad.last_job_id).state == "queued"  # type: ignore[union-attr]
    c.post(f"/actions/cancel/{bad.last_job_id}", data={"csrf": token})
    job = app.get_job(bad.last_job_id)
    assert job is not None and (job.state, job.last_error_code) == ("aborted", "cancelled")
    c.post("/actions/trigger/nightly", data={"csrf": token})
    row = app.get_row("nightly")
    assert row is not None and row.next_run_at is not None
    assert row.next_run_at <= app.clock()
    c.post("/actions/disable/nightly", data={"csrf": token})  # no reason: refused
    assert app.get_row("nightly").enabled  # type: ignore[union-attr]
    c.post("/actions/disable/nightly", data={"csrf": token, "reason": "vacation"})
    assert not app.get_row("nightly").enabled  # type: ignore[union-attr]
    c.post("/actions/enable/nightly", data={"csrf": token})
    assert app.get_row("nightly").enabled  # type: ignore[union-attr]
    # A refused action (cancelling a job that is no longer queued) says why, changes nothing.
    r = c.post(f"/actions/cancel/{bad.last_job_id}", data={"csrf": token})
    assert r.status_code == 303
    assert f"Refused: job {bad.last_job_id} is aborted" in c.get(r.headers["location"]).text
    assert app.get_job(bad.last_job_id).last_error_code == "cancelled"  # type: ignore[union-attr]


def test_next_never_leaves_the_dashboard(app: Scheduler) -> None:
    c, token = signed_in(app)
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        r = c.post("/actions/trigger/nightly", data={"csrf": token, "next": target})
        assert r.headers["location"] == "/tasks"


def test_mounted_under_a_prefix(app: Scheduler) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/ops/scheduler", app=create_app(app))])
    c = TestClient(host, follow_redirects=False)
    html = c.get("/ops/scheduler/tasks").text
    assert 'href="/ops/scheduler/static/dashboard.css"' in html
    assert c.get("/ops/scheduler/static/live.js").status_code == 200


# -- binding, config and the password hash ---------------------------------------------------
def test_non_loopback_address_needs_credentials() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_bind(host, DashboardSettings())
    for host in ("0.0.0.0", "192.0.2.10", "::", "example.org"):
        with pytest.raises(
            ConfigError, match=f"refusing to serve the dashboard on {re.escape(host)}"
        ):
            check_bind(host, DashboardSettings())
        check_bind(host, DashboardSettings(username="ops", password_hash=HASH))


def test_password_hash_from_the_environment(
    app: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDULER_DASHBOARD_PASSWORD_HASH", HASH)
    check_bind("0.0.0.0", DashboardSettings(username="ops"))
    c = client(app, username="ops")
    token = csrf_of(c.get("/login").text)
    r = c.post("/login", data={"username": "ops", "password": PASSWORD, "csrf": token})
    assert r.status_code == 303


def test_hash_format_is_phc_scrypt_and_verifies() -> None:
    assert HASH.startswith("$scrypt$ln=10,r=8,p=1$")
    check_hash_format(HASH)
    assert verify_password(PASSWORD, HASH) and not verify_password("nope", HASH)
    assert hash_password(PASSWORD) != hash_password(PASSWORD)  # salted
    with pytest.raises(ValueError, match="PHC"):
        check_hash_format("plain-text-password")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"prot": 1}, "key 'prot': unknown key (did you mean 'port'?)"),
        ({"port": 70000}, "key 'port': must be at most 65535"),
        ({"actions": "yes"}, "key 'actions': expected a boolean"),
        ({"password_hash": "hunter2", "username": "ops"}, "key 'password_hash': not a scrypt"),
        ({"password_hash": HASH}, "key 'username': missing"),
        ({"refresh_seconds": 0.1}, "key 'refresh_seconds': must be at least 1"),
    ],
)
def test_dashboard_table_errors_name_file_and_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"dashboard": table}, "app.toml")
    text = str(caught.value)
    assert text.startswith("app.toml: [dashboard]: ") and message in text and "\n" not in text


def test_dashboard_table_is_read(tmp_path: Path) -> None:
    config = parse_config(
        {"dashboard": {"port": 9000, "actions": True, "username": "ops", "password_hash": HASH}}
    )
    assert config.dashboard == DashboardSettings(
        port=9000, actions=True, username="ops", password_hash=HASH
    )
    path = tmp_path / "app.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/x.db"\n[dashboard]\nport = 9001\n')
    assert Scheduler.from_toml(path).dashboard_settings.port == 9001


def test_cli_hash_password_reads_stdin(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scheduler", "dashboard", "--hash-password"],
        input="s3cret\n",
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    check_hash_format(out)
    assert verify_password("s3cret", out)


def test_cli_refuses_a_public_address_without_credentials(tmp_path: Path) -> None:
    path = tmp_path / "app.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/x.db"\n')
    subprocess.run(
        [sys.executable, "-m", "scheduler", "-c", str(path), "migrate"],
        check=True,
        capture_output=True,
    )
    r = subprocess.run(
        [sys.executable, "-m", "scheduler", "-c", str(path), "dashboard", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: {path}: [dashboard]: refusing to serve the dashboard on 0.0.0.0")
    )


def test_tasks_and_jobs_are_keyset_paginated(app: Scheduler) -> None:
    app.sync(
        [TaskSpec(f"t-{i:03d}", "0 3 * * *", "ok", {}, "UTC") for i in range(60)],
    )
    ids = [app.enqueue("ok", {}) for _ in range(55)]
    c = client(app)
    first = c.get("/tasks?name=t-").text
    assert "t-049" in first and "t-050" not in first
    link = re.search(r'href="(/tasks\?[^"]*after=[^"]+)"', first)
    assert link, "no next-page link"
    second = c.get(link.group(1).replace("&amp;", "&")).text
    assert "t-050" in second and "t-059" in second and "t-049" not in second
    assert "after=" not in second  # the last page
    jobs = c.get("/jobs?handler=ok").text
    assert f'data-job="{ids[-1]}"' in jobs and f'data-job="{ids[4]}"' not in jobs
    older = re.search(r'href="(/jobs\?[^"]*before=\d+)"', jobs)
    assert older, "no older-page link"
    rest = c.get(older.group(1).replace("&amp;", "&")).text
    assert f'data-job="{ids[4]}"' in rest and f'data-job="{ids[-1]}"' not in rest


def test_cli_serves_the_dashboard(tmp_path: Path) -> None:
    """`scheduler dashboard` really serves: a subprocess on a free loopback port, one GET."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "app.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/x.db"\n[dashboard]\nport = {port}\n')
    subprocess.run(
        [sys.executable, "-m", "scheduler", "-c", str(path), "migrate"],
        check=True,
        capture_output=True,
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "-c", str(path), "dashboard"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/tasks", timeout=5) as r:
                    body = r.read().decode()
                    headers = dict(r.headers)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "the dashboard did not answer"
                time.sleep(0.2)
        assert "No task matches: run <code>scheduler sync</code>" in body
        assert "script-src 'self'" in headers["content-security-policy"]
    finally:
        server.terminate()
        server.communicate(timeout=20)  # reaps it and closes its stderr pipe


# -- /metrics ---------------------------------------------------------------------------------
def _families(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name: family for family in text_string_to_metric_families(text)}


def test_the_dashboard_serves_metrics_read_from_the_database(app: Scheduler) -> None:
    r = client(app).get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    found = _families(r.text)
    tasks = {s.labels["state"]: s.value for s in found["scheduler_tasks"].samples}
    assert tasks == {"enabled": 2, "disabled": 0}
    failures = {
        s.labels["task"]: s.value for s in found["scheduler_task_consecutive_failures"].samples
    }
    assert set(failures) == {"nightly", HOSTILE}  # a label value, not markup: nothing to escape
    aborted = [
        s.value
        for s in found["scheduler_jobs_by_state"].samples
        if s.labels == {"state": "aborted", "queue": "default"}
    ]
    assert aborted == [1]


def test_with_credentials_metrics_take_http_basic_and_nothing_else(app: Scheduler) -> None:
    import base64

    c = client(app, username="ops", password_hash=HASH)

    def basic(user: str, password: str) -> dict[str, str]:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    refused = c.get("/metrics")
    assert refused.status_code == 401 and "scheduler_tasks" not in refused.text
    assert refused.headers["www-authenticate"].startswith("Basic")
    assert c.get("/metrics", headers=basic("ops", "wrong")).status_code == 401
    assert c.get("/metrics", headers=basic("someone", PASSWORD)).status_code == 401
    assert c.get("/metrics", headers=basic("öps", PASSWORD)).status_code == 401  # not a 500
    assert c.get("/metrics", headers={"Authorization": "Basic !!!"}).status_code == 401
    ok = c.get("/metrics", headers=basic("ops", PASSWORD))
    assert ok.status_code == 200 and "scheduler_tasks" in ok.text


def test_the_task_page_shows_explain(app: Scheduler) -> None:
    """The Task page is explain's data: its state sentence, policies and decisions."""
    data = app.explain("nightly")
    page = client(app).get("/tasks/nightly").text
    assert data["state"].startswith("scheduled: job ")
    assert html.escape(data["state"], quote=False) in page
    assert "<h2>Decisions</h2>" in page
    decisions = page.split("<h2>Decisions</h2>", 1)[1].split("</table>", 1)[0]
    assert [d["decision"] for d in data["decisions"]] == ["dispatched", "triggered"]
    assert "<td>dispatched</td>" in decisions and "<td>triggered</td>" in decisions
    assert "catch-up window</dt><dd>unlimited" in page and "jitter</dt><dd>off" in page


def test_actions_are_audited_as_the_signed_in_user_and_the_audit_page_lists_them(
    app: Scheduler,
) -> None:
    c, token = signed_in(app)
    bad = app.get_row(HOSTILE)
    assert bad is not None and bad.last_job_id is not None
    seeded = len(app.audit())  # seed()'s sync and triggers, by user@host
    c.post(f"/actions/retry/{bad.last_job_id}", data={"csrf": token, "reason": HOSTILE})
    c.post("/actions/disable/nightly", data={"csrf": token, "reason": "vacation"})
    c.post("/actions/disable/nightly", data={"csrf": token})  # no reason: refused
    c.post(f"/actions/retry/{bad.last_job_id}", data={"csrf": token})  # queued now: refused
    found = [(e.actor, e.action, e.target, e.reason) for e in app.audit()][:-seeded]
    assert found == [
        ("ops", "disable", "nightly", "vacation"),
        ("ops", "retry", HOSTILE, HOSTILE),
    ]
    assert app.get_row("nightly").disabled_note == "vacation"  # type: ignore[union-attr]
    page = c.get("/audit")
    assert page.status_code == 200
    assert "<script>alert" not in page.text
    assert page.text.count('data-audit="') == 2 + seeded and "vacation" in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    only = c.get("/audit?target=nightly").text
    assert only.count('data-audit="') == 1 + 1  # the disable, and seed()'s trigger
    assert "disabled_in_config" not in c.get("/tasks").text and "vacation" in c.get("/tasks").text
