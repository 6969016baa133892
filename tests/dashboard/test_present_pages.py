"""The Running and Queues pages over HTTP (Starlette's TestClient, real databases, a real run
of the worker's loop), the chart's index on PostgreSQL, and the Job page's error message."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, insert, text
from starlette.testclient import TestClient

from scheduler import Scheduler
from scheduler._config import DashboardSettings, WorkerSettings
from scheduler._model.handlers import Registry
from scheduler._store.status import present as _present
from scheduler._store.tables import runs
from scheduler.dashboard import create_app
from scheduler.testing import ManualClock

T0 = datetime(2026, 12, 5, 10, 30, tzinfo=UTC)
LIVE = {"X-Dashboard-Live": "1"}


def _client(app: Scheduler) -> TestClient:
    return TestClient(create_app(app, DashboardSettings()), follow_redirects=False)


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    scheduler = Scheduler(
        db_url,
        registry=Registry(),
        clock=ManualClock(T0),
        worker=WorkerSettings(error_messages="first-line", queues=("default", "crm")),
    )
    yield scheduler
    scheduler.close()


def test_the_running_page_lists_what_runs_now(app: Scheduler) -> None:
    started, release = threading.Event(), threading.Event()

    @app.handler("crm.push", queue="crm")
    def push(job: Any) -> None:
        started.set()
        assert release.wait(30)

    c = _client(app)
    assert "No job is running now." in c.get("/running").text
    job_id = app.enqueue("crm.push", {"account": 7})
    worker = threading.Thread(target=app.work, kwargs={"limit": 1})
    worker.start()
    try:
        assert started.wait(30)
        page = c.get("/running")
        assert page.status_code == 200
        assert 'aria-current="page">Running</a>' in page.text  # linked in the nav
        row = page.text.split(f'<tr data-job="{job_id}"', 1)[1].split("</tr>", 1)[0]
        assert "<code>crm.push</code>" in row and '<div class="sub">crm</div>' in row
        assert f"<code>{app.worker_id}</code>" in row
        assert "2026-12-05 10:30:00 UTC" in row  # started, and the heartbeat (the claim)
        assert "lease ends in 1 min" in row
        assert ">1/3<" in row
        # The live refresh fetches the table alone.
        live = c.get("/running", headers=LIVE).text
        assert live.lstrip().startswith("<p") and f'data-job="{job_id}"' in live
    finally:
        release.set()
        worker.join(30)
    assert "No job is running now." in c.get("/running").text


def test_the_queues_page_counts_each_queue_and_charts_the_run_history(app: Scheduler) -> None:
    clock = app.clock
    assert isinstance(clock, ManualClock)

    @app.handler("ok", retry_safe=True)
    def ok(job: Any) -> None:
        return None

    @app.handler("bad", retry_safe=True, max_attempts=1)
    def bad(job: Any) -> None:
        raise RuntimeError("token=abc123 refused")

    clock.set(T0 - timedelta(hours=2, minutes=20))  # 08:10: two successes
    for _ in range(2):
        app.enqueue("ok")
    app.work()
    clock.set(T0 - timedelta(minutes=10))  # 10:20: three on crm, one failure on default
    for _ in range(3):
        app.enqueue("ok", queue="crm")
    failed = app.enqueue("bad")
    app.work()
    clock.set(T0)
    app.enqueue("ok")  # ready
    app.enqueue("ok", run_at=T0 + timedelta(hours=1))  # scheduled

    page = _client(app).get("/queues")
    assert page.status_code == 200
    body = page.text
    assert 'aria-current="page">Queues</a>' in body

    def line(queue: str) -> list[str]:
        row = body.split(f'<tr data-queue="{queue}">', 1)[1].split("</tr>", 1)[0]
        return [re.sub(r"<[^>]+>", "", cell).strip() for cell in row.split("</td>")[1:-1]]

    # ready, scheduled, running, failed (1 h), done per minute (1 h)
    assert line("crm") == ["0", "0", "0", "0", "0.05"]
    assert line("default") == ["1", "1", "0", "1", "0.00"]  # the 08:10 successes are 2 h old

    # The chart: an SVG with a title and a description, and its numbers in a table.
    assert '<svg class="chart" role="img"' in body
    assert '<title id="chart-title">' in body
    assert "Attempts in 24 intervals: 5 succeeded, 1 failed;" in body
    assert "<script" not in body.split('<main id="live">', 1)[1]
    table = body.split('class="grid compact chart-table">', 1)[1].split("</table>", 1)[0]
    assert "<td>2026-12-05 08:00:00Z</td><td>2026-12-05 09:00:00Z</td>" in table
    assert '<td class="num">2</td><td class="num">0</td></tr>' in table
    assert (
        '<td>2026-12-05 10:00:00Z</td><td>2026-12-05 11:00:00Z</td><td class="num">3</td>'
        '<td class="num">1</td>' in table
    )
    assert table.count("<tr>") == 25  # the head and 24 hours

    # The Job page says why the job failed, redacted.
    job_page = _client(app).get(f"/jobs/{failed}").text
    assert '<code class="error-message">token=*** refused</code>' in job_page
    assert "abc123" not in job_page


def test_each_page_of_the_present_is_at_most_three_statements(app: Scheduler) -> None:
    c = _client(app)
    counted: list[str] = []

    def count(*args: Any) -> None:
        counted.append(args[2])

    event.listen(app.store.engine, "before_cursor_execute", count)
    try:
        for path in ("/running", "/queues"):
            counted.clear()
            assert c.get(path, headers=LIVE).status_code == 200
            assert len(counted) <= 3, (path, counted)
    finally:
        event.remove(app.store.engine, "before_cursor_execute", count)


def test_the_chart_reads_a_range_of_the_runs_index_on_postgresql(direct_pg_url: str) -> None:
    """30 days of runs, 2,000 a day: the chart's day is read from ix_scheduler_runs_finished,
    not by a scan of the history."""
    app = Scheduler(direct_pg_url, registry=Registry())
    try:
        start = T0 - timedelta(days=30)
        history = [
            {
                "job_id": i,
                "attempt": 1,
                "finished_at": start + timedelta(seconds=43.2 * i),
                "outcome": "succeeded" if i % 10 else "aborted",
            }
            for i in range(60_000)
        ]
        with app.store.begin() as conn:
            conn.execute(insert(runs), history)
        with app.store.begin() as conn:
            conn.execute(text("ANALYZE scheduler_runs"))
        seen: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
            seen.append((statement, params))

        event.listen(app.store.engine, "before_cursor_execute", capture)
        try:
            with app.store.read() as conn:
                buckets = _present.run_history(conn, T0, window=timedelta(hours=24), buckets=24)
        finally:
            event.remove(app.store.engine, "before_cursor_execute", capture)
        assert sum(b.succeeded + b.failed for b in buckets) == 2000
        [(statement, params)] = seen
        with app.store.read() as conn:
            plan = "\n".join(
                r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, params).all()
            )
            # The history is partitioned by day there (revision 0015): the index's partitions
            # are the partitions' own indexes.
            names = {"ix_scheduler_runs_finished"} | set(
                conn.execute(
                    text(
                        "SELECT c.relname FROM pg_inherits i JOIN pg_class c"
                        " ON c.oid = i.inhrelid"
                        " WHERE i.inhparent = to_regclass('ix_scheduler_runs_finished')"
                    )
                ).scalars()
            )
        assert any(name in plan for name in names), plan
        assert "Seq Scan" not in plan, plan
    finally:
        app.close()
