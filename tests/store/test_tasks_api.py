"""Tasks as data: the application's own rows (``put_task``, ``put_tasks``, ``remove_task``,
``rows(...)``) beside the file's, on SQLite, PostgreSQL (also through PgBouncer) and MariaDB.

Two owners never cross: ``sync`` manages the file's rows (``source`` ``file``) and never
touches the application's (``api``); the calls manage the ``api`` rows and refuse a file
row's name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler import ConfigError, Scheduler, SchedulerError, TaskSpec
from scheduler._model.handlers import Registry
from scheduler.testing import ManualClock

pytestmark = pytest.mark.citus  # the suite's core: on Citus too (tests/helpers/citus_cluster.py)

NOW = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)  # a Monday


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def sched(db_url: str, clock: ManualClock) -> Any:
    app = Scheduler(db_url, registry=Registry(), clock=clock)
    yield app
    app.close()


def crm(name: str = "crm-sync-42", **changes: Any) -> TaskSpec:
    values: dict[str, Any] = dict(
        name=name,
        cron="0 6 * * 1-5",
        timezone="America/Chicago",
        handler="crm.sync",
        payload={"customer": 42},
        tenant="acme",
        group="customer-42",
    )
    values.update(changes)
    return TaskSpec(**values)


def audit_actions(app: Scheduler) -> list[str]:
    return [entry.action for entry in app.audit(limit=1000)]


def test_put_task_creates_an_api_row_with_its_group_and_next_fires(sched: Scheduler) -> None:
    change = sched.put_task(crm(), reason="customer signed up", actor="web")
    assert change.action == "created" and change.fires_before == ()
    assert len(change.fires_after) == 5
    first = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)  # 06:00 in Chicago (UTC-6) is 12:00 UTC
    assert change.fires_after[0] == first + timedelta(days=1)  # today's 06:00 has passed
    row = sched.get_row("crm-sync-42")
    assert row is not None and row == change.row
    assert (row.source, row.group, row.tenant) == ("api", "customer-42", "acme")
    assert row.next_run_at == change.fires_after[0] and row.payload == {"customer": 42}
    [entry] = sched.audit("crm-sync-42")
    assert (entry.action, entry.actor, entry.reason, entry.detail) == (
        "put_task",
        "web",
        "customer signed up",
        "created",
    )


def test_an_unchanged_spec_writes_nothing(sched: Scheduler) -> None:
    sched.put_task(crm())
    before = sched.get_row("crm-sync-42")
    change = sched.put_task(crm())
    assert change.action == "unchanged" and change.changed == ()
    assert change.fires_before == change.fires_after and len(change.fires_after) == 5
    assert sched.get_row("crm-sync-42") == before  # same version: no write
    assert audit_actions(sched) == ["put_task"]


def test_a_changed_cron_moves_the_row_and_shows_both_schedules(
    sched: Scheduler, clock: ManualClock
) -> None:
    sched.put_task(crm())
    clock.advance(timedelta(hours=1))
    change = sched.put_task(crm(cron="0 7 * * 1-5"))
    assert change.action == "updated" and change.changed == ("cron",)
    assert [f.hour for f in change.fires_before] == [12] * 5  # 06:00 CST
    assert [f.hour for f in change.fires_after] == [13] * 5  # 07:00 CST
    row = sched.get_row("crm-sync-42")
    assert row is not None and row.next_run_at == change.fires_after[0]
    assert sched.audit("crm-sync-42")[0].detail == "updated: cron"


def test_a_changed_payload_keeps_the_slot_the_failures_and_an_automatic_disable(
    sched: Scheduler,
) -> None:
    sched.put_task(crm(max_consecutive_failures=1))
    due = sched.get_row("crm-sync-42").next_run_at  # type: ignore[union-attr]
    sched.disable("crm-sync-42", reason="by hand")  # a disable the app did not put there
    change = sched.put_task(crm(max_consecutive_failures=1, payload={"customer": 43}))
    assert change.changed == ("payload",)
    row = sched.get_row("crm-sync-42")
    assert row is not None and row.payload == {"customer": 43} and row.next_run_at == due
    assert not row.enabled and row.disabled_reason == "manual"  # survives: enabled unchanged


def test_enabled_false_disables_and_true_enables_again(
    sched: Scheduler, clock: ManualClock
) -> None:
    sched.put_task(crm())
    sched.put_task(crm(enabled=False))
    row = sched.get_row("crm-sync-42")
    assert row is not None and not row.enabled and row.disabled_reason == "disabled_by_api"
    clock.advance(timedelta(days=3))
    change = sched.put_task(crm(enabled=True))
    assert change.changed == ("enabled",) and change.fires_before == ()
    row = sched.get_row("crm-sync-42")
    assert row is not None and row.enabled and row.next_run_at == change.fires_after[0]
    assert row.next_run_at > clock()
    paused = [d for d in sched.explain("crm-sync-42")["decisions"] if d["decision"] == "paused"]
    assert len(paused) == 3 and paused[0]["reason"] == "disabled_by_api"


def test_the_spec_is_checked_as_the_files_tasks_are_and_nothing_is_written(
    sched: Scheduler,
) -> None:
    for bad, says in (
        (crm(cron="61 * * * *"), "task 'crm-sync-42': key 'cron'"),
        (crm(timezone="Mars/Olympus"), "task 'crm-sync-42': key 'timezone'"),
        (crm(payload={"api_key": "x"}), "task 'crm-sync-42': key 'payload'"),
        (crm(tenant="no spaces"), "task 'crm-sync-42': key 'tenant'"),
        (crm(group="g" * 201), "task 'crm-sync-42': key 'group': longer than 200"),
        (crm(overlap="sometimes"), "task 'crm-sync-42': key 'overlap'"),
        (crm(name=" padded"), "key 'name'"),
    ):
        with pytest.raises(ConfigError, match=says):
            sched.put_task(bad)
    assert sched.rows(limit=None) == [] and audit_actions(sched) == []


def test_the_owners_never_cross(sched: Scheduler, tmp_path: Any) -> None:
    sched.sync([TaskSpec("nightly", "0 3 * * *", "reports.nightly")])
    sched.put_task(crm())
    with pytest.raises(SchedulerError, match="task 'nightly' is managed by the file"):
        sched.put_task(TaskSpec("nightly", "0 4 * * *", "reports.nightly"))
    with pytest.raises(SchedulerError, match="task 'nightly' is managed by the file"):
        sched.remove_task("nightly")
    # The file no longer has the task: its row is disabled; the app's row is not touched.
    plan = sched.sync([TaskSpec("other", "0 3 * * *", "reports.other")])
    assert plan.disable == ["nightly"] and "crm-sync-42" not in plan.as_dict()["unchanged"]
    row = sched.get_row("crm-sync-42")
    assert row is not None and row.enabled and row.source == "api"
    with pytest.raises(ConfigError, match="task 'crm-sync-42': key 'name': a task created at"):
        sched.sync([TaskSpec("crm-sync-42", "0 3 * * *", "reports.other")])
    with pytest.raises(ConfigError, match="task 'x': key 'group': only a task created at"):
        sched.sync([TaskSpec("x", "0 3 * * *", "h", group="g")])
    assert [r.name for r in sched.rows(source="file")] == ["nightly", "other"]


def test_remove_task_stops_the_row_cancels_its_queued_job_and_frees_the_name(
    sched: Scheduler, clock: ManualClock
) -> None:
    sched.put_task(crm(cron="* * * * *"))
    clock.advance(timedelta(minutes=1))
    report = sched.tick()
    assert report.dispatched == ["crm-sync-42"]
    [job] = sched.jobs(task="crm-sync-42")
    assert sched.remove_task("crm-sync-42", reason="customer left") is True
    assert sched.get_row("crm-sync-42") is None
    cancelled = sched.get_job(job.id)
    assert cancelled is not None and cancelled.state == "aborted"
    assert cancelled.last_error_code == "cancelled"
    clock.advance(timedelta(minutes=5))
    assert not sched.tick()  # nothing of it is due any more
    assert sched.remove_task("crm-sync-42") is False
    assert audit_actions(sched) == ["remove_task", "put_task"]
    again = sched.put_task(crm(cron="* * * * *"))  # the name is free: a new row
    assert again.action == "created" and again.row is not None
    assert again.row.consecutive_failures == 0 and again.row.last_job_id is None
    assert [j.id for j in sched.jobs(task="crm-sync-42")] == [job.id]  # its history stays


def test_a_tick_that_read_the_row_before_its_removal_dispatches_nothing(
    sched: Scheduler, clock: ManualClock
) -> None:
    from scheduler._model.decide import decide
    from scheduler._model.slots import next_slot
    from scheduler._store.due import due
    from scheduler._store.writers import Work, writer_for

    sched.put_task(crm(cron="* * * * *"))
    clock.advance(timedelta(minutes=1))
    now = clock()
    with sched.store.engine.connect() as conn:
        [stale] = due(sched.store, conn, now, 10, None)  # read before the removal
    assert sched.remove_task("crm-sync-42")
    decision = decide(stale, now, max_consecutive_failures=0, next_slot=next_slot)
    work = Work(now=now, job_defaults=lambda _h: (3, "default"), connections=-1)
    with sched.store.engine.connect() as conn:
        carried = writer_for(sched.store).carry_out(sched.store, conn, [(stale, decision)], work)
    [(outcome, _after)] = carried.done.values()
    # Its compare-and-swap finds no row (lost_race), or its SKIP LOCKED probe finds none to
    # lock (locked, on PostgreSQL): either way it wrote nothing.
    assert outcome in ("lost_race", "locked")
    assert sched.jobs() == []  # no job of it, nor any other


def test_put_tasks_with_replace_makes_a_groups_tasks_exactly_these(sched: Scheduler) -> None:
    sched.put_tasks([crm("a"), crm("b"), crm("c", group="customer-7")])
    plan = sched.put_tasks(
        [crm("b", payload={"customer": 1}), crm("d")], group="customer-42", replace=True
    )
    assert (plan.insert, plan.update, plan.unchanged, plan.remove) == (["d"], ["b"], [], ["a"])
    names = [r.name for r in sched.rows(group="customer-42")]
    assert names == ["b", "d"]
    assert [r.name for r in sched.rows(group="customer-7")] == ["c"]  # another group: kept
    with pytest.raises(ValueError, match="needs a group"):
        sched.put_tasks([crm("e")], replace=True)


def test_put_tasks_is_all_or_nothing(sched: Scheduler) -> None:
    with pytest.raises(ConfigError, match="task 'bad': key 'cron'"):
        sched.put_tasks([crm("good"), crm("bad", cron="nope")], group="customer-42")
    assert sched.rows(limit=None) == []
    with pytest.raises(ConfigError, match="key 'group': 'other', but put_tasks was given"):
        sched.put_tasks([crm("x", group="other")], group="customer-42")


def test_the_callers_transaction_decides(sched: Scheduler) -> None:
    with sched.store.engine.connect() as conn:
        with conn.begin() as outer:
            sched.put_task(crm(), connection=conn)
            outer.rollback()
    assert sched.get_row("crm-sync-42") is None and audit_actions(sched) == []
    with sched.store.engine.begin() as conn:
        sched.put_task(crm(), connection=conn)
    assert sched.get_row("crm-sync-42") is not None


def test_a_dry_run_writes_nothing_and_says_the_same(sched: Scheduler) -> None:
    sched.put_task(crm())
    dry = sched.put_task(crm(cron="30 6 * * 1-5"), dry_run=True)
    assert dry.action == "updated" and dry.changed == ("cron",)
    row = sched.get_row("crm-sync-42")
    assert row is not None and row.cron == "0 6 * * 1-5"
    real = sched.put_task(crm(cron="30 6 * * 1-5"))
    assert (real.action, real.changed, real.fires_before, real.fires_after) == (
        dry.action,
        dry.changed,
        dry.fires_before,
        dry.fires_after,
    )


def test_rows_filters_and_pages_by_name(sched: Scheduler) -> None:
    sched.sync([TaskSpec("file-task", "0 3 * * *", "h")])
    sched.put_tasks([crm(f"crm-{i:02}", tenant="acme", group=None) for i in range(5)], group="g1")
    sched.put_tasks([crm(f"mail-{i:02}", tenant="beta", group=None) for i in range(3)], group="g2")
    assert [r.name for r in sched.rows(source="api", limit=3)] == ["crm-00", "crm-01", "crm-02"]
    page = sched.rows(source="api", limit=3, after="crm-02")
    assert [r.name for r in page] == ["crm-03", "crm-04", "mail-00"]
    assert [r.name for r in sched.rows(tenant="beta")] == ["mail-00", "mail-01", "mail-02"]
    assert [r.name for r in sched.rows(prefix="mail-0", limit=2)] == ["mail-00", "mail-01"]
    assert [r.name for r in sched.rows(prefix="%")] == []  # a LIKE wildcard is a character
    assert [r.name for r in sched.rows(source="file")] == ["file-task"]
    assert len(sched.rows(limit=None)) == 9 and len(sched.rows(limit=None)) == 9
    with pytest.raises(ValueError, match="source 'web'"):
        sched.rows(source="web")


def test_a_changed_payload_is_one_read_of_the_row_before_its_write(sched: Scheduler) -> None:
    """The row's ``next_run_at`` (the change's fires before) comes with the locked read of
    the row, not in a read of its own: ``put_task`` of a changed payload reads the row once,
    writes it, reads it back for the returned change and writes the audit entry."""
    from sqlalchemy import event

    sched.put_task(crm())
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "scheduler_rows" in statement or "scheduler_audit" in statement:
            seen.append(statement.split(None, 1)[0].upper())

    event.listen(sched.store.engine, "before_cursor_execute", record)
    try:
        change = sched.put_task(crm(payload={"customer": 43}))
    finally:
        event.remove(sched.store.engine, "before_cursor_execute", record)
    assert change.action == "updated" and change.changed == ("payload",)
    assert change.fires_before == change.fires_after and len(change.fires_before) == 5
    assert seen == ["SELECT", "UPDATE", "SELECT", "INSERT"]
