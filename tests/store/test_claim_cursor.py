"""Claims that go on from a cursor while sweeping from the front is slow (a held MVCC horizon):
when they start and stop, what a sweep still finds, and what a held horizon does to
a claim's reads (PostgreSQL, real transactions held open)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, insert, text

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._model.job import Job
from scheduler._store import cursor as _cursor
from scheduler._store import jobs as _jobs
from scheduler._store.status import horizon as _horizon
from scheduler._store.tables import jobs

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Clock:
    """A monotonic clock the test moves: each reading is `step` seconds after the last."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def job(i: int, priority: int = 0) -> Job:
    return Job(
        id=i,
        handler="h",
        state="claimed",
        attempts=1,
        max_attempts=3,
        run_at=T0 + timedelta(seconds=i),
        last_error_code=None,
        payload={},
        queue="default",
        priority=priority,
        task_name=None,
        dedupe_key=None,
        lease_owner="w",
        lease_expires_at=None,
        created_at=T0,
        finished_at=None,
    )


def test_the_cursor_starts_after_slow_sweeps_and_ends_with_a_fast_one() -> None:
    seen: list[Any] = []
    clock = Clock(step=_cursor.SLOW_SECONDS * 2)  # every claim looks slow
    cursor = _cursor.ClaimCursor(enabled=True, clock=clock)
    n = iter(range(1, 1000))

    def run(after: Any) -> list[Job]:
        seen.append(after)
        return [job(next(n))]

    for _ in range(_cursor.SLOW_SWEEPS):
        cursor.claim((), False, run)
    assert seen == [None] * _cursor.SLOW_SWEEPS and cursor.active
    cursor.claim((), False, run)  # from where the last claim left off
    assert seen[-1] == (0, T0 + timedelta(seconds=3), 3)
    clock.now += _cursor.SWEEP_SECONDS  # a sweep is due: from the front again
    clock.step = 0.0  # and it is fast: the cursor ends
    cursor.claim((), False, run)
    assert seen[-1] is None and not cursor.active
    cursor.claim((), False, run)
    assert seen[-1] is None


def test_while_the_cursor_is_on_expired_leases_are_looked_for_once_a_second() -> None:
    clock = Clock(step=_cursor.SLOW_SECONDS * 2)
    cursor = _cursor.ClaimCursor(enabled=True, clock=clock)
    assert cursor.expired_due() and cursor.expired_due()  # normally: every time
    for i in range(_cursor.SLOW_SWEEPS):
        cursor.claim((), False, lambda after, i=i: [job(i + 1)])
    assert cursor.active
    clock.now += _cursor.SWEEP_SECONDS
    assert cursor.expired_due() and not cursor.expired_due()
    clock.now += _cursor.SWEEP_SECONDS
    assert cursor.expired_due()


def test_each_kind_of_claim_has_its_own_cursor() -> None:
    """The async handlers' claim and the others' see different jobs: one's cursor would pass
    over the other's jobs."""
    seen: list[Any] = []
    cursor = _cursor.ClaimCursor(enabled=True, clock=Clock(step=_cursor.SLOW_SECONDS * 2))
    for i in range(_cursor.SLOW_SWEEPS + 1):
        cursor.claim(("a",), False, lambda after, i=i: seen.append(after) or [job(100 + i)])
    assert seen[-1] is not None and seen[-1][2] == 100 + _cursor.SLOW_SWEEPS - 1
    assert seen[-1][0] == 0
    cursor.claim(("a",), True, lambda after: seen.append(after) or [])
    assert seen[-1] is None  # the other kind sweeps: it has no cursor of its own yet


def test_disabled_it_always_sweeps() -> None:
    seen: list[Any] = []
    cursor = _cursor.ClaimCursor(enabled=False, clock=Clock(step=1.0))
    for i in range(10):
        cursor.claim((), False, lambda after, i=i: seen.append(after) or [job(i + 1)])
    assert seen == [None] * 10 and not cursor.active


def slow_runner(runner: Any) -> Clock:
    """Make `runner` believe every sweep is slow (its cursor's clock)."""
    clock = Clock(step=_cursor.SLOW_SECONDS * 2)
    runner.cursor.clock = clock
    return clock


def test_a_job_behind_the_cursor_is_claimed_by_the_next_sweep(pg_url: str) -> None:
    """From the cursor, a higher-priority job enqueued behind it is passed over; the next
    sweep (at most SWEEP_SECONDS later) claims it first. Every job is claimed once."""
    app = Scheduler(pg_url, registry=Registry())
    try:
        app.migrate()
        runner = app.runner()
        assert runner.cursor.enabled
        clock = Clock(step=_cursor.SLOW_SECONDS * 2)
        runner.cursor.clock = clock
        ids = [app.enqueue("h", {"n": i}) for i in range(10)]
        claimed = [j.id for _ in range(_cursor.SLOW_SWEEPS) for j in runner.claim(1)]
        assert claimed == ids[:3] and runner.cursor.active
        urgent = app.enqueue("h", {"urgent": True}, priority=-1)
        claimed += [j.id for j in runner.claim(1)]  # from the cursor: the next in line
        assert claimed[-1] == ids[3]
        clock.now += _cursor.SWEEP_SECONDS
        swept = runner.claim(2)
        assert [j.id for j in swept] == [urgent, ids[4]]
        claimed += [j.id for j in swept]
        while found := runner.claim(5):
            claimed += [j.id for j in found]
            clock.now += _cursor.SWEEP_SECONDS
        assert sorted(claimed) == sorted([*ids, urgent])  # each once
    finally:
        app.close()


def test_a_multi_queue_runner_never_uses_a_cursor(pg_url: str) -> None:
    app = Scheduler(pg_url, registry=Registry(), queues=("a", "b"))
    try:
        assert not app.runner().cursor.enabled
    finally:
        app.close()


def test_other_engines_never_use_a_cursor(db_url: str) -> None:
    app = Scheduler(db_url, registry=Registry())
    try:
        assert app.runner().cursor.enabled == (app.store.caps.dialect == "postgresql")
    finally:
        app.close()


# -- a held horizon, for real --------------------------------------------------------------------
def _claim_reads(app: Scheduler, after: _jobs.ClaimKey | None) -> int:
    """Shared buffers one claim of 10 reads (EXPLAIN ANALYZE, rolled back: nothing claimed)."""
    statement = _jobs._claim_statements(True, True, None, after is not None)[0]
    params: dict[str, Any] = {
        "p_now": datetime.now(UTC),
        "p_queues": ["default"],
        "p_limit": 10,
        "p_owner": "probe",
        "p_until": datetime.now(UTC) + timedelta(minutes=1),
    }
    if after is not None:
        params.update(p_after_priority=after[0], p_after_at=after[1], p_after_id=after[2])
    with app.store.engine.connect() as conn:
        compiled = statement.compile(dialect=conn.dialect)
        expanded = compiled.construct_expanded_state(params)
        values = {
            k: (v.replace(tzinfo=None) if isinstance(v, datetime) else v)
            for k, v in expanded.parameters.items()
        }
        sql = f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {expanded.statement}"
        [[found]] = conn.exec_driver_sql(sql, values).all()
        conn.rollback()
    plan = (json.loads(found) if isinstance(found, str) else found)[0]

    def hits(node: dict[str, Any]) -> int:
        return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))

    return hits(plan["Plan"])


@pytest.fixture
def held(pg_url: str) -> Iterator[Any]:
    """A REPEATABLE READ transaction with its snapshot taken, idle on the test's database:
    the MVCC horizon pinned until the test ends."""
    engine = create_engine(pg_url, connect_args={"application_name": f"held-{os.getpid()}"})
    conn = engine.connect().execution_options(isolation_level="REPEATABLE READ")
    conn.execute(text("SELECT count(*) FROM scheduler_jobs"))
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()
        engine.dispose()


HOLD_SECONDS = 30.0


def _insert_and_work(app: Scheduler, runner: Any, count: int) -> int:
    """``count`` jobs of handler ``h`` inserted in one transaction, then claimed 25 at a time
    and run until none is left; the number run."""
    with app.store.begin() as conn:
        now = datetime.now(UTC)
        conn.execute(
            insert(jobs),
            [_jobs.new_job_values(handler="h", payload="{}", now=now) for _ in range(count)],
        )
    done = 0
    while claimed := runner.claim(25):
        runner.record([runner.execute(j) for j in claimed])
        done += len(claimed)
    return done


@pytest.mark.slow
@pytest.mark.direct
def test_under_a_held_horizon_the_dead_rows_stay_and_the_cursor_claim_skips_them(
    pg_url: str, held: Any
) -> None:
    """30 s of a queue at work beside a pinned horizon: its dead row versions are not vacuumed
    (the dead-tuple count holds at least two per job done: the claim's and the outcome's), a
    claim from the front reads every one of them, and a claim from the cursor reads about as
    much as with none."""
    app = Scheduler(pg_url, registry=Registry())
    app.registry.handler("h", retry_safe=True)(lambda job: None)
    try:
        runner = app.runner()
        slow_runner(runner)
        done = 0
        began = time.monotonic()
        while time.monotonic() - began < HOLD_SECONDS:
            done += _insert_and_work(app, runner, 50)
        assert runner.cursor.active  # the runner went on from its cursor
        deadline = time.monotonic() + 30  # backends report their counts within seconds
        while True:
            with app.store.read() as conn:
                dead = _horizon.dead_tuples(conn)["scheduler_jobs"]
            if dead >= 2 * done or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert dead >= 2 * done, (dead, done)
        with app.store.read() as conn:
            [key] = conn.execute(
                text("SELECT priority, run_at, id FROM scheduler_jobs ORDER BY id DESC LIMIT 1")
            ).all()
        after = (key[0], key[1].replace(tzinfo=UTC), key[2])
        # The planner's statistics, as autovacuum's ANALYZE keeps them (a held horizon stops
        # its VACUUM, not its ANALYZE). With them, PostgreSQL took the ready index for the
        # UPDATE's side of the claim's join and walked every dead entry (now unindexable).
        with app.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE scheduler_jobs"))
        swept, from_cursor = _claim_reads(app, None), _claim_reads(app, after)
        assert from_cursor < 50, from_cursor
        assert swept > 20 * from_cursor, (swept, from_cursor)  # the dead entries, walked
    finally:
        app.close()


def _plan(app: Scheduler, statement: Any, params: dict[str, Any]) -> dict[str, Any]:
    with app.store.engine.connect() as conn:
        expanded = statement.compile(dialect=conn.dialect).construct_expanded_state(params)
        values = {
            k: (v.replace(tzinfo=None) if isinstance(v, datetime) else v)
            for k, v in expanded.parameters.items()
        }
        sql = f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {expanded.statement}"
        [[found]] = conn.exec_driver_sql(sql, values).all()
        conn.rollback()
    return dict((json.loads(found) if isinstance(found, str) else found)[0]["Plan"])


def _indexes(node: dict[str, Any]) -> set[str]:
    """The indexes a plan node and the nodes under it read."""
    found = {node["Index Name"]} if "Index Name" in node else set()
    for child in node.get("Plans", ()):
        found |= _indexes(child)
    return found


def test_outcomes_and_heartbeats_go_by_the_primary_key_past_held_claims(
    pg_url: str, held: Any
) -> None:
    """1,000 jobs claimed and finished behind a held horizon leave 1,000 dead entries in the
    lease index's unexpired range; the outcome and the heartbeat of 4 jobs read them by id
    (PostgreSQL chose the lease index for them, and walked every entry)."""
    app = Scheduler(pg_url, registry=Registry())
    app.registry.handler("h", retry_safe=True)(lambda job: None)
    try:
        runner = app.runner()
        for _ in range(10):
            _insert_and_work(app, runner, 100)
        with app.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE scheduler_jobs"))
        for _ in range(4):
            app.enqueue("h", {})
        ids = [j.id for j in runner.claim(4)]
        assert len(ids) == 4
        now = datetime.now(UTC)
        guard = {"p_ids": ids, "p_owner": runner.owner, "p_now": now}
        for statement, params in (
            (_jobs._SUCCEED_MANY, guard),
            (_jobs._EXTEND, {**guard, "p_until": now + timedelta(minutes=1)}),
        ):
            plan = _plan(app, statement, params)
            [scan] = plan["Plans"]
            # An Index Scan of the key, or a Bitmap Heap Scan over a Bitmap Index Scan of it
            # (the planner's choice for a few ids); either way no other index is read.
            assert _indexes(scan) == {"scheduler_jobs_pkey"}, scan
            # The buffers of a node count its children's.
            assert scan["Shared Hit Blocks"] + scan.get("Shared Read Blocks", 0) < 50, scan
    finally:
        app.close()
