"""Health (SPEC §5, §6): the JSON shape, and every warning, with ``now`` set by the test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from scheduler import Scheduler, SchemaOutdated, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._model.rules import Thresholds
from scheduler._store.status import health as _health
from scheduler._store.status.health import HealthSettings, forget, touch
from scheduler._store.tables import rows


def status(
    app: Scheduler,
    now: datetime | None = None,
    thresholds: Thresholds | None = None,
    *,
    rows: bool = True,
) -> dict[str, Any]:
    """``_health.status`` given what it needs of ``app``, with other thresholds if asked."""
    settings = app.health_settings()
    if thresholds is not None:
        settings = HealthSettings(
            settings.max_consecutive_failures, settings.clock_mode, thresholds
        )
    return _health.status(app.store, now or app.clock(), settings, rows=rows)


T = datetime(2030, 3, 1, 12, 0, tzinfo=UTC)

SPEC_ROW_KEYS = {
    "name",
    "enabled",
    "next_run_at",
    "last_job_state",
    "consecutive_failures",
    "disabled_reason",
}
SPEC_HEALTH_KEYS = {"waiting", "stopped", "overdue", "stalled", "warnings"}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T)


@pytest.fixture
def sched(db_url: str, clock: Clock) -> Iterator[Scheduler]:
    app = Scheduler(db_url, registry=Registry(), clock=clock, lease_seconds=60)
    app.handler("ok", retry_safe=True)(lambda job: None)
    yield app
    app.close()


def task(name: str, **kw: Any) -> TaskSpec:
    return TaskSpec(
        name=name,
        cron=kw.pop("cron", "* * * * *"),
        handler="ok",
        payload={},
        timezone=kw.pop("timezone", "UTC"),
        **kw,
    )


def set_row(app: Scheduler, name: str, **values: Any) -> None:
    with app.store.begin() as conn:
        conn.execute(update(rows).where(rows.c.name == name).values(**values))


def test_empty_database_has_exactly_the_spec_shape(sched: Scheduler) -> None:
    data = status(sched)
    assert list(data) == ["rows", "jobs", "health"]
    assert data["rows"] == []
    assert data["jobs"] == {"queued": 0, "claimed": 0, "succeeded": 0, "aborted": 0}
    health = data["health"]
    assert list(health)[:5] == ["waiting", "stopped", "overdue", "stalled", "warnings"]
    assert {k: health[k] for k in SPEC_HEALTH_KEYS} == {
        "waiting": 0,
        "stopped": 0,
        "overdue": 0,
        "stalled": False,
        "warnings": [],
    }
    assert health["workers"] == [] and health["last_tick_at"] is None
    assert sched.status() == data  # the public method is the same data


def test_row_objects(sched: Scheduler, clock: Clock) -> None:
    sched.sync([task("berlin", cron="0 3 * * *", timezone="Europe/Berlin"), task("utc")])
    sched.disable("utc")
    by_name = {r["name"]: r for r in status(sched)["rows"]}
    berlin = by_name["berlin"]
    assert SPEC_ROW_KEYS <= set(berlin)
    assert list(berlin)[:6] == [
        "name",
        "enabled",
        "next_run_at",
        "last_job_state",
        "consecutive_failures",
        "disabled_reason",
    ]
    assert berlin["next_run_at"] == "2030-03-02T02:00:00Z"  # 03:00 CET
    assert berlin["next_run_local"] == "2030-03-02T03:00:00+01:00"
    assert (
        berlin["enabled"],
        berlin["last_job_state"],
        berlin["consecutive_failures"],
        berlin["disabled_reason"],
    ) == (True, None, 0, None)
    assert (by_name["utc"]["enabled"], by_name["utc"]["disabled_reason"]) == (False, "manual")

    sched.trigger("berlin")
    sched.tick()
    assert {r["name"]: r["last_job_state"] for r in status(sched)["rows"]}["berlin"] == "queued"


def test_waiting_overdue_stopped_and_stalled(sched: Scheduler, clock: Clock) -> None:
    # A job claimed 20 minutes ago under a 60 s lease: its worker stopped.
    clock.now = T - timedelta(minutes=20)
    sched.enqueue("ok", {})
    assert len(sched.runner().claim(1)) == 1
    clock.now = T
    sched.enqueue("ok", {}, run_at=T - timedelta(minutes=15))  # ready, overdue
    sched.enqueue("ok", {}, run_at=T - timedelta(minutes=1))  # ready, not overdue yet
    sched.enqueue("ok", {}, run_at=T + timedelta(hours=1))  # not ready

    health = status(sched)["health"]
    assert status(sched)["jobs"] == {"queued": 3, "claimed": 1, "succeeded": 0, "aborted": 0}
    assert (health["waiting"], health["overdue"], health["stopped"]) == (2, 1, 1)
    assert health["stalled"] is True  # ready 15 min, nothing ever finished
    text = "\n".join(health["warnings"])
    assert "1 job(s) ready for more than 300s" in text
    assert "expired lease" in text
    assert "work has stalled: 2 job(s) waiting" in text

    # Something finished a minute ago: not stalled (workers are busy, just behind).
    clock.now = T - timedelta(minutes=1)
    sched.work(limit=1)
    clock.now = T
    health = status(sched)["health"]
    assert health["stalled"] is False
    assert health["last_finished_at"] == "2030-03-01T11:59:00Z"
    assert not any("stalled" in w for w in health["warnings"])

    # Thresholds are parameters.
    lenient = status(sched, thresholds=Thresholds(job_overdue=3600))["health"]
    assert lenient["overdue"] == 0


def test_rows_overdue_held_back_and_disabled(sched: Scheduler, clock: Clock) -> None:
    sched.sync(
        [task(n) for n in ("fine", "late", "held", "off", "paused")]
        + [task("busy", concurrent=True)]
    )
    # "held" and "busy" dispatched two hours ago; their jobs are still queued.
    for name in ("held", "busy"):
        set_row(sched, name, next_run_at=T - timedelta(hours=2))
    sched.tick(now=T - timedelta(hours=2))
    set_row(sched, "held", next_run_at=T - timedelta(hours=2) + timedelta(minutes=1))
    set_row(sched, "busy", next_run_at=T - timedelta(hours=1, minutes=30))
    set_row(sched, "late", next_run_at=T - timedelta(minutes=10))
    set_row(
        sched,
        "off",
        enabled=False,
        disabled_reason="max_consecutive_failures",
        consecutive_failures=3,
    )
    sched.disable("paused")

    health = status(sched)["health"]
    assert health["rows_held_back"] == ["held"]
    assert health["rows_overdue"] == ["busy", "late"]  # a concurrent row is never held back
    assert health["rows_disabled"] == ["off", "paused"]
    text = "\n".join(health["warnings"])
    assert "task(s) held back for more than 3600s by a job still in flight: held" in text
    assert "task(s) overdue by more than 300s (is a scheduler ticking?): busy, late" in text
    assert "task 'off' disabled (max_consecutive_failures) after 3 consecutive failures" in text
    assert "`scheduler enable off`" in text
    assert "paused" not in text  # a chosen pause is reported, not warned about
    assert "no worker is running" in text


def test_tick_warnings_from_worker_rows(sched: Scheduler, clock: Clock) -> None:
    assert status(sched)["health"]["warnings"] == []  # no enabled rows: nothing to tick
    sched.sync([task("a", cron="0 0 1 1 *")])
    assert status(sched)["health"]["warnings"] == ["no worker is running: start `scheduler worker`"]

    touch(sched.store, "w1", T - timedelta(minutes=10), T - timedelta(minutes=10))
    touch(sched.store, "w1", T, T - timedelta(minutes=10))  # alive, but not ticking
    health = status(sched)["health"]
    assert health["warnings"] == [
        "no scheduler tick since 2030-03-01T11:50:00Z: are the workers stuck?"
    ]
    assert [(w["id"], w["started_at"], w["last_seen_at"]) for w in health["workers"]] == [
        ("w1", "2030-03-01T11:50:00Z", "2030-03-01T12:00:00Z")
    ]

    touch(sched.store, "w2", T, T - timedelta(seconds=5))
    health = status(sched)["health"]
    assert health["warnings"] == []
    assert health["last_tick_at"] == "2030-03-01T11:59:55Z"

    forget(sched.store, seen_before=T)  # forgets neither: both seen at T
    forget(sched.store, "w1")
    assert [w["id"] for w in status(sched)["health"]["workers"]] == ["w2"]


def test_processes_registering_one_worker_id_at_once_all_succeed(sched: Scheduler) -> None:
    """`scheduler tick` runs on one host share an id: racing first touches must not fail.

    Without the retry, the losers raised a duplicate key (PostgreSQL) or a deadlock (MariaDB).
    """
    racers, rounds = 8, 5
    failed: list[BaseException] = []

    def race(barrier: threading.Barrier, worker_id: str, i: int) -> None:
        barrier.wait()
        try:
            touch(sched.store, worker_id, T + timedelta(seconds=i), T)
        except BaseException as exc:  # reported by the test thread
            failed.append(exc)

    for n in range(rounds):
        barrier = threading.Barrier(racers)
        args = [(barrier, f"host:tick:{n}", i) for i in range(racers)]
        threads = [threading.Thread(target=race, args=a) for a in args]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failed == []
    workers = status(sched)["health"]["workers"]
    assert sorted(w["id"] for w in workers) == [f"host:tick:{n}" for n in range(rounds)]
    assert all(w["last_tick_at"] == "2030-03-01T12:00:00Z" for w in workers)


def test_status_refuses_an_outdated_schema(tmp_path: Path) -> None:
    app = Scheduler(f"sqlite:///{tmp_path / 'empty.db'}", registry=Registry())
    try:
        with pytest.raises(SchemaOutdated, match="scheduler migrate"):
            app.status()
    finally:
        app.close()


def test_status_without_rows_warns_the_same_and_lists_none(app: Scheduler) -> None:
    """The dashboard's health read: the same counts and warnings, an empty row list; and the
    row views status reads carry no payload (it shows none), while app.rows() still does."""
    from scheduler import TaskSpec

    app.sync([TaskSpec("t", "* * * * *", "h", {"k": "v"}, "UTC")])
    now = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
    full = status(app, now)
    light = status(app, now, rows=False)
    assert [r["name"] for r in full["rows"]] == ["t"] and light["rows"] == []
    assert light["jobs"] == full["jobs"] and light["health"] == full["health"]
    assert "payload" not in full["rows"][0]
    assert app.rows(limit=None)[0].payload == {"k": "v"}


def test_the_tick_record_is_utc_whatever_the_sessions_time_zone(direct_pg_url: str) -> None:
    """The tick record keeps the latest tick with a CASE; its instant is written as the column's
    UTC, not as a ``timestamptz`` the server converts by the session's zone (a server whose
    ``timezone`` is not UTC stored it hours off)."""
    from sqlalchemy import select
    from sqlalchemy.engine import make_url

    from scheduler._store.tables import workers

    url = make_url(direct_pg_url)
    options = f"{url.query.get('options', '')} -ctimezone=America/New_York".strip()
    zoned = url.set(query={**url.query, "options": options})  # the session's schema kept
    app = Scheduler(zoned.render_as_string(hide_password=False), registry=Registry())
    try:
        ticked = datetime(2030, 1, 7, 12, 0, 5, tzinfo=UTC)
        _health.record_tick(app.store, ticked, ticked)
        later = ticked + timedelta(minutes=1)
        _health.record_tick(app.store, later, later)  # the CASE: the newer one wins
        _health.record_tick(app.store, later, ticked)  # an older one leaves it
        with app.store.read() as conn:
            found = conn.execute(
                select(workers.c.last_tick_at).where(workers.c.id == _health.tick_record_id())
            ).scalar_one()
    finally:
        app.close()
    assert found == later
