"""Take the screenshots of docs/howto/dashboard.md: a demo database, a real server, Chromium.

    .venv/bin/python docs/screenshots.py            # writes docs/screenshots/*.png

Needs the dashboard extra, Playwright (pip) and Debian's Chromium (/usr/bin/chromium); it
never downloads a browser.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import uvicorn
from playwright.sync_api import sync_playwright

from scheduler import PermanentError, Scheduler, TaskSpec
from scheduler._config import DashboardSettings, WorkerSettings
from scheduler._model.handlers import Registry
from scheduler._store.status.health import touch
from scheduler.dashboard import create_app, hash_password

OUT = Path(__file__).resolve().parent / "screenshots"
RELEASE = threading.Event()  # the exports the Running page shows end when it is set
CHROMIUM = "/usr/bin/chromium"


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def demo(url: str) -> tuple[Scheduler, Clock]:
    """A few tasks with a believable history: healthy, flaky, failing, disabled."""
    clock = Clock(datetime.now(UTC) - timedelta(hours=13))
    app = Scheduler(
        url,
        registry=Registry(),
        clock=clock,
        worker_id="web-1:4242:a1b2c3d4",
        worker=WorkerSettings(error_messages="first-line", queues=("default", "crm")),
    )
    app.migrate()
    flaky = {"n": 0}

    @app.handler("reports.nightly", retry_safe=True)
    def nightly(job: object) -> None:
        return None

    @app.handler("sync.crm", max_attempts=1)
    def crm(job: object) -> None:
        flaky["n"] += 1
        if flaky["n"] % 4 == 0:
            raise PermanentError("upstream_timeout")

    @app.handler("billing.invoices", max_attempts=1)
    def invoices(job: object) -> None:
        raise RuntimeError(
            "payment API refused https://billing:s3cr3t@pay.example.com/v2/charges:"
            " card declined (api_key=sk_live_4242)\nTraceback follows"
        )

    @app.handler("crm.push", queue="crm", retry_safe=True)
    def push(job: object) -> None:
        if job.payload["account"] % 5 == 0:  # type: ignore[attr-defined]
            raise TimeoutError("crm.example.com did not answer within 30 s")

    @app.handler("reports.export", retry_safe=True)
    def export(job: object) -> None:
        RELEASE.wait(120)

    @app.handler("cache.warm")
    def warm(job: object) -> None:
        return None

    tasks = [
        TaskSpec(
            "nightly-report", "0 3 * * *", "reports.nightly", {"region": "eu"}, "Europe/Berlin"
        ),
        TaskSpec("crm-sync", "*/15 * * * *", "sync.crm", {"since": "1h"}, "America/New_York"),
        TaskSpec(
            "invoice-run", "0 * * * *", "billing.invoices", {}, "UTC", max_consecutive_failures=4
        ),
        TaskSpec("cache-warm", "*/5 * * * *", "cache.warm", {}, "UTC"),
        TaskSpec("monthly-close", "0 9 1 * *", "sync.crm", {"ledger": "main"}, "Europe/Berlin"),
        TaskSpec(
            "weekly-digest", "0 9 * * MON", "reports.nightly", {"kind": "digest"}, "Asia/Tokyo"
        ),
    ]
    app.sync(tasks)
    for _ in range(12):
        clock.now += timedelta(hours=1)
        for t in tasks[:5]:
            try:
                app.trigger(t.name)
            except Exception:
                pass
        app.tick()
        app.work()
        for account in range(int(clock.now.timestamp()) % 7 + 4):
            app.enqueue("crm.push", {"account": account})
        app.work()
    app.disable("weekly-digest", reason="paused until the new template ships", actor="ann")
    app.put_task(  # a schedule the application made for one of its customers
        TaskSpec(
            "crm-sync-42",
            "0 6 * * 1-5",
            "sync.crm",
            {"customer": 42},
            "America/Chicago",
            tenant="acme",
            group="customer-42",
        ),
        actor="web",
    )
    app.enqueue("cache.warm", {"key": "home"}, run_at=clock.now + timedelta(minutes=30))
    clock.now = datetime.now(UTC)
    app.tick()  # the slots missed while the demo's clock was behind: one run each
    app.work()
    touch(app.store, app.worker_id, clock.now, clock.now)
    return app, clock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def forms(page: object, base: str) -> None:
    """The New task form with its live preview, and the Edit form with an error beside its
    field."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    page.goto(f"{base}/task-new")
    page.fill("#f-name", "report-7")
    page.fill("#f-cron", "30 7 * * MON")
    page.fill("#f-timezone", "America/New_York")
    page.fill("#f-handler", "reports.nightly")
    page.fill("#f-group", "customer-7")
    page.wait_for_selector("#task-preview table.fires")
    page.screenshot(path=str(OUT / "task-new.png"), full_page=True)
    print("wrote", OUT / "task-new.png")
    page.goto(f"{base}/task-edit/crm-sync-42")
    page.fill("#f-cron", "0 6 * * 1-5")
    page.fill("#f-timezone", "America/Chicgo")
    page.wait_for_selector("#err-timezone:not(:empty)")
    page.screenshot(path=str(OUT / "task-edit.png"), full_page=True)
    print("wrote", OUT / "task-edit.png")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        app, _clock = demo(f"sqlite:///{tmp}/demo.db")
        app.clock = lambda: datetime.now(UTC)
        settings = DashboardSettings(
            actions=True, username="ops", password_hash=hash_password("demo")
        )
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(app, settings), host="127.0.0.1", port=port, log_level="warning"
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        for month in ("2026-10", "2026-11"):  # running while the pages are taken
            app.enqueue("reports.export", {"month": month})
        exporting = threading.Thread(target=app.work, daemon=True)
        exporting.start()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{base}/login")
            page.fill("input[name=username]", "ops")
            page.fill("input[name=password]", "demo")
            page.click("button:has-text('Sign in')")
            aborted = app.get_row("invoice-run")
            shots = {
                "tasks": "/tasks",
                "task": "/tasks/monthly-close",
                "jobs": "/jobs",
                "job": f"/jobs/{aborted.last_job_id if aborted else 1}",
                "health": "/health",
                "audit": "/audit",
                "running": "/running",
                "queues": "/queues",
                "bulk-confirm": "/jobs/bulk/retry?state=aborted&queue=crm",
            }
            for name, path in shots.items():
                page.goto(base + path)
                if name == "health":  # the finished counts come with a live refresh
                    page.wait_for_selector(".tile[data-state='succeeded'] .age:text('counted')")
                page.screenshot(
                    path=str(OUT / f"{name}.png"), full_page=name not in ("jobs", "audit")
                )
                print("wrote", OUT / f"{name}.png")
            forms(page, base)
            browser.close()
        RELEASE.set()
        exporting.join()
        server.should_exit = True
        thread.join()
        app.close()


if __name__ == "__main__":
    sys.exit(main())
