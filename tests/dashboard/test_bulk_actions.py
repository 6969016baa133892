"""Bulk retry and cancel on the Jobs page: a confirmation with the count, then the change in
chunks, each job audited; CSRF and sign-in as for the single actions (real databases)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from starlette.testclient import TestClient

from scheduler import Scheduler
from scheduler._config import DashboardSettings, WorkerSettings
from scheduler._model.handlers import Registry
from scheduler.dashboard import _bulk, create_app, hash_password

PASSWORD = "correct horse"
HASH = hash_password(PASSWORD, ln=10)  # cheap for tests


def _client(app: Scheduler, **settings: Any) -> TestClient:
    return TestClient(create_app(app, DashboardSettings(**settings)), follow_redirects=False)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def _signed_in(app: Scheduler) -> TestClient:
    c = _client(app, actions=True, username="ops", password_hash=HASH)
    token = _csrf(c.get("/login").text)
    r = c.post("/login", data={"username": "ops", "password": PASSWORD, "csrf": token})
    assert r.status_code == 303, r.text
    return c


def _form(page: str) -> dict[str, str]:
    """The confirmation form's hidden fields, as the browser would send them."""
    form = page.split('class="act bulk">', 1)[1].split("</form>", 1)[0]
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form)
    return {name: html.unescape(value) for name, value in fields}


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    scheduler = Scheduler(
        db_url, registry=Registry(), worker=WorkerSettings(queues=("default", "crm"))
    )

    @scheduler.handler("bad", retry_safe=True, max_attempts=1)
    def bad(job: Any) -> None:
        raise RuntimeError("down")

    yield scheduler
    scheduler.close()


def _abort(app: Scheduler, queue: str, n: int) -> list[int]:
    ids = [app.enqueue("bad", queue=queue) for _ in range(n)]
    app.work()
    assert {app.get_job(i).state for i in ids} == {"aborted"}  # type: ignore[union-attr]
    return ids


def _states(app: Scheduler, ids: list[int]) -> list[str]:
    return [app.get_job(i).state for i in ids]  # type: ignore[union-attr]


def test_bulk_retry_confirms_the_count_and_retries_what_the_filter_selects(
    app: Scheduler,
) -> None:
    crm = _abort(app, "crm", 5)
    other = _abort(app, "default", 3)
    c = _signed_in(app)
    jobs_page = c.get("/jobs?state=aborted&queue=crm").text
    assert "/jobs/bulk/retry?state=aborted&amp;task=&amp;handler=&amp;queue=crm" in jobs_page

    page = c.get("/jobs/bulk/retry?state=aborted&queue=crm").text
    assert '<p class="bulk-count"><b>5</b> job(s) will be queued again' in page
    assert "every aborted job with queue crm" in page
    form = _form(page)
    assert form["queue"] == "crm" and form["upto"] == str(crm[-1])

    late = _abort(app, "crm", 1)  # aborted after the count: not part of what was confirmed
    r = c.post("/actions/bulk/retry", data={**form, "reason": "crm is back"})
    assert r.status_code == 303
    assert r.headers["location"] == "/jobs?state=aborted&queue=crm"
    assert _states(app, crm) == ["queued"] * 5
    assert _states(app, other + late) == ["aborted"] * 4
    assert "Retried 5 job(s)." in c.get(r.headers["location"]).text

    # Each job audited as a single retry is: by the signed-in user, with the reason.
    entries = [e for e in app.audit() if e.action == "retry"]
    assert sorted(e.detail or "" for e in entries) == sorted(f"job {i}" for i in crm)
    assert {(e.actor, e.reason) for e in entries} == {("ops", "crm is back")}


def test_bulk_cancel_and_a_filter_on_another_state_selects_nothing(app: Scheduler) -> None:
    from datetime import timedelta

    later = app.clock() + timedelta(hours=1)
    queued = [app.enqueue("bad", queue="crm", run_at=later) for _ in range(4)]
    c = _signed_in(app)
    assert "No job to retry" in c.get("/jobs/bulk/retry?queue=crm").text
    assert "No job to cancel" in c.get("/jobs/bulk/cancel?state=aborted").text
    page = c.get("/jobs/bulk/cancel?queue=crm").text
    assert "<b>4</b> job(s) will be cancelled" in page
    r = c.post("/actions/bulk/cancel", data=_form(page))
    assert r.status_code == 303
    assert _states(app, queued) == ["aborted"] * 4
    entries = [e for e in app.audit() if e.action == "cancel"]
    assert len(entries) == 4
    assert {e.reason for e in entries} == {"bulk cancel: every queued job with queue crm"}


def test_bulk_is_capped_and_changed_in_chunks_of_a_transaction_each(
    app: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bulk, "BULK_LIMIT", 5)
    monkeypatch.setattr(_bulk, "BULK_CHUNK", 2)
    ids = _abort(app, "crm", 7)
    c = _signed_in(app)
    page = c.get("/jobs/bulk/retry?queue=crm").text
    assert "<b>5</b> job(s)" in page and "more match than 5" in page
    audited: list[int] = [0]  # audit entries written in each transaction, by commit

    def statement(conn: Any, cursor: Any, sql: str, *rest: Any) -> None:
        if sql.lstrip().upper().startswith("INSERT INTO SCHEDULER_AUDIT"):
            audited[-1] += 1

    def committed(conn: Any) -> None:
        audited.append(0)

    event.listen(app.store.engine, "before_cursor_execute", statement)
    event.listen(app.store.engine, "commit", committed)
    try:
        r = c.post("/actions/bulk/retry", data=_form(page))
    finally:
        event.remove(app.store.engine, "commit", committed)
        event.remove(app.store.engine, "before_cursor_execute", statement)
    assert r.status_code == 303
    assert _states(app, ids) == ["aborted"] * 2 + ["queued"] * 5  # the newest five
    assert [n for n in audited if n] == [2, 2, 1]  # a transaction per chunk
    flash = c.get(r.headers["location"]).text
    assert "Retried 5 job(s) (at most 5 at a time: run it again for the rest)." in flash


def test_bulk_needs_sign_in_and_csrf_and_changes_nothing_without(app: Scheduler) -> None:
    ids = _abort(app, "crm", 2)
    read_only = _client(app)
    assert "/jobs/bulk/retry" not in read_only.get("/jobs").text
    page = read_only.get("/jobs/bulk/retry?queue=crm").text
    assert "<b>2</b>" in page and "/actions/bulk/retry" not in page  # the count, no form
    r = read_only.post("/actions/bulk/retry", data={"queue": "crm", "upto": str(ids[-1])})
    assert r.status_code == 403  # actions are off
    c = _signed_in(app)
    form = _form(c.get("/jobs/bulk/retry?queue=crm").text)
    assert c.post("/actions/bulk/retry", data={**form, "csrf": "stale"}).status_code == 403
    signed_out = _client(app, actions=True, username="ops", password_hash=HASH)
    assert signed_out.post("/actions/bulk/retry", data=form).status_code == 401
    assert _states(app, ids) == ["aborted", "aborted"]
    assert [e for e in app.audit() if e.action == "retry"] == []
