"""The tick (SPEC §2) on SQLite, PostgreSQL and MariaDB: every clause, through the public API.

Time is a parameter: each test drives ``tick(now=...)`` and a :class:`ManualClock` for the
worker, so nothing sleeps. Cron ``*/10 * * * *`` from 2030-01-01 00:00Z gives slots at
:10, :20, ... (``slot(n)`` is the n-th).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select, update

from scheduler import PermanentError, Scheduler, SchedulerError, TaskSpec, UnknownRow, signals
from scheduler import _tick as tick_loop
from scheduler import _tick as tick_module
from scheduler._model.handlers import Registry
from scheduler._model.rows import DueRow
from scheduler._model.slots import next_slot
from scheduler._store.due import due
from scheduler._store.tables import jobs, rows
from scheduler._store.writers import Work, Writer, writer_for
from scheduler._store.writers.portable import PortableWriter
from scheduler._store.writers.postgres import PostgresWriter
from scheduler.testing import ManualClock, capture_signals, drive

pytestmark = pytest.mark.citus  # the suite's core: on Citus too (tests/helpers/citus_cluster.py)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
EVERY_10 = "*/10 * * * *"


def slot(n: int) -> datetime:
    return T0 + timedelta(minutes=10 * n)


def spec(name: str, handler: str = "ok", cron: str = EVERY_10, **kw: Any) -> TaskSpec:
    return TaskSpec(
        name=name,
        cron=cron,
        handler=handler,
        payload=kw.pop("payload", {}),
        timezone=kw.pop("timezone", "UTC"),
        **kw,
    )


def settings(app: Scheduler, **values: Any) -> None:
    app.settings = dataclasses.replace(app.settings, **values)


def job_count(app: Scheduler, task: str) -> int:
    with app.store.read() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(jobs).where(jobs.c.task_name == task)
            ).scalar_one()
        )


def row_version(app: Scheduler, name: str) -> int:
    found = app.get_row(name)
    assert found is not None
    return found.version


def at(app: Scheduler, now: datetime) -> ManualClock:
    """Point the app's clock (used by work/enable/trigger/sync) at ``now``."""
    clock = ManualClock(now)
    app.clock = clock
    return clock


def step(app: Scheduler, now: datetime) -> tick_module.TickReport:
    """One worker round at ``now``: tick, then run every ready job."""
    at(app, now)
    report = app.tick(now=now)
    app.work()
    return report


def row(app: Scheduler, name: str) -> Any:
    found = app.get_row(name)
    assert found is not None
    return found


@pytest.fixture
def sched(app: Scheduler) -> Scheduler:
    """``app`` with handlers ``ok`` (succeeds) and ``boom`` (aborts at once), clock at T0."""
    return with_handlers(app)


def with_handlers(app: Scheduler) -> Scheduler:
    at(app, T0)

    @app.handler("ok")
    def ok(job: Any) -> None:
        return None

    @app.handler("boom")
    def boom(job: Any) -> None:
        raise PermanentError("boom_code")

    return app


# --- 3. hold back while the last job is in flight -------------------------------------------
def test_hold_back_while_queued_then_one_dispatch(sched: Scheduler) -> None:
    sched.sync([spec("r")])
    assert sched.tick(now=slot(1)).dispatched == ["r"]
    first = row(sched, "r").last_job_id
    version = row_version(sched, "r")

    for now in (slot(2), slot(3) + timedelta(minutes=5)):  # nobody works: the job stays queued
        report = sched.tick(now=now)
        assert report.as_dict() == {
            "dispatched": [],
            "rerun": [],
            "held_back": ["r"],
            "disabled": [],
            "lost_race": [],
            "skipped_overlap": [],
            "missed": [],
            "locked": [],
        }
        assert row(sched, "r").next_run_at == slot(2)  # does not move
        # The first hold of the slot writes once (held_slot and its log entry); later ones
        # write nothing.
        assert row_version(sched, "r") == version + 1
    assert job_count(sched, "r") == 1

    clock = at(sched, slot(3))
    later = clock.advance(minutes=6)
    assert sched.work() == 1
    assert sched.tick(now=later).dispatched == ["r"]  # fires once as soon as the job ended
    assert sched.tick(now=later).as_dict() == tick_module.TickReport().as_dict()
    assert row(sched, "r").next_run_at == slot(4)
    assert row(sched, "r").last_job_id != first
    assert job_count(sched, "r") == 2


def test_hold_back_while_claimed(sched: Scheduler) -> None:
    sched.sync([spec("r")])
    sched.tick(now=slot(1))
    at(sched, slot(1))
    runner = sched.runner()
    [job] = runner.claim(1)
    assert sched.get_job(job.id).state == "claimed"  # type: ignore[union-attr]

    report = sched.tick(now=slot(2))
    assert report.held_back == ["r"] and not report.dispatched
    assert row(sched, "r").next_run_at == slot(2)

    at(sched, slot(2) + timedelta(seconds=30))
    assert runner.run(job) == "succeeded"
    report = sched.tick(now=slot(2) + timedelta(seconds=30))
    assert report.dispatched == ["r"] and not report.held_back
    assert job_count(sched, "r") == 2


def test_hold_back_while_retrying(sched: Scheduler) -> None:
    calls: list[int] = []

    @sched.handler("flaky", retry_safe=True, max_attempts=3)
    def flaky(job: Any) -> None:
        calls.append(job.attempt)
        if len(calls) == 1:
            raise ValueError("first attempt fails")

    settings(sched, backoff_base_seconds=15 * 60)  # the retry waits past the next slot
    sched.sync([spec("r", "flaky")])
    step(sched, slot(1))
    job = sched.get_job(row(sched, "r").last_job_id)
    assert job is not None
    assert (job.state, job.attempts, job.last_error_code) == ("queued", 1, "ValueError")

    report = step(sched, slot(2))  # retry due at slot(1) + 15 min: still waiting
    assert report.held_back == ["r"] and not report.dispatched
    assert row(sched, "r").next_run_at == slot(2)

    retry_done = slot(2) + timedelta(minutes=5, seconds=1)
    report = step(sched, retry_done)  # tick first (held), then the retry runs and succeeds
    assert report.held_back == ["r"]
    assert sched.get_job(job.id).state == "succeeded"  # type: ignore[union-attr]
    assert calls == [1, 2]
    assert sched.tick(now=retry_done).dispatched == ["r"]
    assert row(sched, "r").consecutive_failures == 0
    assert job_count(sched, "r") == 2


def test_a_held_back_row_fires_once_as_soon_as_its_job_ends(sched: Scheduler) -> None:
    failed: list[int] = []

    @sched.handler("flaky", retry_safe=True, max_attempts=3)
    def flaky(job: Any) -> None:
        if not failed:
            failed.append(job.id)
            raise ValueError("first attempt fails")

    settings(sched, backoff_base_seconds=25 * 60)  # the retry waits past two slots
    sched.sync([spec("r", "flaky")])
    retry = slot(1) + timedelta(minutes=25)
    result = drive(sched, slot(1), slot(5), timedelta(minutes=5))  # a worker polling
    held = [slot(2), slot(2) + timedelta(minutes=5), slot(3), retry]
    assert result.times("r", "held_back") == held  # next_run_at stays at slot(2) meanwhile
    # the retry succeeds at `retry`, and the row fires at that same instant, once
    assert result.times("r", "dispatched") == [slot(1), retry, slot(4), slot(5)]
    assert job_count(sched, "r") == 4


# --- 2. rerun in place ----------------------------------------------------------------------
def test_rerun_in_place_keeps_one_job_and_refreshes_definition(sched: Scheduler) -> None:
    settings(sched, max_consecutive_failures=0)

    @sched.handler("boom2", max_attempts=2)
    def boom2(job: Any) -> None:
        raise PermanentError("second")

    sched.sync([spec("r", "boom", payload={"v": 1})])
    with capture_signals(signals.job_rerun, signals.job_dispatched) as records:
        for n in range(1, 6):
            step(sched, slot(n))
    job_id = row(sched, "r").last_job_id
    assert [(r.signal, r.sender) for r in records] == (
        [("job-dispatched", "r")] + [("job-rerun", "r")] * 4
    )
    assert [r.kwargs["consecutive_failures"] for r in records[1:]] == [1, 2, 3, 4]
    assert {r.kwargs["job_id"] for r in records} == {job_id}
    assert job_count(sched, "r") == 1
    assert row(sched, "r").consecutive_failures == 4

    # the task's definition changes; the next rerun takes it from the row
    at(sched, slot(5) + timedelta(minutes=1))
    plan = sched.sync([spec("r", "boom2", payload={"v": 2})])
    assert plan.update == ["r"]
    now = slot(6)
    report = sched.tick(now=now)
    assert report.rerun == ["r"] and not report.dispatched
    job = sched.get_job(job_id)
    assert job is not None
    assert (job.id, job.state, job.handler, job.payload) == (job_id, "queued", "boom2", {"v": 2})
    assert (job.attempts, job.max_attempts, job.run_at, job.last_error_code) == (0, 2, now, None)
    assert job.lease_owner is None and job.lease_expires_at is None
    assert row(sched, "r").consecutive_failures == 5
    assert row(sched, "r").next_run_at == slot(7)

    at(sched, now)
    sched.work()
    assert job_count(sched, "r") == 1
    history = sched.history(job_id)
    assert [(h["attempt"], h["outcome"], h["error_code"]) for h in history] == (
        [(1, "aborted", "boom_code")] * 5 + [(1, "aborted", "second")]
    )


def test_rerun_history_keeps_retries_of_every_interval(sched: Scheduler) -> None:
    @sched.handler("always", retry_safe=True, max_attempts=2)
    def always(job: Any) -> None:
        raise KeyError("nope")

    settings(sched, max_consecutive_failures=0)
    sched.sync([spec("r", "always")])
    result = drive(sched, slot(1), slot(4) + timedelta(minutes=2))  # retries a minute later
    assert result.times("r") == [slot(1), slot(2), slot(3), slot(4)]
    assert result.times("r", "dispatched") == [slot(1)]
    job_id = row(sched, "r").last_job_id
    outcomes = [(h["attempt"], h["outcome"], h["error_code"]) for h in sched.history(job_id)]
    assert outcomes == [(1, "failed", "KeyError"), (2, "aborted", "KeyError")] * 4
    assert job_count(sched, "r") == 1
    assert row(sched, "r").consecutive_failures == 3


# --- 2. disable at the limit ----------------------------------------------------------------
READ_ROW = """
import json, sys
from scheduler import Scheduler
from scheduler._model.handlers import Registry
app = Scheduler(sys.argv[1], registry=Registry())
row = app.get_row(sys.argv[2])
print(json.dumps({"enabled": row.enabled, "reason": row.disabled_reason,
                  "failures": row.consecutive_failures}))
"""


def read_row_in_new_process(url: str, name: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", READ_ROW, url, name],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_disable_at_limit_commits_then_signals_once(
    sched: Scheduler, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    sched.sync([spec("r", "boom", max_consecutive_failures=3), spec("later", "ok")])
    seen_from_outside: list[tuple[bool, str | None]] = []
    others: list[str] = []

    called: list[str] = []

    # Both receivers raise once they have done their part: whatever order blinker calls them
    # in, one of them runs after the other raised.
    def raising(sender: Any, **kw: Any) -> None:
        called.append("raising")
        raise RuntimeError("a broken receiver")

    def check_committed(sender: Any, **kw: Any) -> None:
        called.append("check_committed")
        fresh = Scheduler(db_url, registry=Registry())  # a new engine: new connections
        try:
            seen = row(fresh, kw["row"])
            seen_from_outside.append((seen.enabled, seen.disabled_reason))
        finally:
            fresh.close()
        raise LookupError("also broken")

    def other(sender: Any, **kw: Any) -> None:
        others.append(sender)

    with (
        signals.row_disabled.connected_to(raising, sender="r"),
        signals.row_disabled.connected_to(check_committed, sender="r"),
        signals.row_disabled.connected_to(other, sender="not-r"),
        capture_signals(signals.row_disabled) as records,
    ):
        for n in (1, 2, 3):
            report = step(sched, slot(n))
            assert "r" not in report.disabled
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="scheduler.signals"):
            report = step(sched, slot(4))
        for n in (5, 6):
            assert step(sched, slot(n)).dispatched == ["later"]  # nothing for `r`

    # reported not dispatched, under `disabled`, and the tick went on to the next row
    assert report.disabled == ["r"]
    assert "r" not in report.dispatched + report.rerun + report.held_back + report.lost_race
    assert report.dispatched == ["later"]
    # the signal: once, after the commit, with its keywords, the sender filtering receivers
    assert len(records) == 1
    name, sender, kwargs = records[0]
    assert (name, sender) == ("row-disabled", "r")
    assert (kwargs["row"], kwargs["consecutive_failures"], kwargs["last_error_code"]) == (
        "r",
        3,
        "boom_code",
    )
    assert kwargs["job_id"] == row(sched, "r").last_job_id
    assert kwargs["disabled_at"] == slot(4)
    assert seen_from_outside == [(False, "max_consecutive_failures")]
    assert others == []
    assert sorted(called) == ["check_committed", "raising"]
    failures = [r for r in caplog.records if "raised" in r.getMessage()]
    assert sorted(r.exc_info[0].__name__ for r in failures if r.exc_info) == [
        "LookupError",
        "RuntimeError",
    ]
    # nothing left for the outbox sweep: not sent again
    with capture_signals(signals.row_disabled) as again:
        assert sched.deliver_pending_alerts(older_than=0) == 0
    assert again == []
    # a fresh process sees the committed disable
    assert read_row_in_new_process(db_url, "r") == {
        "enabled": False,
        "reason": "max_consecutive_failures",
        "failures": 3,
    }
    stored = row(sched, "r")
    assert stored.disabled_at == slot(4)
    assert stored.next_run_at == slot(4)  # a disable does not advance the schedule
    assert job_count(sched, "r") == 1
    assert len(sched.history(stored.last_job_id)) == 3


def test_the_alert_names_the_error_behind_an_abandoned_job(sched: Scheduler) -> None:
    @sched.handler("unsafe")  # not retry-safe: a raise abandons the job
    def unsafe(job: Any) -> None:
        raise KeyError("gone")

    sched.sync([spec("u", "unsafe", max_consecutive_failures=2)])
    with capture_signals(signals.row_disabled) as records:
        drive(sched, slot(1), slot(3))
    assert [r.sender for r in records] == ["u"]
    assert records[0].kwargs["last_error_code"] == "KeyError"
    job = sched.get_job(row(sched, "u").last_job_id)
    assert job is not None and job.last_error_code == "abandoned"  # the job keeps SPEC's code


def test_limits_per_row_override_global_and_zero_is_unlimited(sched: Scheduler) -> None:
    settings(sched, max_consecutive_failures=3)
    sched.sync(
        [
            spec("global", "boom"),  # 3
            spec("two", "boom", max_consecutive_failures=2),
            spec("five", "boom", max_consecutive_failures=5),
            spec("never", "boom", max_consecutive_failures=0),
        ]
    )
    with capture_signals(signals.row_disabled) as records:
        result = drive(sched, slot(1), slot(9))
    assert [(r.sender, r.kwargs["consecutive_failures"]) for r in records] == [
        ("two", 2),
        ("global", 3),
        ("five", 5),
    ]
    for name, limit in (("two", 2), ("global", 3), ("five", 5)):
        assert result.times(name, "disabled") == [slot(limit + 1)]
        assert result.times(name) == [slot(n) for n in range(1, limit + 1)]
        stored = row(sched, name)
        assert (stored.enabled, stored.disabled_reason, stored.consecutive_failures) == (
            False,
            "max_consecutive_failures",
            limit,
        )
        assert len(sched.history(stored.last_job_id)) == limit
    never = row(sched, "never")
    assert never.enabled and never.consecutive_failures == 8
    assert result.times("never") == [slot(n) for n in range(1, 10)]


def test_global_zero_is_unlimited(sched: Scheduler) -> None:
    settings(sched, max_consecutive_failures=0)
    sched.sync([spec("free", "boom"), spec("capped", "boom", max_consecutive_failures=2)])
    result = drive(sched, slot(1), slot(8))
    assert result.report.disabled == ["capped"]
    assert row(sched, "free").enabled and row(sched, "free").consecutive_failures == 7


def test_enable_resets_count_and_rearms_from_now(sched: Scheduler) -> None:
    sched.sync([spec("r", "boom", max_consecutive_failures=2)])
    drive(sched, slot(1), slot(3))
    assert not row(sched, "r").enabled
    job_id = row(sched, "r").last_job_id

    at(sched, slot(10) + timedelta(minutes=3))
    assert sched.enable("r") is True
    stored = row(sched, "r")
    assert (stored.enabled, stored.disabled_reason, stored.disabled_at) == (True, None, None)
    assert stored.consecutive_failures == 0
    assert stored.next_run_at == slot(11)  # first slot after now, not the stale one
    assert sched.tick(now=slot(10) + timedelta(minutes=9)).as_dict()["rerun"] == []
    # the aborted job is counted afresh and rerun in place
    assert step(sched, slot(11)).rerun == ["r"]
    assert row(sched, "r").consecutive_failures == 1
    assert row(sched, "r").last_job_id == job_id
    with pytest.raises(UnknownRow):
        sched.enable("missing")


def test_enable_on_an_enabled_row_changes_nothing(sched: Scheduler) -> None:
    sched.sync([spec("r", "boom", max_consecutive_failures=5)])
    drive(sched, slot(1), slot(2))  # dispatched, aborted, rerun: one failure counted
    before = row(sched, "r")
    assert before.enabled and before.consecutive_failures == 1
    at(sched, slot(2) + timedelta(minutes=3))
    assert sched.enable("r") is False
    assert row(sched, "r") == before  # same count, same slot, same version


def test_disable_then_tick_does_nothing(sched: Scheduler) -> None:
    sched.sync([spec("r")])
    at(sched, slot(0) + timedelta(minutes=1))
    version = row_version(sched, "r")
    sched.disable("r")
    stored = row(sched, "r")
    assert (stored.enabled, stored.disabled_reason) == (False, "manual")
    assert stored.version == version + 1  # every write bumps the version
    with capture_signals() as records:
        for n in (1, 2, 100):
            assert not sched.tick(now=slot(n))
    assert records == []
    assert job_count(sched, "r") == 0
    assert row(sched, "r").next_run_at == slot(1)


def test_trigger_makes_due_now_and_the_gates_apply(sched: Scheduler) -> None:
    sched.sync([spec("r", cron="0 0 1 1 *"), spec("bad", "boom", cron="0 0 1 1 *")])
    now = at(sched, T0 + timedelta(minutes=5))()
    sched.trigger("r")
    assert row(sched, "r").next_run_at == now
    assert sched.tick(now=now).dispatched == ["r"]
    assert row(sched, "r").next_run_at == datetime(2031, 1, 1, tzinfo=UTC)

    now = at(sched, now + timedelta(minutes=1))()
    sched.trigger("r")  # its job has not run yet: held back, stays due
    assert sched.tick(now=now).held_back == ["r"]
    assert row(sched, "r").next_run_at == now
    sched.work()
    assert sched.tick(now=now).dispatched == ["r"]
    assert job_count(sched, "r") == 2

    sched.trigger("bad")
    step(sched, now)  # dispatched, aborted
    sched.trigger("bad")  # last job aborted: counted and rerun in place
    assert sched.tick(now=now).rerun == ["bad"]
    assert job_count(sched, "bad") == 1

    sched.disable("r")
    with pytest.raises(SchedulerError, match="disabled"):
        sched.trigger("r")
    with pytest.raises(UnknownRow):
        sched.trigger("missing")


# --- 4. fresh dispatch ----------------------------------------------------------------------
def test_success_resets_the_count_at_the_next_dispatch(sched: Scheduler) -> None:
    fail = [True, True, False, False]

    @sched.handler("mend")
    def mend(job: Any) -> None:
        if fail.pop(0):
            raise PermanentError("still_broken")

    sched.sync([spec("r", "mend")])
    assert step(sched, slot(1)).dispatched == ["r"]
    first = row(sched, "r").last_job_id
    assert step(sched, slot(2)).rerun == ["r"]
    assert step(sched, slot(3)).rerun == ["r"]  # this run succeeds
    assert sched.get_job(first).state == "succeeded"  # type: ignore[union-attr]
    assert row(sched, "r").consecutive_failures == 2  # until the next fresh dispatch
    assert step(sched, slot(4)).dispatched == ["r"]
    assert row(sched, "r").consecutive_failures == 0
    assert row(sched, "r").last_job_id != first
    assert job_count(sched, "r") == 2


def test_concurrent_rows_dispatch_while_a_job_is_in_flight(sched: Scheduler) -> None:
    sched.sync([spec("c", concurrent=True), spec("serial")])
    assert sched.tick(now=slot(1)).dispatched == ["c", "serial"]
    report = sched.tick(now=slot(2))  # both last jobs still queued
    assert (report.dispatched, report.held_back) == (["c"], ["serial"])
    at(sched, slot(2))
    claimed = sched.runner().claim(10)
    assert {j.task_name for j in claimed} == {"c", "serial"}  # now claimed, still in flight
    report = sched.tick(now=slot(3))
    assert (report.dispatched, report.held_back) == (["c"], ["serial"])
    assert job_count(sched, "c") == 3 and job_count(sched, "serial") == 1
    assert row(sched, "c").next_run_at == slot(4)


def test_concurrent_dispatch_over_a_job_in_flight_keeps_the_count(sched: Scheduler) -> None:
    sched.sync([spec("c", "boom", concurrent=True)])
    for n in (1, 2, 3):
        step(sched, slot(n))  # dispatched, then rerun twice
    assert row(sched, "c").consecutive_failures == 2
    rerun = row(sched, "c").last_job_id
    assert sched.tick(now=slot(4)).rerun == ["c"]  # the rerun job stays queued: in flight
    assert row(sched, "c").consecutive_failures == 3
    assert sched.tick(now=slot(5)).dispatched == ["c"]
    assert row(sched, "c").consecutive_failures == 3  # only a success resets it
    assert row(sched, "c").last_job_id != rerun


def test_aborted_last_job_is_checked_before_the_in_flight_gate(sched: Scheduler) -> None:
    sched.sync([spec("c", "boom", concurrent=True)])
    step(sched, slot(1))
    job_id = row(sched, "c").last_job_id
    assert sched.get_job(job_id).state == "aborted"  # type: ignore[union-attr]
    report = sched.tick(now=slot(2))
    assert report.rerun == ["c"] and not report.dispatched
    assert row(sched, "c").consecutive_failures == 1
    assert job_count(sched, "c") == 1


# --- coalescing and batches -----------------------------------------------------------------
def test_missed_slots_coalesce_into_one_run(sched: Scheduler) -> None:
    sched.sync([spec("r", cron="*/5 * * * *")])
    now = T0 + timedelta(days=3, minutes=2, seconds=7)
    with capture_signals(signals.job_dispatched) as records:
        assert sched.tick(now=now).dispatched == ["r"]
        assert not sched.tick(now=now)
    assert row(sched, "r").next_run_at == T0 + timedelta(days=3, minutes=5)
    assert job_count(sched, "r") == 1
    assert [r.kwargs["slot"] for r in records] == [T0 + timedelta(minutes=5)]


def test_due_rows_oldest_first_in_bounded_batches(sched: Scheduler) -> None:
    settings(sched, batch_size=3)
    names = [f"row-{i:02d}" for i in range(10)]
    sched.sync([spec(n, cron="0 0 1 1 *") for n in [*names, "busy"]])
    # `busy` is the oldest due row but held back behind its own job: it must not stall the rest
    at(sched, T0)
    sched.trigger("busy")
    sched.tick(now=T0)
    order = [names[i] for i in (7, 2, 9, 0, 5, 3, 8, 1, 6, 4)]  # not the id order
    for minute, name in enumerate(order, start=1):
        at(sched, T0 + timedelta(minutes=minute))
        sched.trigger(name)
    at(sched, T0)
    sched.trigger("busy")

    due_queries: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM scheduler_rows LEFT OUTER JOIN scheduler_jobs" in statement:
            due_queries.append(statement)

    event.listen(sched.store.engine, "before_cursor_execute", count)
    try:
        report = sched.tick(now=T0 + timedelta(hours=1))
    finally:
        event.remove(sched.store.engine, "before_cursor_execute", count)
    assert report.held_back == ["busy"]
    assert report.dispatched == order  # oldest next_run_at first, across batches
    assert len(due_queries) == 4  # 11 due rows in batches of 3: 3 + 3 + 3 + 2
    assert all("LIMIT" in q for q in due_queries)


class Halfway:
    """Where a tick that lost a race goes on: halfway through the range it is given."""

    @staticmethod
    def randint(low: int, high: int) -> int:
        return (low + high) // 2


def test_a_tick_that_lost_a_race_goes_on_elsewhere_and_still_takes_every_row(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost race sends the tick to a random position among the due rows (so that ticks
    racing for the same rows part); it comes back for the rows it skipped, and decides none
    twice: one report entry and at most one job per row."""
    monkeypatch.setattr(tick_loop, "_random", Halfway)  # rows are skipped, then come back
    settings(sched, batch_size=4)
    names = [f"row-{i:02d}" for i in range(13)]
    sched.sync([spec("busy", cron="0 0 1 1 *"), *(spec(n, cron="0 0 1 1 *") for n in names)])
    at(sched, T0)
    sched.trigger("busy")
    assert sched.tick(now=T0).dispatched == ["busy"]  # its job stays queued: held back below
    now = datetime(2031, 1, 1, tzinfo=UTC)  # every row is due, at the same instant
    statements: list[str] = []
    bumped: list[str] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)
        if "FROM scheduler_rows LEFT OUTER JOIN scheduler_jobs" in statement and not bumped:
            bumped.append("row-01")  # another process writes a row this tick has just read
            with sched.store.begin() as other:
                other.execute(
                    update(rows).where(rows.c.name == "row-01").values(version=rows.c.version + 1)
                )

    event.listen(sched.store.engine, "after_cursor_execute", after)
    try:
        report = sched.tick(now=now)
    finally:
        event.remove(sched.store.engine, "after_cursor_execute", after)
    assert report.lost_race == ["row-01"]
    assert report.held_back == ["busy"]
    assert sorted(report.dispatched) == [n for n in names if n != "row-01"]
    assert len(report.dispatched) == len(set(report.dispatched))
    assert any("max(scheduler_rows.id)" in s for s in statements)  # it went elsewhere
    assert [job_count(sched, n) for n in names] == [0 if n == "row-01" else 1 for n in names]
    assert sched.tick(now=now).dispatched == ["row-01"]  # its slot was not lost, only deferred


# --- lost race: a stale snapshot never wins -------------------------------------------------
def stale_snapshot(app: Scheduler, now: datetime) -> DueRow:
    with app.store.engine.connect() as conn:
        [snapshot] = due(app.store, conn, now, 10, None)
    return snapshot


def carry(
    app: Scheduler, snapshot: DueRow, now: datetime, writer: Writer
) -> tick_module.TickReport:
    """The snapshot decided and carried out by `writer`, then reported as the tick does."""
    decision = tick_module.decide(
        snapshot,
        now,
        max_consecutive_failures=app.settings.max_consecutive_failures,
        next_slot=next_slot,
    )
    work = Work(now=now, job_defaults=app._job_defaults, connections=4)
    report = tick_module.TickReport()
    with app.store.engine.connect() as conn:
        carried = writer.carry_out(app.store, conn, [(snapshot, decision)], work)
        tick_loop._settle(conn, [snapshot], carried, report)
    return report


def run_one(app: Scheduler, snapshot: DueRow, now: datetime) -> tick_module.TickReport:
    """One row on its own connection, through the portable writer (every engine)."""
    return carry(app, snapshot, now, PortableWriter(single_writer=True))


def test_lost_race_on_a_stale_dispatch_writes_nothing(sched: Scheduler, db_url: str) -> None:
    sched.sync([spec("r")])
    stale = stale_snapshot(sched, slot(1))
    other = Scheduler(db_url, registry=Registry())
    try:
        assert other.tick(now=slot(1)).dispatched == ["r"]
    finally:
        other.close()
    with capture_signals() as records:
        report = run_one(sched, stale, slot(1))
    assert report.lost_race == ["r"] and not report.dispatched
    assert records == []
    assert job_count(sched, "r") == 1  # the loser's insert was rolled back
    with sched.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 1


def spread_one(app: Scheduler, snapshot: DueRow, now: datetime) -> tick_module.TickReport:
    """PostgreSQL: the snapshot through the PostgreSQL writer (one statement per fresh row,
    over connections at once)."""
    return carry(app, snapshot, now, PostgresWriter())


def fresh_then_stale(sched: Scheduler, run: Callable[..., tick_module.TickReport]) -> None:
    sched.sync([spec("r")])
    snapshot = stale_snapshot(sched, slot(1))
    with capture_signals() as records:
        assert run(sched, snapshot, slot(1)).dispatched == ["r"]
        assert run(sched, snapshot, slot(1)).lost_race == ["r"]
    assert [r.sender for r in records] == ["r"]
    assert job_count(sched, "r") == 1
    assert row(sched, "r").next_run_at == slot(2)


def test_a_fresh_snapshot_dispatches_once_on_its_own(sched: Scheduler) -> None:
    """A row carried out on its own connection (portable writer): the fresh snapshot wins
    once; the same snapshot again is stale and writes nothing."""
    fresh_then_stale(sched, run_one)


def test_a_fresh_snapshot_dispatches_once_spread(pg_url: str) -> None:
    """The same through the PostgreSQL writer (the tick's fresh rows, psycopg). Citus refuses
    its statement (``nextval`` in an UPDATE of a distributed table): the tick takes the
    portable writer there."""
    app = Scheduler(pg_url, registry=Registry())
    try:
        with app.store.read():  # connected: Citus is known
            pass
        if app.store.caps.citus:
            assert isinstance(writer_for(app.store), PortableWriter)
            return
        fresh_then_stale(with_handlers(app), spread_one)
    finally:
        app.close()


@pytest.mark.parametrize("interloper", ["disable", "raw_update"])
def test_lost_race_after_any_write_to_the_row(sched: Scheduler, interloper: str) -> None:
    sched.sync([spec("r")])
    stale = stale_snapshot(sched, slot(1))
    if interloper == "disable":
        sched.disable("r")
    else:  # a write that leaves every column the tick looks at as it was but the version
        with sched.store.begin() as conn:
            conn.execute(update(rows).where(rows.c.name == "r").values(version=rows.c.version + 1))
    assert run_one(sched, stale, slot(1)).lost_race == ["r"]
    assert job_count(sched, "r") == 0


def test_a_disable_is_won_and_signalled_once(sched: Scheduler, db_url: str) -> None:
    sched.sync([spec("r", "boom", max_consecutive_failures=1)])
    step(sched, slot(1))  # dispatched, aborted
    stale = stale_snapshot(sched, slot(2))
    with capture_signals(signals.row_disabled) as records:
        other = Scheduler(db_url, registry=Registry())
        try:
            assert other.tick(now=slot(2)).disabled == ["r"]
        finally:
            other.close()
        assert run_one(sched, stale, slot(2)).lost_race == ["r"]
    assert [r.sender for r in records] == ["r"]
    assert row(sched, "r").consecutive_failures == 1


def test_a_rerun_is_won_once(sched: Scheduler) -> None:
    sched.sync([spec("r", "boom")])
    step(sched, slot(1))
    stale = stale_snapshot(sched, slot(2))
    assert sched.tick(now=slot(2)).rerun == ["r"]
    assert run_one(sched, stale, slot(2)).lost_race == ["r"]
    assert row(sched, "r").consecutive_failures == 1
    job = sched.get_job(row(sched, "r").last_job_id)
    assert job is not None and (job.state, job.attempts) == ("queued", 0)


def test_the_rerun_reset_is_conditional_on_the_job_still_aborted(sched: Scheduler) -> None:
    sched.sync([spec("r", "boom")])
    step(sched, slot(1))
    stale = stale_snapshot(sched, slot(2))
    assert stale.job_state == "aborted"
    version = row_version(sched, "r")
    with sched.store.begin() as conn:  # the job moves on without the row's version changing
        conn.execute(update(jobs).where(jobs.c.id == stale.last_job_id).values(state="succeeded"))
    assert run_one(sched, stale, slot(2)).lost_race == ["r"]
    after = row(sched, "r")  # the row's half of the rerun was rolled back with it
    assert (after.version, after.consecutive_failures, after.next_run_at) == (version, 0, slot(2))
    assert sched.get_job(stale.last_job_id).state == "succeeded"  # type: ignore[union-attr]


# --- a batch spread over several connections (PostgreSQL's default; one on SQLite) ----------
def test_a_mixed_batch_over_several_connections(sched: Scheduler, db_url: str) -> None:
    """40 due rows of every kind in one batch: each row is decided once, in its own
    transaction; the report and the signals follow due order; each signal comes after its
    row's commit (seen from another connection). PostgreSQL dispatches the fresh rows over four
    connections at once from the ticking thread; MariaDB (told to) over tick threads."""
    settings(sched, max_consecutive_failures=3, batch_size=100, tick_connections=4)
    names = {kind: [f"{kind}-{i:02d}" for i in range(10)] for kind in ("fresh", "held", "rerun")}
    names["disable"] = [f"disable-{i:02d}" for i in range(10)]
    specs = [spec(n) for n in names["fresh"] + names["held"]]
    specs += [spec(n, "boom") for n in names["rerun"] + names["disable"]]
    sched.sync(specs)
    sched.tick(now=slot(1))  # every row gets its first job
    at(sched, slot(1))
    doomed = set(names["rerun"] + names["disable"])
    with sched.store.begin() as conn:
        for name in names["fresh"]:  # its job succeeded: a fresh dispatch follows
            conn.execute(update(jobs).where(jobs.c.task_name == name).values(state="succeeded"))
        for name in doomed:
            conn.execute(update(jobs).where(jobs.c.task_name == name).values(state="aborted"))
        conn.execute(  # two failures already: the third reaches the limit
            update(rows).where(rows.c.name.in_(names["disable"])).values(consecutive_failures=2)
        )
    threads: set[str] = set()
    backends: set[int] = set()  # PostgreSQL: the sessions the fresh dispatches ran on

    def where(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        threads.add(threading.current_thread().name)
        if "INSERT INTO scheduler_jobs" in statement and conn.dialect.name == "postgresql":
            backends.add(conn.connection.driver_connection.info.backend_pid)

    committed: list[tuple[str, str, Any]] = []

    def check_committed(sender: str, **kw: Any) -> None:
        outside = Scheduler(db_url, registry=Registry())
        try:
            found = outside.get_row(sender)
            assert found is not None
            committed.append((sender, "enabled" if found.enabled else "disabled", found.version))
        finally:
            outside.close()

    receivers = (signals.job_dispatched, signals.job_rerun, signals.row_disabled)
    for signal in receivers:
        signal.connect(check_committed)
    event.listen(sched.store.engine, "before_cursor_execute", where)
    try:
        with capture_signals(*receivers) as records:
            report = sched.tick(now=slot(2))
    finally:
        event.remove(sched.store.engine, "before_cursor_execute", where)
        for signal in receivers:
            signal.disconnect(check_committed)

    all_names = [n for kind in names.values() for n in kind]
    with sched.store.read() as conn:
        ids = {name: id_ for name, id_ in conn.execute(select(rows.c.name, rows.c.id))}
    due_order = sorted(all_names, key=ids.__getitem__)  # one slot: by id
    assert report.dispatched == names["fresh"]
    assert report.held_back == names["held"]
    assert report.rerun == names["rerun"]
    assert report.disabled == names["disable"]
    assert report.lost_race == []
    signalled = [r.sender for r in records]
    assert signalled == [n for n in due_order if n not in names["held"]]
    assert len(committed) == 30
    for sender, state, version in committed:  # the receiver saw the committed row
        assert state == ("disabled" if sender in names["disable"] else "enabled")
        assert version == row_version(sched, sender)
    for name in due_order:
        assert job_count(sched, name) == (2 if name in names["fresh"] else 1)
        found = row(sched, name)
        assert found.enabled == (name not in names["disable"])
        expected_next = slot(2) if name in names["held"] or name in names["disable"] else slot(3)
        assert found.next_run_at == expected_next, name
    lanes = {t for t in threads if t.startswith("scheduler-tick")}
    dialect = sched.store.engine.dialect.name
    if dialect == "sqlite":
        assert lanes == set()  # one writer at a time
    elif dialect == "postgresql" and not sched.store.caps.citus:
        # four connections at once, all from the ticking thread
        assert (lanes, len(backends)) == (set(), 4)
    else:  # the ticking thread's own connection and helper threads': the pool hands a lane
        # to a thread that is already idle before it starts another, so one to three of them
        # (MariaDB; Citus, whose tick takes the portable writer)
        assert 1 <= len(lanes) <= 3


def test_a_forked_child_ticks_over_several_connections(pg_url: str) -> None:
    """A child forked after a tick (a pre-forking server) ticks over its own connections: it
    neither waits on its parent's helper threads nor uses its parent's sessions."""
    import os
    import signal
    import time

    app = Scheduler(pg_url, registry=Registry())
    app.handler("ok")(lambda job: None)
    try:
        app.sync([spec(f"r{i}") for i in range(12)])
        assert len(app.tick(now=slot(1)).dispatched) == 12  # helper threads now exist
        with app.store.begin() as conn:
            conn.execute(update(jobs).values(state="succeeded"))
        pid = os.fork()
        if pid == 0:  # the child: new connections (SQLAlchemy's advice after fork), then tick
            code = 1
            try:
                app.store.engine.dispose(close=False)
                code = 0 if len(app.tick(now=slot(2)).dispatched) == 12 else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's tick hung")
        assert os.waitstatus_to_exitcode(status) == 0
        assert job_count(app, "r0") == 2
    finally:
        app.close()
