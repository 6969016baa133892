"""Workers & health at scale: the rows that warn found by the database out of 10,000, bounded on
the page and complete in ``status``; the finished states' counts taken in the background and
shown with their age (real databases; the app's clock and the counts' timer set by the test).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, insert, text
from starlette.testclient import TestClient

from scheduler import Scheduler
from scheduler._config import DashboardSettings
from scheduler._model.handlers import Registry
from scheduler._store.status.health import WARNED_LIMIT, overview, status
from scheduler._store.tables import jobs, rows
from scheduler.dashboard import create_app
from scheduler.dashboard._counts import COST_SHARE, FinishedCounts

T = datetime(2030, 3, 1, 12, 0, tzinfo=UTC)
TASKS = 10_000
OVERDUE, HELD = "task-04242", "task-07000"
FAILING = [f"task-{n:05d}" for n in range(100, 3100, 100)]  # 30, last job aborted
BROKEN = [f"task-{n:05d}" for n in range(5001, 5026)]  # 25, disabled after failures
PAUSED = [f"task-{n:05d}" for n in range(9001, 9006)]  # 5, disabled by a person


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def row(name: str, **values: Any) -> dict[str, Any]:
    return {
        "name": name,
        "handler": "ok",
        "payload": "{}",
        "cron": "*/5 * * * *",
        "timezone": "UTC",
        "concurrent": False,
        "enabled": True,
        "next_run_at": T + timedelta(hours=1),
        "last_job_id": None,
        "consecutive_failures": 0,
        "disabled_reason": None,  # every row has every key: executemany takes the first's
        "version": 1,
        "created_at": T,
        "updated_at": T,
        **values,
    }


def job(job_id: int, task: str, state: str, code: str | None = None) -> dict[str, Any]:
    return {
        "id": job_id,
        "handler": "ok",
        "payload": "{}",
        "queue": "default",
        "priority": 0,
        "run_at": T - timedelta(hours=3),
        "state": state,
        "attempts": 1,
        "max_attempts": 1,
        "task_name": task,
        "created_at": T - timedelta(hours=3),
        "finished_at": None if state == "queued" else T - timedelta(hours=2),
        "last_error_code": code,
    }


@pytest.fixture
def crowded(db_url: str) -> Iterator[Scheduler]:
    """10,000 rows: one overdue, one held back, 30 failing, 25 disabled after failures and 5
    paused; every other row is enabled and due in an hour."""
    app = Scheduler(db_url, registry=Registry(), clock=lambda: T)
    broken = {"enabled": False, "disabled_reason": "max_consecutive_failures"}
    special: dict[str, dict[str, Any]] = {
        OVERDUE: {"next_run_at": T - timedelta(minutes=10)},
        HELD: {"next_run_at": T - timedelta(hours=2), "last_job_id": 1},
        **{n: {"last_job_id": 2 + i} for i, n in enumerate(FAILING)},
        **{n: {**broken, "consecutive_failures": 3} for n in BROKEN},
        **{n: {"enabled": False, "disabled_reason": "manual"} for n in PAUSED},
    }
    names = [f"task-{n:05d}" for n in range(1, TASKS + 1)]
    with app.store.begin() as conn:
        conn.execute(insert(rows), [row(n, **special.get(n, {})) for n in names])
        conn.execute(
            insert(jobs),
            [job(1, HELD, "queued")]
            + [job(2 + i, n, "aborted", "boom") for i, n in enumerate(FAILING)],
        )
    yield app
    app.close()


def test_the_rows_that_warn_out_of_ten_thousand_bounded_on_the_page(crowded: Scheduler) -> None:
    statements: list[str] = []
    event.listen(crowded.store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    crowded.check_schema()
    statements.clear()
    data = overview(crowded.store, T, crowded.health_settings())
    assert len(statements) == 3, statements  # aggregates, the rows that warn, the workers

    assert data["rows_counted"] == {
        "overdue": 1,
        "held_back": 1,
        "failing": 30,
        "disabled_by_failures": 25,
        "disabled": 30,
    }
    assert set(data["jobs"]) == {"queued", "claimed"}  # the finished ones: in the background
    h = data["health"]
    assert h["rows_overdue"] == [OVERDUE] and h["rows_held_back"] == [HELD]
    assert h["rows_disabled"] == (BROKEN + PAUSED)[:WARNED_LIMIT]  # the first, by name
    text = "\n".join(h["warnings"])
    assert f"task(s) overdue by more than 300s (is a scheduler ticking?): {OVERDUE}\n" in text
    assert f"held back for more than 3600s by a job still in flight: {HELD}\n" in text
    aborted = [w for w in h["warnings"] if "its last run aborted (boom)" in w]
    assert aborted == [
        f"task {n!r}: its last run aborted (boom); the failure is counted at its next slot,"
        " which reruns the job in place (1 of 5 before the task is disabled)"
        for n in FAILING[:WARNED_LIMIT]
    ]
    assert "and 10 more task(s) whose last run aborted" in h["warnings"]
    off = [w for w in h["warnings"] if "disabled (max_consecutive_failures)" in w]
    assert [re.findall(r"'(.*?)'", w)[0] for w in off] == BROKEN[:WARNED_LIMIT]
    assert "and 5 more task(s) disabled after consecutive failures" in h["warnings"]
    assert not any("task-09001" in w for w in h["warnings"])  # a chosen pause: no warning

    # `scheduler status --json` names every one, as before.
    full = status(crowded.store, T, crowded.health_settings())
    assert len(full["rows"]) == TASKS
    assert full["jobs"] == {"queued": 1, "claimed": 0, "succeeded": 0, "aborted": 30}
    assert full["health"]["rows_disabled"] == BROKEN + PAUSED
    assert sum("its last run aborted (boom)" in w for w in full["health"]["warnings"]) == 30
    assert sum("after 3 consecutive failures" in w for w in full["health"]["warnings"]) == 25
    assert not any(" more task(s)" in w for w in full["health"]["warnings"])
    assert [w for w in full["health"]["warnings"] if "overdue by" in w or "held back" in w] == [
        w for w in h["warnings"] if "overdue by" in w or "held back" in w
    ]

    page = TestClient(create_app(crowded, DashboardSettings())).get("/health").text
    assert "and 10 more task(s) whose last run aborted" in page
    assert 'href="/tasks?state=failing">30 task(s) whose last run aborted</a>' in page
    assert 'href="/tasks?state=disabled">30 disabled task(s)</a>' in page
    assert page.count("its last run aborted (boom)") == WARNED_LIMIT


def tile(page: str, state: str) -> tuple[str, str]:
    """The figure and the note under it of a state's tile on the health page."""
    found = re.search(
        rf'data-state="{state}"[^>]*>(?:<b[^>]*>([^<]*)</b>)<span>{state}</span>'
        r'(?:<small class="age">([^<]*)</small>)?',
        page,
    )
    assert found, f"no {state} tile"
    return found.group(1), found.group(2) or ""


@pytest.fixture
def finished_app(db_url_sp: str) -> Iterator[tuple[Scheduler, Clock]]:
    clock = Clock(T)
    app = Scheduler(db_url_sp, registry=Registry(), clock=clock)
    app.handler("ok")(lambda job: None)
    for _ in range(2):
        app.enqueue("ok", {})
    app.work()
    app.enqueue("ok", {})  # queued
    yield app, clock
    app.close()


def test_finished_counts_are_shown_with_their_age_and_taken_in_the_background(
    finished_app: tuple[Scheduler, Clock],
) -> None:
    app, clock = finished_app
    timer = [1000.0]
    web = create_app(app, DashboardSettings(refresh_seconds=5))
    dash = web.state.dashboard
    dash.finished = FinishedCounts(app, 5, clock=lambda: timer[0])
    c = TestClient(web)

    def page() -> str:
        dash._status = None  # the live states' cache: read anew each time here
        return c.get("/health", headers={"X-Dashboard-Live": "1"}).text

    first = page()  # the first view starts the count and does not wait for it
    assert tile(first, "succeeded") == ("…", "counting…")
    assert tile(first, "queued") == ("1", "")  # the live states: exact, on every refresh
    dash.finished.wait()
    assert tile(page(), "succeeded") == ("2", "counted 0 s ago")
    assert tile(page(), "aborted") == ("0", "counted 0 s ago")

    # A job finishes; 30 s later by the app's clock, but within the interval of the counts'
    # timer: the page shows the last count, labelled with its age, and starts none.
    app.work()
    clock.now = T + timedelta(seconds=30)
    shown = page()
    assert tile(shown, "succeeded") == ("2", "counted 30 s ago")
    assert tile(shown, "queued") == ("0", "")
    assert dash.finished.get().counting is False

    # The interval passed: the next view starts a recount and shows the last count meanwhile.
    timer[0] += 5
    assert tile(page(), "succeeded") == ("2", "counted 30 s ago")
    dash.finished.wait()
    assert tile(page(), "succeeded") == ("3", "counted 0 s ago")


def test_the_interval_grows_with_what_a_count_costs(finished_app: tuple[Scheduler, Clock]) -> None:
    app, _clock = finished_app
    timer = [0.0]

    def tick() -> float:  # each reading of the timer is 0.2 s later: a count "takes" 0.2 s
        timer[0] += 0.2
        return timer[0]

    counts = FinishedCounts(app, 5, clock=tick)
    assert counts.interval() == 5
    counts.get()
    counts.wait()
    assert counts.get().counts == {"succeeded": 2, "aborted": 0}
    assert counts.interval() == pytest.approx(COST_SHARE * 0.2)  # 20 s, not every 5 s


def test_a_count_that_fails_is_logged_and_the_tile_says_so(
    finished_app: tuple[Scheduler, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    app, _clock = finished_app
    timer = [0.0]
    web = create_app(app, DashboardSettings(refresh_seconds=5))
    dash = web.state.dashboard
    dash.finished = FinishedCounts(app, 5, clock=lambda: timer[0])
    dash.finished.get()
    dash.finished.wait()

    def rename(old: str, new: str) -> None:
        with app.store.begin() as conn:
            conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))

    rename("scheduler_jobs", "scheduler_jobs_away")  # the next count fails
    try:
        timer[0] += 5
        dash.finished.get()
        dash.finished.wait()
    finally:
        rename("scheduler_jobs_away", "scheduler_jobs")
    assert "dashboard: cannot count the finished jobs" in caplog.text
    page = TestClient(web).get("/health").text
    assert tile(page, "succeeded") == ("2", "could not count (see the log); counted 0 s ago")
    assert dash.finished.get().counting is False  # no retry before the interval

    timer[0] += 5
    dash.finished.get()
    dash.finished.wait()
    assert tile(TestClient(web).get("/health").text, "succeeded") == ("2", "counted 0 s ago")
