"""History that drops instead of deleting (PostgreSQL, revision 0015, ``_store/partitions.py``):
the run history and the decision log in day partitions that the housekeeping creates ahead and
drops past retention, with the retention the ``DELETE`` purge had; SQLite and MariaDB unchanged.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from conftest import PG_SERVER, PG_URL, require_server
from helpers.queue_worker import Clock
from helpers.worker_thread import Running, wait_until
from sqlalchemy import create_engine, func, insert, inspect, select, text

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store import partitions as _partitions
from scheduler._store.migrate import downgrade, upgrade
from scheduler._store.tables import decisions, jobs, runs

D0 = datetime(2031, 3, 10, 12, 0, tzinfo=UTC)
DAY0 = D0.date()
_names = itertools.count()


def part_days(app: Scheduler, table: str = runs.name) -> set[date]:
    with app.store.begin() as conn:
        return set(_partitions.days(conn, table))


def ahead(day: date) -> set[date]:
    return {day + timedelta(days=n) for n in range(_partitions.DAYS_AHEAD + 1)}


def where_runs_are(app: Scheduler, job_id: int) -> set[str]:
    with app.store.read() as conn:
        found = conn.execute(
            text("SELECT DISTINCT tableoid::regclass::text FROM scheduler_runs WHERE job_id = :j"),
            {"j": job_id},
        )
        return {str(name).rsplit(".", 1)[-1] for name in found.scalars()}


def orphan_runs(app: Scheduler) -> int:
    with app.store.read() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(runs)
                .where(runs.c.job_id.not_in(select(jobs.c.id)))
            ).scalar_one()
        )


@pytest.fixture
def make_app(pg_url: str) -> Iterator[Callable[..., Scheduler]]:
    made: list[Scheduler] = []

    def make(clock: Clock, **kw: Any) -> Scheduler:
        app = Scheduler(pg_url, registry=Registry(), clock=clock, **kw)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


# -- the migration ----------------------------------------------------------------------------
def _admin(ddl: str) -> None:
    engine = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(ddl))
    finally:
        engine.dispose()


@pytest.fixture
def own_schema_url() -> Iterator[str]:
    """An empty PostgreSQL schema of this test's own (it migrates up and down)."""
    require_server(PG_URL, "PostgreSQL")
    name = f"sched_part_{os.getpid()}_{next(_names)}"
    _admin(f"CREATE SCHEMA {name}")
    try:
        yield f"{PG_SERVER}?options=-csearch_path%3D{name}"
    finally:
        _admin(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def _everything(app: Scheduler) -> tuple[list[Any], list[Any]]:
    with app.store.read() as conn:
        return (
            [tuple(r) for r in conn.execute(select(runs).order_by(runs.c.id))],
            [tuple(r) for r in conn.execute(select(decisions).order_by(decisions.c.id))],
        )


def test_the_migration_keeps_every_run_and_decision_and_goes_back(own_schema_url: str) -> None:
    app = Scheduler(own_schema_url, registry=Registry())
    try:
        upgrade(app.store, "0014")
        now = datetime.now(UTC).replace(microsecond=0)
        first = now - timedelta(days=40)
        step = timedelta(days=45) / 3000  # 40 days back to 5 days ahead (a skewed clock)
        with app.store.begin() as conn:
            conn.execute(
                insert(runs),
                [
                    {
                        "job_id": 1 + n % 70,
                        "attempt": 1 + n % 3,
                        "started_at": first + step * n - timedelta(seconds=1),
                        "finished_at": first + step * n,
                        "outcome": ("succeeded", "failed", "aborted")[n % 3],
                        "error_code": None if n % 3 == 0 else "E",
                        "worker": f"w{n % 4}",
                        "slot": first + step * n if n % 2 else None,
                        "error_message": "boom" if n % 3 else None,
                    }
                    for n in range(3000)
                ],
            )
            conn.execute(
                insert(decisions),
                [
                    {
                        "task_name": f"t{n % 9}",
                        "slot": first + step * n,
                        "decided_at": first + step * n,
                        "decision": "dispatched",
                        "job_id": n,
                        "reason": None,
                        "detail": "d" * (n % 7),
                    }
                    for n in range(3000)
                ],
            )
        before = _everything(app)
        with app.store.begin() as conn:
            assert not _partitions.partitioned(conn, runs.name)

        app.migrate()

        assert _everything(app) == before
        with app.store.begin() as conn:
            for table, key in _partitions.PARTITIONED.items():
                assert _partitions.partitioned(conn, table)
                # Every row in the partition of its day; none in the default partition.
                wrong = conn.execute(
                    text(
                        f"SELECT count(*) FROM {table} WHERE tableoid::regclass::text"
                        f" <> '{table}_p' || to_char({key}, 'YYYYMMDD')"
                    )
                ).scalar_one()
                assert wrong == 0
                had = set(conn.execute(text(f"SELECT DISTINCT CAST({key} AS date) FROM {table}")))
                assert {d for (d,) in had} | ahead(now.date()) == set(_partitions.days(conn, table))
            # The id sequence goes on after the copied rows.
            new_id = conn.execute(
                insert(runs).returning(runs.c.id),
                {"job_id": 1, "attempt": 1, "finished_at": now, "outcome": "succeeded"},
            ).scalar_one()
        assert new_id == 3001
        after = _everything(app)

        downgrade(app.store, "0014")
        assert _everything(app) == after
        with app.store.begin() as conn:
            assert not _partitions.partitioned(conn, runs.name)
            assert not _partitions.partitioned(conn, decisions.name)
            assert _partitions.days(conn, runs.name) == {}
        app.migrate()
        assert _everything(app) == after
    finally:
        app.close()


# -- ahead, and dropped past retention --------------------------------------------------------
def test_the_housekeeping_creates_partitions_ahead(
    make_app: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(Clock(D0))
    assert DAY0 not in part_days(app)
    caplog.set_level(logging.INFO, logger="scheduler")
    app.purge()
    (said,) = [r for r in caplog.records if r.getMessage().startswith("partitions:")]
    assert _partitions.day_name(runs.name, DAY0) in said.partitions_created
    for table in _partitions.PARTITIONED:
        assert ahead(DAY0) <= part_days(app, table)
    again = _partitions.create_ahead(app.store, DAY0)
    assert again.created == [] and again.skipped == []
    # A run of that day lands in its partition, not the default one.
    with app.store.begin() as conn:
        conn.execute(
            insert(runs), {"job_id": 7, "attempt": 1, "finished_at": D0, "outcome": "succeeded"}
        )
    assert where_runs_are(app, 7) == {_partitions.day_name(runs.name, DAY0)}


def test_a_day_the_default_partition_holds_is_skipped(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(Clock(D0))
    with app.store.begin() as conn:  # no partition for DAY0 yet: to the default partition
        conn.execute(
            insert(runs), {"job_id": 7, "attempt": 1, "finished_at": D0, "outcome": "succeeded"}
        )
    done = _partitions.create_ahead(app.store, DAY0)
    assert done.skipped == [_partitions.day_name(runs.name, DAY0)]
    assert DAY0 not in part_days(app) and DAY0 + timedelta(days=1) in part_days(app)
    assert where_runs_are(app, 7) == {_partitions.default_name(runs.name)}


def _finished(app: Scheduler, handler: str) -> int:
    job_id = app.enqueue(handler)
    assert app.work() == 1
    return job_id


def test_the_purge_drops_old_partitions_and_keeps_what_the_delete_kept(
    make_app: Callable[..., Scheduler],
) -> None:
    clock = Clock(D0)
    app = make_app(clock)

    @app.handler("ok")
    def ok(job: Any) -> None:
        pass

    app.purge()  # DAY0's partitions and the next days'
    old_ok = _finished(app, "ok")
    old_aborted = _finished(app, "missing")  # no handler: aborted, kept 30 days
    app.sync([TaskSpec(name="nightly", cron="0 3 * * *", handler="ok", payload={}, timezone="UTC")])
    app.trigger("nightly")
    assert app.tick().dispatched == ["nightly"]
    assert app.work() == 1
    row = app.get_row("nightly")
    assert row is not None and row.last_job_state == "succeeded"
    pinned = row.last_job_id
    assert pinned is not None
    decided = [d for d in app.explain("nightly")["decisions"]]
    assert decided
    clock.now = D0 + timedelta(days=2)
    young_ok = _finished(app, "ok")
    kept = (old_aborted, pinned, young_ok)
    histories = {job_id: app.history(job_id) for job_id in kept}
    day0 = _partitions.day_name(runs.name, DAY0)
    assert where_runs_are(app, old_ok) == {day0}

    # One second before DAY0's last run is 7 days old as a whole day: nothing dropped.
    clock.now = datetime.combine(DAY0 + timedelta(days=8), datetime.min.time(), UTC)
    clock.now -= timedelta(seconds=1)
    assert app.purge() == 1  # old_ok, as the DELETE purge would
    assert DAY0 in part_days(app)
    # At midnight the whole of DAY0 is past the 7 days: its runs partition goes.
    clock.now += timedelta(seconds=1)
    assert app.purge() == 0
    assert DAY0 not in part_days(app)
    assert DAY0 + timedelta(days=1) in part_days(app)
    assert app.get_job(old_ok) is None and orphan_runs(app) == 0
    for job_id in kept:
        assert app.history(job_id) == histories[job_id], job_id
    default = _partitions.default_name(runs.name)
    assert where_runs_are(app, old_aborted) == {default}
    assert where_runs_are(app, pinned) == {default}
    # The decision log keeps 30 days: its DAY0 partition stays.
    assert DAY0 in part_days(app, decisions.name)
    assert app.explain("nightly")["decisions"] == decided

    clock.now = D0 + timedelta(days=31)
    assert app.purge() == 2  # young_ok; old_aborted, its runs deleted from the default partition
    assert DAY0 not in part_days(app, decisions.name)
    assert app.explain("nightly")["decisions"] == []
    assert app.get_job(old_aborted) is None and app.get_job(young_ok) is None
    assert orphan_runs(app) == 0
    assert app.history(pinned) == histories[pinned]


def test_a_drop_that_waits_for_its_lock_gives_up_soon_and_is_done_later(
    direct_pg_url: str,
) -> None:
    clock = Clock(D0)
    app = Scheduler(direct_pg_url, registry=Registry(), clock=clock)
    holder = create_engine(direct_pg_url)
    try:
        app.purge()
        with app.store.begin() as conn:
            conn.execute(
                insert(runs), {"job_id": 9, "attempt": 1, "finished_at": D0, "outcome": "failed"}
            )
        clock.now = D0 + timedelta(days=9)
        with holder.connect() as other:  # a transaction writing the history holds its lock
            other.execute(text("LOCK TABLE scheduler_runs IN ROW EXCLUSIVE MODE"))
            began = time.monotonic()
            app.purge()
            waited = time.monotonic() - began
            assert DAY0 in part_days(app)
            other.rollback()
        assert waited < 2.0
        app.purge()
        assert DAY0 not in part_days(app)
    finally:
        holder.dispose()
        app.close()


# -- many creators at once --------------------------------------------------------------------
def _at_once(count: int, work: Callable[[int], Any]) -> list[BaseException]:
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            barrier.wait(10)
            work(n)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def test_concurrent_housekeepers_create_each_partition_once(
    make_app: Callable[..., Scheduler],
) -> None:
    clocks = [Clock(D0) for _ in range(6)]
    apps = [make_app(clock) for clock in clocks]
    for app in apps:  # each its own pool and connection, opened before the race
        app.store.engine.connect().close()
    for round_ in range(4):
        day = D0 + timedelta(days=10 * round_)
        for clock in clocks:
            clock.now = day
        assert _at_once(len(apps), lambda n: apps[n].purge()) == []
        for table in _partitions.PARTITIONED:
            assert ahead(day.date()) <= part_days(apps[0], table)


def test_concurrent_creators_without_the_lock_take_a_duplicate_for_done(
    make_app: Callable[..., Scheduler],
) -> None:
    """Below the advisory lock: ``create_ahead`` on many connections at once (the lock does
    not serialise them), each day still created, none failing."""
    apps = [make_app(Clock(D0)) for _ in range(6)]
    for round_ in range(4):
        day = (D0 + timedelta(days=10 * round_)).date()

        def create(n: int, day: date = day) -> None:
            _partitions.create_ahead(apps[n].store, day, lock=False)

        assert _at_once(len(apps), create) == []
        assert ahead(day) <= part_days(apps[0]) and ahead(day) <= part_days(apps[0], decisions.name)


# -- the worker ---------------------------------------------------------------------------------
def test_the_workers_housekeeping_drops_and_creates(make_app: Callable[..., Scheduler]) -> None:
    clock = Clock(D0)
    app = make_app(clock)
    app.purge()
    with app.store.begin() as conn:
        conn.execute(
            insert(runs), {"job_id": 9, "attempt": 1, "finished_at": D0, "outcome": "failed"}
        )
    clock.now = D0 + timedelta(days=20)
    with Running(app):  # the housekeeping runs as the worker starts
        wait_until(lambda: DAY0 not in part_days(app))
        wait_until(lambda: ahead(clock.now.date()) <= part_days(app))
    assert orphan_runs(app) == 0


# -- elsewhere ----------------------------------------------------------------------------------
@pytest.mark.parametrize("db_url", ["sqlite", "mariadb"], indirect=True)
def test_sqlite_and_mariadb_keep_plain_tables_and_the_delete_purge(db_url: str) -> None:
    clock = Clock(D0)
    app = Scheduler(db_url, registry=Registry(), clock=clock)
    try:

        @app.handler("ok")
        def ok(job: Any) -> None:
            pass

        old_ok = _finished(app, "ok")
        clock.now = D0 + timedelta(days=8)
        assert app.purge() == 1
        assert app.get_job(old_ok) is None and orphan_runs(app) == 0
        with app.store.begin() as conn:
            assert not _partitions.partitioned(conn, runs.name)
            assert not _partitions.partitioned(conn, decisions.name)
        names = set(inspect(app.store.engine).get_table_names())
        assert {runs.name, decisions.name} <= names
        assert not any(n.endswith("_default") or "_p2" in n for n in names)
    finally:
        app.close()
