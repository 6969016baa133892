"""The New task and Edit forms in a real browser: Debian's Chromium driven by Playwright, a real
uvicorn server on 127.0.0.1, on SQLite and PostgreSQL.

A person fills the form and sees the next fires appear as they type (the page's script asks the
server for a dry run), sees a mistake beside its field before saving, saves, edits and removes
(confirming the dialog); with scripts off the Preview button does the same with a full page.
Chromium comes from apt; Playwright never downloads a browser here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers.browser import chromium, serving

from scheduler import Scheduler, TaskSpec
from scheduler._config import DashboardSettings
from scheduler._model.handlers import Registry
from scheduler.dashboard import create_app, hash_password

playwright_api = pytest.importorskip("playwright.sync_api")
uvicorn = pytest.importorskip("uvicorn")

PASSWORD = "open sesame"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as found:
        yield found


@pytest.fixture
def site(db_url_sp: str) -> Iterator[tuple[Scheduler, str]]:
    app = Scheduler(db_url_sp, registry=Registry())
    app.sync([TaskSpec("nightly", "0 3 * * *", "ok", {}, "Europe/Berlin")])
    settings = DashboardSettings(
        actions=True,
        username="ops",
        password_hash=hash_password(PASSWORD, ln=10),
        refresh_seconds=1,
    )
    with serving(create_app(app, settings)) as base:
        yield app, base
    app.close()


def sign_in(page: Any, base: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"{base}/tasks")


def test_new_edit_and_remove_with_the_live_preview(
    browser: Any, site: tuple[Scheduler, str]
) -> None:
    app, base = site
    page = browser.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    sign_in(page, base)
    page.click("a:has-text('New task')")
    page.wait_for_url(f"{base}/task-new")
    page.fill("#f-name", "crm-sync-42")
    page.fill("#f-cron", "0 6 * * 1-5")
    page.fill("#f-timezone", "America/Chicago")
    page.fill("#f-handler", "crm.sync")
    page.fill("#f-group", "customer-42")
    page.wait_for_selector("#task-preview table.fires")  # without pressing anything
    rows = page.locator("#task-preview tbody tr")
    assert rows.count() == 5
    assert "06:00:00 C" in rows.first.inner_text() and "Z" in rows.first.inner_text()
    page.fill("#f-cron", "0 25 * * *")  # a mistake: shown beside the cron field, live
    page.wait_for_selector("#err-cron:not(:empty)")
    assert page.locator("#err-cron").inner_text().startswith("task 'crm-sync-42': key 'cron'")
    assert app.get_row("crm-sync-42") is None
    page.fill("#f-cron", "0 6 * * 1-5")
    page.wait_for_selector("#err-cron:empty", state="attached")
    page.click("button:has-text('Create')")
    page.wait_for_url(f"{base}/tasks/crm-sync-42")
    assert "crm-sync-42 created." in page.locator(".flash").inner_text()
    row = app.get_row("crm-sync-42")
    assert row is not None and (row.source, row.group) == ("api", "customer-42")

    page.click("a:has-text('Edit')")
    page.wait_for_url(f"{base}/task-edit/crm-sync-42")
    page.fill("#f-cron", "0 7 * * 1-5")
    page.wait_for_selector("#task-preview :text('Changes: cron')")
    page.click("button:has-text('Save')")
    page.wait_for_url(f"{base}/tasks/crm-sync-42")
    row = app.get_row("crm-sync-42")
    assert row is not None and row.cron == "0 7 * * 1-5"

    page.click("button:has-text('Remove')")
    page.wait_for_url(f"{base}/tasks")
    assert "Removed crm-sync-42" in page.locator(".flash").inner_text()
    assert app.get_row("crm-sync-42") is None
    page.goto(f"{base}/tasks/nightly")
    assert "managed by" in page.locator(".source").inner_text()
    assert page.locator("a:has-text('Edit')").count() == 0
    page.close()


def test_without_scripts_the_preview_button_shows_the_fires_and_errors(
    browser: Any, site: tuple[Scheduler, str]
) -> None:
    app, base = site
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    sign_in(page, base)
    page.goto(f"{base}/task-new")
    page.fill("#f-name", "crm-sync-7")
    page.fill("#f-cron", "30 7 * * MON")
    page.fill("#f-timezone", "Europe/Berlin")
    page.fill("#f-handler", "crm.sync")
    page.fill("#f-payload", "{not json")
    page.click("button:has-text('Preview')")
    assert page.locator("#err-payload").inner_text().startswith("task 'crm-sync-7': key 'payload'")
    page.fill("#f-payload", '{"customer": 7}')
    page.click("button:has-text('Preview')")
    assert page.locator("#task-preview tbody tr").count() == 5
    assert app.get_row("crm-sync-7") is None
    page.click("button:has-text('Create')")
    page.wait_for_url(f"{base}/tasks/crm-sync-7")
    row = app.get_row("crm-sync-7")
    assert row is not None and row.payload == {"customer": 7}
    context.close()
