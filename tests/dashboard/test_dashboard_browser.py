"""The dashboard in a real browser: Debian's Chromium driven by Playwright, a real uvicorn server
on 127.0.0.1 and a real worker thread ticking and running jobs, on SQLite and PostgreSQL.

It checks what a person sees (text, the run strip's colours), that each action changed the
database, that the data refreshes by itself without a reload and keeps the filters, and that
hostile task names and error codes never execute. Chromium comes from apt (`.ci/run`);
Playwright never downloads a browser here.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from helpers.browser import chromium, serving

from scheduler import PermanentError, Scheduler, TaskSpec
from scheduler._config import DashboardSettings
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker
from scheduler.dashboard import create_app, hash_password

playwright_api = pytest.importorskip("playwright.sync_api")
uvicorn = pytest.importorskip("uvicorn")

HOSTILE = "<script>alert(1)</script>"
HOSTILE_CODE = "x\"'><img src=x onerror=alert(2)>"
PASSWORD = "open sesame"
GREEN, RED = "rgb(22, 163, 74)", "rgb(220, 38, 38)"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as found:
        yield found


@contextmanager
def working(url: str, registry: Registry) -> Iterator[Worker]:
    app = Scheduler(url, registry=registry, tick_interval=0.2, worker_id="browser-test:1:w")
    worker = Worker(app, concurrency=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop(force=True)
        thread.join(20)
        app.close()


def make_registry() -> Registry:
    registry = Registry()

    @registry.handler("ok")
    def ok(job: object) -> None:
        return None

    @registry.handler("bad", max_attempts=1)
    def bad(job: object) -> None:
        raise PermanentError(HOSTILE_CODE)

    return registry


def eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


@pytest.fixture
def site(db_url_sp: str) -> Iterator[tuple[Scheduler, str]]:
    registry = make_registry()
    app = Scheduler(db_url_sp, registry=registry)
    app.sync(
        [
            TaskSpec("nightly", "0 3 * * *", "ok", {"region": "eu"}, "Europe/Berlin"),
            TaskSpec(HOSTILE, "0 4 * * *", "bad", {}, "UTC"),
        ]
    )
    for name in ("nightly", HOSTILE):
        app.trigger(name)
    app.tick()
    app.work()
    settings = DashboardSettings(
        actions=True,
        username="ops",
        password_hash=hash_password(PASSWORD, ln=10),
        refresh_seconds=1,
    )
    with working(db_url_sp, registry), serving(create_app(app, settings)) as base:
        yield app, base
    app.close()


def sign_in(page: Any, base: str) -> None:
    page.goto(f"{base}/tasks")
    assert "/login" in page.url  # pages need a signed-in user once credentials exist
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "wrong")
    page.click("button:has-text('Sign in')")
    assert page.locator("[role=alert]").inner_text() == "Wrong username or password."
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{base}/tasks")


def test_click_through_every_page_and_action(browser: Any, site: tuple[Scheduler, str]) -> None:
    app, base = site
    page = browser.new_page()
    dialogs: list[tuple[str, str]] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append((dialog.type, dialog.message))
        dialog.accept()

    page.on("dialog", on_dialog)
    sign_in(page, base)

    # Tasks: what a person sees, and the strip's colours.
    nightly = page.locator("tr[data-task='nightly']")
    assert "enabled" in nightly.inner_text() and "CET" in nightly.inner_text()
    hostile = page.locator(f"tr[data-task='{HOSTILE}']")
    assert HOSTILE in hostile.inner_text() and "aborted" in hostile.inner_text()
    colour = "el => getComputedStyle(el).backgroundColor"
    assert nightly.locator(".strip .cell").first.evaluate(colour) == GREEN
    assert hostile.locator(".strip .cell").first.evaluate(colour) == RED

    # Live: with a filter on, "Run now" -> the worker runs it -> the strip grows by itself.
    page.goto(f"{base}/tasks?name=nigh")
    page.evaluate("window.__noReload = true")
    assert page.locator("tr[data-task]").count() == 1
    page.click("tr[data-task='nightly'] button:has-text('Run now')")
    page.wait_for_url(f"{base}/tasks?name=nigh")
    assert dialogs[-1] == ("confirm", "Run nightly now?")
    assert "Triggered nightly" in page.locator(".flash").inner_text()
    page.evaluate("window.__noReload = true")
    cells = page.locator("tr[data-task='nightly'] .strip .cell")
    eventually(lambda: cells.count() >= 2)
    assert page.evaluate("window.__noReload") is True  # refreshed in place, not reloaded
    assert page.locator("tr[data-task]").count() == 1  # the filter held
    assert page.locator("input[name=name]").input_value() == "nigh"

    # Task page: state, next fires, disable with a reason, enable.
    page.click("a.name:has-text('nightly')")
    assert page.locator("#state-sentence").inner_text().startswith("scheduled: job")
    assert page.locator("table.fires tbody tr").count() == 10
    page.fill("input[name=reason]", "maintenance window")
    page.click("button:has-text('Disable')")
    assert "Disabled nightly: maintenance window" in page.locator(".flash").inner_text()
    row = app.get_row("nightly")
    assert row is not None and not row.enabled
    sentence = page.locator("#state-sentence").inner_text()
    assert sentence.startswith("disabled (manual: maintenance window) since ")
    page.click("button:has-text('Enable')")
    assert app.get_row("nightly").enabled  # type: ignore[union-attr]

    # Jobs: filter by state by clicking; the aborted job; its page; retry.
    page.click("nav a:has-text('Jobs')")
    page.click("label.chip:has-text('aborted')")
    page.click("form.filters button")
    assert "state=aborted" in page.url
    page.locator("tr[data-job] .pill").first.wait_for()  # all_inner_texts() does not wait
    states = page.locator("tr[data-job] .pill").all_inner_texts()
    assert states and set(states) == {"aborted"}
    job_id = app.get_row(HOSTILE).last_job_id  # type: ignore[union-attr]
    page.click(f"tr[data-job='{job_id}'] a")
    assert HOSTILE_CODE in page.locator("table.attempts").inner_text()
    page.click("button:has-text('Retry')")
    assert dialogs[-1][0] == "confirm"
    eventually(lambda: len(app.history(job_id)) == 2)  # queued again, and the worker ran it

    # Cancel a queued ad-hoc job.
    later = app.enqueue("ok", {"k": 1}, run_at=app.clock() + timedelta(hours=1))
    page.goto(f"{base}/jobs/{later}")
    page.click("button:has-text('Cancel')")
    job = app.get_job(later)
    assert job is not None and (job.state, job.last_error_code) == ("aborted", "cancelled")
    assert "cancelled" in page.locator("section.state").inner_text()

    # Workers & health: the worker is listed; the finished states' counts, taken in the
    # background, come with a live refresh and say how old they are.
    page.click("nav a:has-text('Workers')")
    assert "browser-test:1:w" in page.locator("table.workers").inner_text()
    succeeded = page.locator(".tile[data-state='succeeded']")
    eventually(lambda: "counted" in succeeded.inner_text())
    assert re.fullmatch(r"counted \d+ s ago", succeeded.locator(".age").inner_text())
    assert int(succeeded.locator("b").inner_text()) >= 2  # nightly ran twice, at least

    # Sign out: back to the sign-in page.
    page.click("button:has-text('sign out')")
    page.wait_for_url(f"{base}/login")
    assert [d for d in dialogs if d[0] != "confirm"] == []  # nothing user-written executed
    page.close()


def test_hostile_input_never_executes(browser: Any, site: tuple[Scheduler, str]) -> None:
    app, base = site
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.type), d.dismiss()))
    sign_in(page, base)
    job_id = app.get_row(HOSTILE).last_job_id  # type: ignore[union-attr]
    quoted = "%3Cscript%3Ealert%281%29%3C%2Fscript%3E"
    for path in ("/tasks", f"/tasks/{quoted}", f"/jobs/{job_id}", "/jobs?state=aborted"):
        page.goto(base + path)
        if "?" not in path:  # and after a live refresh, which writes the fragment anew
            page.locator("#live[data-refreshed]").wait_for(state="attached", timeout=5000)
        assert (
            HOSTILE in page.locator("body").inner_text()
            or HOSTILE_CODE in page.locator("body").inner_text()
        )
        scripts = page.evaluate("[...document.scripts].map(s => s.src)")
        assert scripts == [f"{base}/static/live.js"], path
        assert page.locator("img[src=x]").count() == 0, path
    assert dialogs == []
    page.close()
