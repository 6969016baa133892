"""The job a handler receives carries its slot: ``job.slot`` is the nominal
cron instant of a task's job (before jitter), also of a backfilled one, and ``None`` for an
enqueued job; with ``id``, ``payload``, ``attempt``, ``task_name``, ``queue`` and ``tenant``.

Through the public API on every engine, for sync and ``async def`` handlers, in ``app.work()``,
the worker and ``scheduler.testing.drive``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler import RunningJob, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker
from scheduler.testing import ManualClock, drive

T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)  # a Monday, on the hour
HOURLY = "0 * * * *"

Seen = dict[str, Any]


def seen_of(job: RunningJob) -> Seen:
    return {
        "id": job.id,
        "handler": job.handler,
        "payload": job.payload,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "task_name": job.task_name,
        "queue": job.queue,
        "tenant": job.tenant,
        "slot": job.slot,
    }


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0 - timedelta(minutes=1))


@pytest.fixture
def slots_app(db_url: str, clock: ManualClock) -> Iterator[tuple[Scheduler, list[Seen]]]:
    """An app whose handlers record what they receive: ``plain`` (sync), ``aio`` (async)."""
    app = Scheduler(db_url, registry=Registry(), clock=clock, queues=("default", "reports"))
    seen: list[Seen] = []

    @app.handler("plain", queue="reports", max_attempts=2)
    def plain(job: RunningJob) -> None:
        seen.append(seen_of(job))

    @app.handler("aio", queue="reports", max_attempts=2)
    async def aio(job: RunningJob) -> None:
        seen.append(seen_of(job))

    yield app, seen
    app.close()


@pytest.mark.parametrize("handler", ["plain", "aio"])
def test_a_scheduled_job_sees_its_slot_not_the_jittered_instant(
    slots_app: tuple[Scheduler, list[Seen]], clock: ManualClock, handler: str
) -> None:
    app, seen = slots_app
    spec = TaskSpec("hourly", HOURLY, handler, {"k": 1}, "UTC", jitter=600, tenant="acme")
    app.sync([spec])
    fires = app.get_row("hourly").next_run_at  # type: ignore[union-attr]
    assert T0 < fires < T0 + timedelta(minutes=10)  # the jitter delays it past the slot
    clock.set(fires)
    assert app.tick().dispatched == ["hourly"]
    assert app.work() == 1
    job_id = app.get_row("hourly").last_job_id  # type: ignore[union-attr]
    assert seen == [
        {
            "id": job_id,
            "handler": handler,
            "payload": {"k": 1},
            "attempt": 1,
            "max_attempts": 2,
            "task_name": "hourly",
            "queue": "reports",
            "tenant": "acme",
            "slot": T0,
        }
    ]
    assert seen[0]["slot"].tzinfo is not None  # aware UTC, comparable with other instants


@pytest.mark.parametrize("handler", ["plain", "aio"])
def test_backfilled_jobs_each_see_the_slot_they_fill(
    slots_app: tuple[Scheduler, list[Seen]], clock: ManualClock, handler: str
) -> None:
    app, seen = slots_app
    app.sync([TaskSpec("hourly", HOURLY, handler, {}, "UTC")])
    clock.set(T0 + timedelta(minutes=30))
    result = app.backfill("hourly", T0 - timedelta(hours=3), T0)  # 09:00, 10:00, 11:00
    assert list(result.enqueued) == [T0 - timedelta(hours=h) for h in (3, 2, 1)]
    assert app.work() == 3
    assert {s["id"]: s["slot"] for s in seen} == {i: s for s, i in result.enqueued.items()}
    assert {s["task_name"] for s in seen} == {"hourly"}


@pytest.mark.parametrize("handler", ["plain", "aio"])
def test_an_enqueued_job_has_no_slot(slots_app: tuple[Scheduler, list[Seen]], handler: str) -> None:
    app, seen = slots_app
    job_id = app.enqueue(handler, {"n": 3}, tenant="globex")
    assert app.work() == 1
    assert seen == [
        {
            "id": job_id,
            "handler": handler,
            "payload": {"n": 3},
            "attempt": 1,
            "max_attempts": 2,
            "task_name": None,
            "queue": "reports",
            "tenant": "globex",
            "slot": None,
        }
    ]


def test_the_worker_hands_the_slot_to_sync_and_async_handlers(
    slots_app: tuple[Scheduler, list[Seen]], clock: ManualClock
) -> None:
    app, seen = slots_app
    app.sync(
        [
            TaskSpec("sync-task", HOURLY, "plain", {}, "UTC"),
            TaskSpec("async-task", HOURLY, "aio", {}, "UTC"),
        ]
    )
    app.enqueue("plain", {})
    app.enqueue("aio", {})
    clock.set(T0)
    Worker(app, concurrency=2).run(once=True)
    got = sorted((s["handler"], s["task_name"] or "", s["slot"] or T0.min) for s in seen)
    assert got == [
        ("aio", "", T0.min),
        ("aio", "async-task", T0),
        ("plain", "", T0.min),
        ("plain", "sync-task", T0),
    ]


@pytest.mark.parametrize("handler", ["plain", "aio"])
def test_drive_hands_each_run_its_slot(
    slots_app: tuple[Scheduler, list[Seen]], handler: str
) -> None:
    app, seen = slots_app
    app.sync([TaskSpec("hourly", HOURLY, handler, {}, "UTC")])
    drive(app, T0, T0 + timedelta(hours=2))
    assert [s["slot"] for s in seen] == [T0, T0 + timedelta(hours=1), T0 + timedelta(hours=2)]


def test_a_triggered_run_sees_the_instant_it_was_triggered_for(
    slots_app: tuple[Scheduler, list[Seen]], clock: ManualClock
) -> None:
    app, seen = slots_app
    app.sync([TaskSpec("hourly", HOURLY, "plain", {}, "UTC")])
    pressed = clock.advance(seconds=-1800)  # 11:29, half an hour before the 12:00 slot
    app.trigger("hourly")
    clock.advance(seconds=1)
    assert app.tick().dispatched == ["hourly"]
    assert app.work() == 1
    assert [s["slot"] for s in seen] == [pressed]
