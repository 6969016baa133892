"""Jobs the tick dispatches (and reruns in place) carry their row's tenant (rows.tenant ->
jobs.tenant), on every engine and both dispatchers."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from scheduler import RunningJob, Scheduler, TaskSpec


def test_dispatched_and_rerun_jobs_carry_the_rows_tenant(app: Scheduler) -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    task = TaskSpec(name="acme-hourly", cron="0 * * * *", handler="t.tenant", tenant="acme")
    plain = TaskSpec(name="plain-hourly", cron="0 * * * *", handler="t.tenant")
    app.clock = lambda: start
    app.sync([task, plain])
    seen: list[tuple[str | None, str | None]] = []

    @app.handler("t.tenant", max_attempts=1)
    def run(job: RunningJob) -> None:
        seen.append((job.task_name, job.tenant))
        if job.tenant == "acme":
            raise RuntimeError("fail: the next slot reruns the job in place")

    hour = start + timedelta(hours=1)
    app.clock = lambda: hour
    assert sorted(app.tick(hour).dispatched) == ["acme-hourly", "plain-hourly"]
    assert app.work() == 2
    app.sync([replace(task, tenant="globex"), plain])  # the rerun takes the row's new tenant
    later = start + timedelta(hours=2)
    app.clock = lambda: later
    report = app.tick(later)
    assert report.rerun == ["acme-hourly"] and report.dispatched == ["plain-hourly"]
    assert app.work() == 2
    assert sorted(seen, key=str) == sorted(
        [("acme-hourly", "acme"), ("plain-hourly", None)] * 1
        + [("acme-hourly", "globex"), ("plain-hourly", None)],
        key=str,
    )
    row = app.get_row("acme-hourly")
    assert row is not None and row.last_job_id is not None
    assert app.get_job(row.last_job_id).tenant == "globex"  # type: ignore[union-attr]


def test_retry_job_of_a_tasks_job_takes_the_rows_tenant(app: Scheduler) -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    task = TaskSpec(name="acme-hourly", cron="0 * * * *", handler="t.fails", tenant="acme")
    app.clock = lambda: start
    app.sync([task])

    @app.handler("t.fails", max_attempts=1)
    def fails(job: RunningJob) -> None:
        raise RuntimeError("down")

    hour = start + timedelta(hours=1)
    app.clock = lambda: hour
    assert app.tick(hour).dispatched == ["acme-hourly"]
    assert app.work() == 1
    app.sync([replace(task, tenant="initech")])
    row = app.get_row("acme-hourly")
    assert row is not None and row.last_job_id is not None
    assert app.get_job(row.last_job_id).tenant == "acme"  # type: ignore[union-attr]
    assert app.retry_job(row.last_job_id).tenant == "initech"
