"""The Running and Queues pages, the bulk retry and the Job page's error message in a real
browser: Debian's Chromium driven by Playwright (never downloaded), a real uvicorn server on
127.0.0.1 and a real worker thread, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers.browser import chromium, serving

from scheduler import Scheduler
from scheduler._config import DashboardSettings, WorkerSettings
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker
from scheduler.dashboard import create_app, hash_password

playwright_api = pytest.importorskip("playwright.sync_api")
uvicorn = pytest.importorskip("uvicorn")

PASSWORD = "open sesame"
RED = "rgb(220, 38, 38)"
WORKER_ID = "browser-present:1:w"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as found:
        yield found


def _eventually(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def test_running_queues_bulk_retry_and_the_error_message(browser: Any, db_url_sp: str) -> None:
    release = threading.Event()
    registry = Registry()

    @registry.handler("report.export", retry_safe=True)
    def export(job: Any) -> None:
        assert release.wait(30)

    @registry.handler("crm.push", max_attempts=1, retry_safe=True)
    def push(job: Any) -> None:
        raise RuntimeError("crm refused the login password=hunter2 (HTTP 401)")

    app = Scheduler(db_url_sp, registry=registry)
    worker_app = Scheduler(
        db_url_sp,
        registry=registry,
        tick_interval=0.2,
        worker_id=WORKER_ID,
        worker=WorkerSettings(error_messages="first-line"),
    )
    worker = Worker(worker_app, concurrency=2)
    thread = threading.Thread(target=worker.run, daemon=True)
    settings = DashboardSettings(
        actions=True,
        username="ops",
        password_hash=hash_password(PASSWORD, ln=10),
        refresh_seconds=1,
    )
    thread.start()
    try:
        with serving(create_app(app, settings)) as base:
            page = browser.new_page()
            page.goto(f"{base}/login")
            page.fill("input[name=username]", "ops")
            page.fill("input[name=password]", PASSWORD)
            page.click("button:has-text('Sign in')")
            page.wait_for_url(f"{base}/tasks")

            # Running: the nav leads there; the job shows while it runs, then goes by itself.
            page.click("nav a:has-text('Running')")
            page.wait_for_url(f"{base}/running")
            job_id = app.enqueue("report.export", {"month": "2026-11"})
            row = page.locator(f"tr[data-job='{job_id}']")
            row.wait_for(timeout=15_000)  # a live refresh, no reload
            text = row.inner_text()
            assert "report.export" in text and WORKER_ID in text and "1/3" in text
            page.evaluate("window.__kept = true")
            release.set()
            page.locator("td.empty:has-text('No job is running now.')").wait_for(timeout=15_000)
            assert page.evaluate("window.__kept") is True  # refreshed in place

            # Three failures: the Queues page counts them and draws them in red.
            failed = [app.enqueue("crm.push", {"account": i}) for i in range(3)]
            _eventually(lambda: {app.get_job(i).state for i in failed} == {"aborted"})  # type: ignore[union-attr]
            page.click("nav a:has-text('Queues')")
            page.wait_for_url(f"{base}/queues")
            cells = page.locator("tr[data-queue='default'] td").all_inner_texts()
            assert cells[4] == "3"  # failed in the last hour
            assert page.locator("svg.chart title#chart-title").count() == 1
            bad = page.locator("svg.chart rect.bad")
            assert bad.count() == 1
            assert bad.evaluate("el => getComputedStyle(el).fill") == RED
            desc = page.locator("svg.chart desc").text_content()
            assert desc.startswith("Attempts in 24 intervals: 1 succeeded, 3 failed;")

            # The Job page says why, with the password redacted.
            page.goto(f"{base}/jobs/{failed[0]}")
            message = page.locator("code.error-message").inner_text()
            assert message == "crm refused the login password=*** (HTTP 401)"

            # Bulk retry from the Jobs page's filter: a confirmation with the count, then done.
            page.goto(f"{base}/jobs?state=aborted&handler=crm.push")
            page.click("a:has-text('retry the aborted ones')")
            assert page.locator(".bulk-count b").inner_text() == "3"
            page.fill("input[name=reason]", "crm credentials rotated")
            page.click("button:has-text('Retry 3 job(s)')")
            assert page.locator(".flash").inner_text() == "Retried 3 job(s)."
            retried = [e for e in app.audit() if e.action == "retry"]
            assert sorted(e.detail or "" for e in retried) == sorted(f"job {i}" for i in failed)
            assert {(e.actor, e.reason) for e in retried} == {("ops", "crm credentials rotated")}
            page.close()
    finally:
        release.set()
        worker.stop(force=True)
        thread.join(20)
        worker_app.close()
        app.close()
