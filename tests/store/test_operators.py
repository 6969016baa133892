"""Operators' Python API (SPEC §10) on SQLite, PostgreSQL and MariaDB: ``app.jobs``, the audit
log written in the transaction of each change, ``disable`` notes, and ``app.backfill``.

Each refusal is checked twice: the error, and that nothing changed (no job, no audit entry).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func, insert, select, text, update

from scheduler import JobStateError, PermanentError, Scheduler, SchedulerError, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store import audit as _audit
from scheduler._store.tables import audit, decisions, jobs, rows, runs
from scheduler.testing import ManualClock

T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)
DAILY = TaskSpec("nightly", "0 3 * * *", "works", {"v": 1}, "Europe/Berlin")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def ops(db_url: str, clock: ManualClock) -> Iterator[Scheduler]:
    app = Scheduler(db_url, registry=Registry(), clock=clock)

    @app.handler("fails", max_attempts=1)
    def fails(job: object) -> None:
        raise PermanentError("bad_input")

    @app.handler("works", queue="default")
    def works(job: object) -> None:
        return None

    yield app
    app.close()


def count(app: Scheduler, table: Any) -> int:
    with app.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


# -- app.jobs -------------------------------------------------------------------------------
def test_jobs_lists_newest_first_with_every_filter(ops: Scheduler) -> None:
    ops.sync([DAILY])
    ops.trigger("nightly")
    ops.tick()
    ids = [ops.enqueue("works", {"n": n}) for n in range(3)]
    other = ops.enqueue("fails", queue="slow")
    task_job = ops.get_row("nightly").last_job_id  # type: ignore[union-attr]
    assert [j.id for j in ops.jobs()] == [other, *reversed(ids), task_job]
    assert [j.id for j in ops.jobs(limit=2)] == [other, ids[2]]
    assert [j.id for j in ops.jobs(task="nightly")] == [task_job]
    assert [j.id for j in ops.jobs(handler="fails")] == [other]
    assert [j.id for j in ops.jobs(queue="slow")] == [other]
    ops.cancel_job(ids[0])
    assert [j.id for j in ops.jobs(state="aborted")] == [ids[0]]
    assert ops.jobs(state="aborted", handler="fails") == []
    with pytest.raises(ValueError, match="state 'dead': expected one of queued, claimed"):
        ops.jobs(state="dead")


# -- the audit log ----------------------------------------------------------------------------
def test_every_action_writes_one_entry_with_actor_and_reason(
    ops: Scheduler, clock: ManualClock
) -> None:
    ops.sync([DAILY], actor="deploy", reason="release 7")
    ops.disable("nightly", actor="ann", reason="database maintenance")
    row = ops.get_row("nightly")
    assert row is not None and not row.enabled and row.disabled_note == "database maintenance"
    (status_row,) = ops.status()["rows"]
    assert status_row["disabled_note"] == "database maintenance"
    assert status_row["disabled_reason"] == "manual"  # the existing key stays as it was
    clock.advance(minutes=1)
    assert ops.enable("nightly", actor="ann", reason="done")
    assert ops.get_row("nightly").disabled_note is None  # type: ignore[union-attr]
    assert ops.status()["rows"][0]["disabled_note"] is None
    ops.trigger("nightly", actor="bob")
    ops.tick()
    job_id = ops.get_row("nightly").last_job_id  # type: ignore[union-attr]
    assert job_id is not None
    ops.cancel_job(job_id, actor="bob", reason="not today")
    ops.retry_job(job_id, actor="bob", reason="today after all")
    ad_hoc = ops.enqueue("works")
    ops.cancel_job(ad_hoc, actor="cy")
    ops.backfill("nightly", T0 - timedelta(days=2), T0 - timedelta(days=1), actor="dee")
    entries = ops.audit()
    assert [(e.action, e.actor, e.target, e.reason) for e in entries] == [
        ("backfill", "dee", "nightly", None),
        ("cancel", "cy", f"job {ad_hoc}", None),
        ("retry", "bob", "nightly", "today after all"),
        ("cancel", "bob", "nightly", "not today"),
        ("trigger", "bob", "nightly", None),
        ("enable", "ann", "nightly", "done"),
        ("disable", "ann", "nightly", "database maintenance"),
        ("sync", "deploy", None, "release 7"),
    ]
    assert entries[2].detail == f"job {job_id}" and entries[1].detail == f"job {ad_hoc}"
    assert entries[-1].detail == "tasks: insert 1, update 0, disable 0"
    assert entries[5].at == T0 + timedelta(minutes=1)
    assert [e.action for e in ops.audit("nightly", limit=2)] == ["backfill", "retry"]
    assert [e.action for e in ops.audit(f"job {ad_hoc}")] == ["cancel"]


def test_no_op_and_dry_run_write_no_entry(ops: Scheduler, clock: ManualClock) -> None:
    ops.sync([DAILY])
    ops.sync([DAILY])  # unchanged
    ops.sync([DAILY, TaskSpec("b", "* * * * *", "works", {}, "UTC")], dry_run=True)
    assert ops.enable("nightly") is False  # already enabled
    ops.backfill("nightly", T0 - timedelta(hours=1), T0, dry_run=True)
    ops.backfill("nightly", T0 - timedelta(hours=5), T0)  # 03:00 Berlin is not in it: no slot
    assert [e.action for e in ops.audit()] == ["sync"]


def test_refused_actions_change_nothing_and_write_no_entry(ops: Scheduler) -> None:
    ops.sync([DAILY])
    ops.disable("nightly")
    before = count(ops, audit)
    queued = ops.enqueue("works")
    with pytest.raises(SchedulerError, match="task 'nightly' is disabled"):
        ops.trigger("nightly", reason="x")
    with pytest.raises(SchedulerError, match="no task named 'ghost'"):
        ops.disable("ghost", reason="x")
    with pytest.raises(JobStateError, match=f"job {queued} is queued: only an aborted job"):
        ops.retry_job(queued, reason="x")
    with pytest.raises(JobStateError, match="no job 999999"):
        ops.cancel_job(999999, reason="x")
    with pytest.raises(ValueError, match="reason is 501 characters, over the 500-character"):
        ops.cancel_job(queued, reason="r" * 501)
    with pytest.raises(ValueError, match="actor is 201 characters"):
        ops.enable("nightly", actor="a" * 201)
    assert count(ops, audit) == before
    assert ops.get_job(queued).state == "queued"  # type: ignore[union-attr]
    assert not ops.get_row("nightly").enabled  # type: ignore[union-attr]


def test_the_entry_is_in_the_transaction_of_the_change(ops: Scheduler) -> None:
    """With the audit table gone, the change fails too: they commit together or not at all."""
    ops.sync([DAILY])
    job_id = ops.enqueue("works")
    with ops.store.begin() as conn:
        conn.execute(text("ALTER TABLE scheduler_audit RENAME TO scheduler_audit_away"))
    try:
        with pytest.raises(Exception, match="scheduler_audit"):
            ops.disable("nightly", reason="x")
        with pytest.raises(Exception, match="scheduler_audit"):
            ops.cancel_job(job_id)
    finally:
        with ops.store.begin() as conn:
            conn.execute(text("ALTER TABLE scheduler_audit_away RENAME TO scheduler_audit"))
    row = ops.get_row("nightly")
    assert row is not None and row.enabled and row.disabled_note is None
    assert ops.get_job(job_id).state == "queued"  # type: ignore[union-attr]


@pytest.mark.parametrize("days", [365.0, 0.0])
def test_the_audit_log_is_purged_after_its_retention_or_kept_for_ever(
    ops: Scheduler, clock: ManualClock, days: float
) -> None:
    """``[worker] purge_audit_after_days``: 365 by default; 0 keeps every entry."""
    assert ops.worker_settings.purge_audit_after_days == 365.0
    ops.worker_settings = dataclasses.replace(ops.worker_settings, purge_audit_after_days=days)
    ops.sync([DAILY], reason="first")
    clock.advance(days=200)
    ops.disable("nightly", reason="second")
    clock.advance(days=165, seconds=1)  # the first is 365 days and a second old
    ops.purge()
    kept = [e.reason for e in ops.audit()]
    assert kept == (["second"] if days else ["second", "first"])
    clock.advance(days=200)
    ops.purge()
    assert [e.reason for e in ops.audit()] == ([] if days else ["second", "first"])


def test_the_actor_defaults_to_the_environment_then_user_at_host(
    ops: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDULER_ACTOR", "ci-pipeline")
    ops.sync([DAILY])
    monkeypatch.delenv("SCHEDULER_ACTOR")
    monkeypatch.setenv("LOGNAME", "carol")
    monkeypatch.setenv("USER", "carol")
    ops.trigger("nightly")
    found = [e.actor for e in ops.audit()]
    assert found[1] == "ci-pipeline"
    assert found[0].startswith("carol@") and found[0] == _audit.default_actor()


# -- backfill ---------------------------------------------------------------------------------
def slots_of(app: Scheduler, name: str) -> list[datetime]:
    with app.store.read() as conn:
        found = conn.execute(
            select(jobs.c.slot).where(jobs.c.task_name == name).order_by(jobs.c.slot)
        ).scalars()
        return list(found)


def test_backfill_enqueues_one_job_per_slot_with_a_decision_each(
    ops: Scheduler, clock: ManualClock
) -> None:
    ops.sync([DAILY])
    row = ops.get_row("nightly")
    result = ops.backfill("nightly", datetime(2030, 1, 1), datetime(2030, 1, 4))  # Berlin
    want = [datetime(2030, 1, d, 2, 0, tzinfo=UTC) for d in (1, 2, 3)]  # 03:00 CET
    assert result.slots == want and result.taken == [] and list(result.enqueued) == want
    assert slots_of(ops, "nightly") == want
    for slot, job_id in result.enqueued.items():
        job = ops.get_job(job_id)
        assert job is not None and (job.state, job.handler, job.payload, job.slot) == (
            "queued",
            "works",
            {"v": 1},
            slot,
        )
        assert job.task_name == "nightly" and job.run_at == clock.now
    with ops.store.read() as conn:
        logged = conn.execute(
            select(decisions.c.slot, decisions.c.decision, decisions.c.job_id).order_by(
                decisions.c.id
            )
        ).all()
    assert [tuple(r) for r in logged] == [(s, "backfilled", i) for s, i in result.enqueued.items()]
    after = ops.get_row("nightly")  # the row's bookkeeping is untouched
    assert after is not None and before_after(row) == before_after(after)


def before_after(row: Any) -> tuple[Any, ...]:
    return (row.last_job_id, row.consecutive_failures, row.next_run_at, row.enabled)


def test_backfill_twice_enqueues_nothing_twice(ops: Scheduler) -> None:
    ops.sync([DAILY])
    first = ops.backfill("nightly", datetime(2030, 1, 1), datetime(2030, 1, 3))
    wider = ops.backfill("nightly", datetime(2029, 12, 31), datetime(2030, 1, 4))
    assert len(first.enqueued) == 2 and wider.taken == first.slots
    assert list(wider.enqueued) == [wider.slots[0], wider.slots[-1]]
    again = ops.backfill("nightly", datetime(2029, 12, 31), datetime(2030, 1, 4))
    assert again.enqueued == {} and again.taken == again.slots
    assert count(ops, jobs) == 4


def test_backfill_skips_slots_a_job_or_a_past_attempt_stands_for(ops: Scheduler) -> None:
    """The tick's jobs carry their slot; a rerun in place moves the job to a new slot, and its
    run history keeps the old one."""
    ops.sync([DAILY])
    s1, s2, s3 = (datetime(2030, 1, d, 2, 0, tzinfo=UTC) for d in (1, 2, 3))
    dispatched = ops.enqueue("works")
    rerun = ops.enqueue("works")
    with ops.store.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.id == dispatched).values(task_name="nightly", slot=s1)
        )
        conn.execute(update(jobs).where(jobs.c.id == rerun).values(task_name="nightly", slot=s3))
        conn.execute(
            insert(runs).values(job_id=rerun, attempt=1, finished_at=T0, outcome="aborted", slot=s2)
        )
    result = ops.backfill("nightly", datetime(2030, 1, 1), datetime(2030, 1, 5))
    assert result.taken == [s1, s2, s3] and list(result.enqueued) == [result.slots[-1]]


def test_backfill_follows_the_tasks_dst_rules(ops: Scheduler) -> None:
    """Europe/Berlin: 02:30 daily fires once on the fall-back date and at 03:00 (the first
    instant after the gap) on the spring-forward date; every 30 minutes follows real time."""
    ops.sync(
        [
            TaskSpec("fixed", "30 2 * * *", "works", {}, "Europe/Berlin"),
            TaskSpec("often", "*/30 * * * *", "works", {}, "Europe/Berlin"),
        ]
    )
    fall = ops.backfill("fixed", datetime(2029, 10, 27, 12), datetime(2029, 10, 29), dry_run=True)
    assert fall.slots == [datetime(2029, 10, 28, 0, 30, tzinfo=UTC)]  # 02:30 CEST, once
    spring = ops.backfill("fixed", datetime(2029, 3, 25), datetime(2029, 3, 26), dry_run=True)
    assert spring.slots == [datetime(2029, 3, 25, 1, 0, tzinfo=UTC)]  # 03:00 CEST
    repeated = ops.backfill(
        "often",
        datetime(2029, 10, 28, 0, 0, tzinfo=UTC),
        datetime(2029, 10, 28, 2, 0, tzinfo=UTC),
        dry_run=True,
    )
    berlin = ZoneInfo("Europe/Berlin")
    local = [(s.astimezone(berlin).hour, s.astimezone(berlin).minute) for s in repeated.slots]
    assert local == [(2, 0), (2, 30), (2, 0), (2, 30)]  # both 02:00-03:00 hours: real time
    assert count(ops, jobs) == 0  # dry runs wrote nothing


def test_backfill_refusals_say_why_and_write_nothing(ops: Scheduler, clock: ManualClock) -> None:
    ops.sync([TaskSpec("minutely", "* * * * *", "works", {}, "UTC")])
    start = T0 - timedelta(days=1)
    with pytest.raises(SchedulerError, match=r"more than 1,000 slots .* \(--max 1000\)"):
        ops.backfill("minutely", start, T0)
    with pytest.raises(SchedulerError, match=r"more than 10 slots"):
        ops.backfill("minutely", T0 - timedelta(minutes=11), T0, max_slots=10)
    assert len(ops.backfill("minutely", T0 - timedelta(minutes=10), T0, max_slots=10).slots) == 10
    with pytest.raises(SchedulerError, match="is not before --to"):
        ops.backfill("minutely", T0, T0 - timedelta(hours=1))
    with pytest.raises(SchedulerError, match="is in the future"):
        ops.backfill("minutely", T0 - timedelta(minutes=1), T0 + timedelta(minutes=1))
    with pytest.raises(SchedulerError, match="no task named 'ghost'"):
        ops.backfill("ghost", start, T0)
    assert count(ops, jobs) == 10 and count(ops, audit) == 2  # sync, the one backfill
    assert count(ops, decisions) == 10


def test_a_failed_backfilled_job_leaves_the_row_alone_and_can_be_retried(
    ops: Scheduler, clock: ManualClock
) -> None:
    ops.sync([TaskSpec("t", "0 3 * * *", "fails", {}, "UTC", max_consecutive_failures=1)])
    result = ops.backfill("t", T0 - timedelta(days=2), T0)
    assert len(result.enqueued) == 2
    assert ops.work() == 2  # both abort (bad_input)
    row = ops.get_row("t")
    assert row is not None and row.enabled and row.consecutive_failures == 0
    assert row.last_job_id is None
    ops.trigger("t")
    assert ops.tick().dispatched == ["t"]  # not disabled, not rerun: a fresh job
    job_id = next(iter(result.enqueued.values()))
    job = ops.retry_job(job_id, reason="fixed upstream")
    assert (job.state, job.attempts, job.slot) == ("queued", 0, next(iter(result.enqueued)))
    assert ops.get_row("t").last_job_id != job_id  # type: ignore[union-attr]


def _backfill_in_a_process(url: str, barrier: Any, queue: Any) -> None:
    app = Scheduler(url, registry=Registry(), clock=ManualClock(T0))
    barrier.wait()
    result = app.backfill("nightly", T0 - timedelta(days=30), T0)
    queue.put(len(result.enqueued))
    app.close()


def test_two_processes_backfilling_at_once_enqueue_each_slot_once(
    ops: Scheduler, db_url: str
) -> None:
    ops.sync([DAILY])
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=_backfill_in_a_process, args=(db_url, barrier, queue)) for _ in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    made = sorted(queue.get(timeout=5) for _ in procs)
    assert sum(made) == 30, made
    found = slots_of(ops, "nightly")
    assert len(found) == 30 == len(set(found))
    with ops.store.read() as conn:
        version = conn.execute(select(rows.c.version).where(rows.c.name == "nightly")).scalar()
    assert version is not None and version >= 2


# -- the plan of `jobs --task NAME --limit 50` ----------------------------------------------------
def _plan(app: Scheduler, statement: Any) -> str:
    sql = str(statement.compile(app.store.engine, compile_kwargs={"literal_binds": True}))
    dialect = app.store.engine.dialect.name
    prefix = "EXPLAIN QUERY PLAN " if dialect == "sqlite" else "EXPLAIN "
    with app.store.read() as conn:
        found = conn.execute(text(prefix + sql))
        if dialect in ("mysql", "mariadb"):  # one row per table: type, key, Extra matter
            return "\n".join(f"{r.type} {r.key} {r.Extra}" for r in found)
        return "\n".join(str(r[-1]) for r in found)


def test_jobs_of_a_task_read_the_task_index_not_the_table(db_url: str) -> None:
    """20,000 jobs of 100 tasks, the statistics gathered: the newest 50 of one task are a
    backwards range of ``ix_scheduler_jobs_task``, with no scan and no sort."""
    from scheduler._store.jobs import list_statement

    app = Scheduler(db_url, registry=Registry(), clock=ManualClock(T0))
    values = [
        {
            "handler": "h",
            "payload": "{}",
            "queue": "default",
            "priority": 0,
            "run_at": T0,
            "state": "succeeded",
            "attempts": 1,
            "max_attempts": 3,
            "task_name": f"task-{i % 100}",
            "created_at": T0,
        }
        for i in range(20_000)
    ]
    with app.store.begin() as conn:
        conn.execute(insert(jobs), values)
    dialect = app.store.engine.dialect.name
    analyze = "ANALYZE TABLE scheduler_jobs" if dialect in ("mysql", "mariadb") else "ANALYZE"
    with app.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(analyze))
    plan = _plan(app, list_statement(task="task-7", limit=50))
    if dialect == "sqlite":
        assert "SEARCH scheduler_jobs USING INDEX ix_scheduler_jobs_task (task_name=?)" in plan
        assert "TEMP B-TREE" not in plan, plan
    elif dialect in ("mysql", "mariadb"):
        assert plan.startswith("ref ix_scheduler_jobs_task"), plan
        assert "filesort" not in plan, plan
    else:
        assert "Index Scan Backward using ix_scheduler_jobs_task" in plan, plan
        assert "Seq Scan" not in plan and "Sort" not in plan, plan
    assert [j.task_name for j in app.jobs(task="task-7")] == ["task-7"] * 50
    app.close()


def test_two_retries_at_once_requeue_once_and_audit_once(
    ops: Scheduler, db_url: str, clock: ManualClock
) -> None:
    """Two operators retry one dead job at once, each on its own connection: one wins and
    writes the one entry; the other is refused and writes none."""
    import threading

    job_id = ops.enqueue("fails")
    assert ops.work() == 1 and ops.get_job(job_id).state == "aborted"  # type: ignore[union-attr]
    other = Scheduler(db_url, registry=Registry(), clock=clock)
    barrier = threading.Barrier(2)
    outcomes: list[object] = []

    def retry(app: Scheduler, who: str) -> None:
        barrier.wait()
        try:
            outcomes.append(app.retry_job(job_id, actor=who))
        except JobStateError as exc:
            outcomes.append(exc)

    threads = [
        threading.Thread(target=retry, args=(ops, "ann")),
        threading.Thread(target=retry, args=(other, "bob")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.close()
    refused = [o for o in outcomes if isinstance(o, JobStateError)]
    assert len(refused) == 1, outcomes
    assert "only an aborted job" in str(refused[0]) or "changed meanwhile" in str(refused[0])
    (entry,) = ops.audit()
    assert entry.action == "retry" and entry.actor in ("ann", "bob")
    assert ops.get_job(job_id).state == "queued"  # type: ignore[union-attr]
