"""InnoDB deadlocks (1213) and lock wait timeouts (1205) never reach a caller.

Every conflict here is real: a second transaction on its own connection of the MariaDB server
holds, or asks for, the rows the operation under test needs. The application's connections
get ``innodb_lock_wait_timeout = 1`` (the smallest the server allows), so that a timeout takes
a second, not fifty. Nothing is mocked.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, select, text, update
from sqlalchemy.exc import OperationalError

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._model.job import Job
from scheduler._store import jobs as _jobs
from scheduler._store import make_engine
from scheduler._store.engine import nowait, skip_locked
from scheduler._store.retry import DEADLOCK, LOCK_WAIT_TIMEOUT, lock_conflict
from scheduler._store.tables import decisions, jobs, rows
from scheduler.testing import ManualClock

T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
LEASE = timedelta(minutes=1)


@pytest.fixture
def maria_url(tmp_path: Any, sqlite_template: Any) -> str:
    from conftest import make_url

    return make_url("mariadb", tmp_path, sqlite_template)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def app(maria_url: str, clock: ManualClock) -> Iterator[Scheduler]:
    """A Scheduler whose connections give up waiting for a lock after one second."""
    engine = make_engine(maria_url, connect_args={"init_command": LOCK_WAIT_ONE_SECOND})
    registry = Registry()

    @registry.handler("h", retry_safe=True)
    def handler(job: Any) -> None:
        pass

    scheduler = Scheduler(engine=engine, registry=registry, clock=clock, worker_id="me")
    yield scheduler
    scheduler.close()


LOCK_WAIT_ONE_SECOND = "SET SESSION innodb_lock_wait_timeout = 1"


def waiting(engine: Engine) -> set[str]:
    """The lock waits going on in this engine's database, each as its transaction and the
    second it began waiting (a transaction that has written nothing keeps its id when its
    connection begins anew). Only this database's: the server is shared with tests running at
    the same time, whose lock waits are theirs (CI saw one)."""
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT CONCAT(t.trx_id, '@', t.trx_wait_started)"
                " FROM information_schema.INNODB_TRX t"
                " WHERE t.trx_state = 'LOCK WAIT' AND t.trx_mysql_thread_id IN"
                " (SELECT p.ID FROM information_schema.PROCESSLIST p WHERE p.DB = DATABASE())"
            )
        ).scalars()
        return {str(t) for t in found}


def wait_for(engine: Engine, condition: Callable[[set[str]], bool], what: str) -> set[str]:
    deadline = time.monotonic() + 15
    while not condition(found := waiting(engine)):
        assert time.monotonic() < deadline, what
        # InnoDB refreshes INNODB_TRX only if nobody read it in the last 100 ms: tests polling
        # it at once from other processes, each at a fixed pace, kept it stale for all of them
        # (seconds on end); at random intervals a gap of 100 ms comes soon.
        time.sleep(random.uniform(0.15, 0.45))
    return found


class Holder(threading.Thread):
    """Another transaction: runs ``take`` (row locks) and keeps them until the operation under
    test has waited for them past its one-second lock wait timeout, then rolls back: as soon
    as a second transaction waits (``retried``: the operation's next attempt), or else once
    the first has stopped waiting (the operation gave up)."""

    def __init__(self, url: str, take: Callable[[Connection], Any], retried: bool = True) -> None:
        super().__init__(daemon=True)
        self.engine = create_engine(url)
        self.take, self.retried = take, retried
        self.locked = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.engine.connect() as conn, conn.begin() as tx:
                self.take(conn)
                self.locked.set()
                first = wait_for(self.engine, bool, "the operation never waited for the lock")
                if self.retried:
                    wait_for(self.engine, lambda now: bool(now - first), "no second attempt")
                else:
                    wait_for(self.engine, lambda now: not now & first, "it never gave up")
                tx.rollback()
        except BaseException as exc:
            self.error = exc
            self.locked.set()

    def __enter__(self) -> Holder:
        self.start()
        assert self.locked.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.join(30)
        self.engine.dispose()
        assert self.error is None, self.error


def lock_job(job_id: int) -> Callable[[Connection], Any]:
    return lambda conn: conn.execute(select(jobs.c.id).where(jobs.c.id == job_id).with_for_update())


def lock_row(name: str) -> Callable[[Connection], Any]:
    return lambda conn: conn.execute(select(rows.c.id).where(rows.c.name == name).with_for_update())


def claimed(app: Scheduler, n: int = 1) -> list[Job]:
    for _ in range(n):
        app.enqueue("h")
    got = app.runner().claim(n)
    assert len(got) == n
    return got


# -- recognising the errors ---------------------------------------------------------------------
def test_lock_conflict_knows_a_real_lock_wait_timeout_and_nothing_else(app: Scheduler) -> None:
    job_id = app.enqueue("h")
    caught: list[BaseException] = []
    with Holder(app.store.engine.url.render_as_string(False), lock_job(job_id), retried=False):
        with app.store.engine.connect() as conn:
            try:
                with conn.begin():
                    conn.execute(update(jobs).where(jobs.c.id == job_id).values(priority=1))
            except OperationalError as exc:
                caught.append(exc)
    assert [lock_conflict(e) for e in caught] == [LOCK_WAIT_TIMEOUT]
    with app.store.engine.connect() as conn:
        with pytest.raises(Exception) as syntax:
            conn.execute(text("SELEC 1"))
    assert lock_conflict(syntax.value) is None  # error 1064: not a lock conflict
    assert lock_conflict(ValueError("1213")) is None


def test_skip_locked_is_detected_from_the_server_version(app: Scheduler) -> None:
    with app.store.engine.connect():
        pass
    dialect = app.store.engine.dialect
    assert dialect.is_mariadb and dialect.server_version_info >= (10, 6)
    assert app.store.caps.skip_locked  # the MariaDB here is 10.11
    for version, mariadb, expected in [
        ((10, 5, 22), True, False),
        ((10, 6, 0), True, True),
        ((5, 7, 44), False, False),
        ((8, 0, 36), False, True),
    ]:
        fake = type("D", (), {"name": "mysql", "is_mariadb": mariadb})()
        fake.server_version_info = version
        assert skip_locked(fake) is expected, version


def test_set_statement_nowait_is_detected_from_the_server_version(app: Scheduler) -> None:
    with app.store.engine.connect():
        pass
    assert app.store.caps.nowait  # MariaDB 10.11
    for version, mariadb, expected in [
        ((10, 2, 44), True, False),
        ((10, 3, 0), True, True),
        ((10, 11, 19, "MariaDB"), True, True),
        ((8, 0, 36), False, False),  # MySQL has no SET STATEMENT
    ]:
        fake = type("D", (), {"name": "mysql", "is_mariadb": mariadb})()
        fake.server_version_info = version
        assert nowait(fake) is expected, version
    unknown = type("D", (), {"name": "mysql", "is_mariadb": True, "server_version_info": None})()
    assert nowait(unknown) is False  # before the first connection


# -- lock wait timeouts: retried, or the lost race they are ------------------------------------
def test_a_claim_skips_a_locked_job_and_takes_the_next(app: Scheduler, maria_url: str) -> None:
    first, second = app.enqueue("h"), app.enqueue("h")
    other = create_engine(maria_url)
    try:
        with other.connect() as conn, conn.begin():
            lock_job(first)(conn)
            assert [j.id for j in app.runner().claim(2)] == [second]  # SKIP LOCKED: no wait
            assert waiting(other) == set()
    finally:
        other.dispose()


def test_a_portable_claim_waits_past_a_lock_wait_timeout(app: Scheduler, maria_url: str) -> None:
    """No SKIP LOCKED (MariaDB before 10.6, MySQL 5.7): the claim waits for the lock, times
    out once, and its second attempt claims the job."""
    job_id = app.enqueue("h")
    app.store.engine.connect().close()  # detect the capabilities first, then take one away
    app.store.caps = dataclasses.replace(app.store.caps, skip_locked=False)
    with Holder(maria_url, lock_job(job_id)):
        assert [j.id for j in app.runner().claim(1)] == [job_id]


def test_recording_an_outcome_retries_a_lock_wait_timeout(app: Scheduler, maria_url: str) -> None:
    [job] = claimed(app)
    runner = app.runner()
    with Holder(maria_url, lock_job(job.id)):
        assert runner.run(job) == "succeeded"
    found = app.get_job(job.id)
    assert found is not None and found.state == "succeeded"


def test_a_heartbeat_retries_a_lock_wait_timeout(app: Scheduler, maria_url: str) -> None:
    [job] = claimed(app)
    with Holder(maria_url, lock_job(job.id)):
        assert app.runner().extend([job.id]) == 1


def test_a_takeover_passes_over_a_locked_job_then_takes_it(
    app: Scheduler, maria_url: str, clock: ManualClock
) -> None:
    """SKIP LOCKED: a stopped job another transaction holds is not waited for."""
    [job] = claimed(app)
    clock.advance(minutes=2)
    other = copy.copy(app.runner())
    other.owner = "other"
    holder = create_engine(maria_url)
    try:
        with holder.connect() as conn, conn.begin():
            lock_job(job.id)(conn)
            assert other.take_over() == []
            assert waiting(holder) == set()
    finally:
        holder.dispose()
    assert [j.id for j in other.take_over()] == [job.id]
    found = app.get_job(job.id)
    assert found is not None and (found.lease_owner, found.attempts) == ("other", 2)


def test_enqueue_with_a_dedupe_key_retries_a_lock_wait_timeout(
    app: Scheduler, maria_url: str
) -> None:
    values = _jobs.new_job_values(handler="h", payload="{}", now=T0, dedupe_key="k")
    with Holder(maria_url, lambda conn: _jobs.insert_job(conn, values)):
        job_id = app.enqueue("h", dedupe_key="k")  # the holder's uncommitted twin rolls back
    assert app.get_job(job_id) is not None


ROW = TaskSpec("r", "* * * * *", "h", {}, "UTC")


def test_a_tick_passes_over_a_locked_row_without_waiting(
    app: Scheduler, maria_url: str, clock: ManualClock
) -> None:
    """SKIP LOCKED (MariaDB 10.6 on): the row is reported ``locked`` at once."""
    app.sync([ROW, dataclasses.replace(ROW, name="free")])
    clock.advance(minutes=2)
    holder = create_engine(maria_url)
    try:
        with holder.connect() as conn, conn.begin():
            lock_row("r")(conn)
            report = app.tick()
            assert waiting(holder) == set()
    finally:
        holder.dispose()
    assert report.locked == ["r"] and report.dispatched == ["free"]
    assert report.lost_race == []
    assert app.tick().dispatched == ["r"]  # the next tick takes it


def test_a_tick_row_whose_swap_times_out_is_passed_over_then_dispatched(
    app: Scheduler, maria_url: str, clock: ManualClock
) -> None:
    """Without SKIP LOCKED nor MariaDB's SET STATEMENT (MySQL 5.7) the swap waits, bounded by
    the lock wait timeout: ``locked``."""
    app.sync([ROW])
    clock.advance(minutes=2)
    app.store.engine.connect().close()
    app.store.caps = dataclasses.replace(app.store.caps, skip_locked=False, nowait=False)
    with Holder(maria_url, lock_row("r"), retried=False):
        report = app.tick()
    assert report.locked == ["r"] and report.dispatched == []
    assert app.tick().dispatched == ["r"]  # the next tick takes it


@pytest.mark.parametrize("skip", [True, False], ids=["skip-locked", "no-skip-locked"])
def test_a_tick_dispatch_refuses_to_wait_for_a_locked_row_itself(
    app: Scheduler, maria_url: str, clock: ManualClock, skip: bool
) -> None:
    """MariaDB: the fresh dispatch's swap is written ``SET STATEMENT innodb_lock_wait_timeout =
    0 FOR``, so it fails at once on a locked row (no SKIP LOCKED probe before it, and none
    needed before MariaDB 10.6): ``locked``, nothing written, nobody waited."""
    app.sync([ROW, dataclasses.replace(ROW, name="free")])
    clock.advance(minutes=2)
    app.store.engine.connect().close()
    assert app.store.caps.nowait
    app.store.caps = dataclasses.replace(app.store.caps, skip_locked=skip)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        statements.append(statement)

    holder = create_engine(maria_url)
    event.listen(app.store.engine, "before_cursor_execute", seen)
    try:
        with holder.connect() as conn, conn.begin():
            lock_row("r")(conn)
            began = time.monotonic()
            report = app.tick()
            took = time.monotonic() - began
            assert waiting(holder) == set()
    finally:
        event.remove(app.store.engine, "before_cursor_execute", seen)
        holder.dispose()
    assert report.locked == ["r"] and report.dispatched == ["free"]
    assert took < 1  # the session's lock wait timeout here is one second
    assert not [s for s in statements if "SKIP LOCKED" in s]
    with app.store.read() as conn:
        assert conn.execute(select(jobs.c.task_name)).scalars().all() == ["free"]
        entries = conn.execute(select(decisions.c.task_name, decisions.c.decision)).all()
    # two slots passed: free's dispatch and its coalesced entry; none of r's rolled back
    assert sorted(tuple(e) for e in entries) == [("free", "coalesced"), ("free", "dispatched")]
    assert app.tick().dispatched == ["r"]  # the next tick takes it


@pytest.mark.parametrize("change", ["enable", "disable", "trigger", "sync"])
def test_row_changes_retry_a_lock_wait_timeout(app: Scheduler, maria_url: str, change: str) -> None:
    app.sync([ROW])
    if change == "enable":
        app.disable("r")
    with Holder(maria_url, lock_row("r")):
        if change == "sync":
            plan = app.sync([dataclasses.replace(ROW, cron="*/5 * * * *")])
            assert plan
        else:
            getattr(app, change)("r")
    found = app.get_row("r")
    assert found is not None
    if change == "sync":
        assert found.cron == "*/5 * * * *"
    else:
        assert found.enabled is (change != "disable")


def test_purge_retries_a_lock_wait_timeout(
    app: Scheduler, maria_url: str, clock: ManualClock
) -> None:
    [job] = claimed(app)
    app.runner().run(job)
    clock.advance(days=30)
    with Holder(maria_url, lock_job(job.id)):
        assert app.purge() == 1


# -- deadlocks: real ones, the operation under test the victim ------------------------------------
class Crosser(threading.Thread):
    """A transaction that makes a real deadlock with the operation under test: it writes
    enough rows to be the heavier of the two (InnoDB rolls back the lighter one), locks
    ``second`` (the row the operation takes last), waits until the operation waits for it,
    then asks for ``first`` (a row the operation already holds). Once InnoDB has rolled the
    operation back and granted the lock, it holds on briefly and rolls back."""

    def __init__(
        self, url: str, first: Callable[[Connection], Any], second: Callable[[Connection], Any]
    ) -> None:
        super().__init__(daemon=True)
        self.engine = create_engine(url)
        self.first, self.second = first, second
        self.locked = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.engine.connect() as conn, conn.begin() as tx:
                conn.execute(
                    text(
                        "INSERT INTO scheduler_runs (job_id, attempt, finished_at, outcome)"
                        " SELECT seq, 1, NOW(6), 'weight' FROM seq_1_to_300"
                    )
                )
                self.second(conn)
                self.locked.set()
                wait_for(self.engine, bool, "the operation never waited for the lock")
                self.first(conn)  # the deadlock: InnoDB rolls the operation back
                time.sleep(0.2)
                tx.rollback()
        except BaseException as exc:
            self.error = exc
            self.locked.set()

    def __enter__(self) -> Crosser:
        self.start()
        assert self.locked.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.join(30)
        self.engine.dispose()
        assert self.error is None, self.error


@pytest.fixture
def conflicts(caplog: pytest.LogCaptureFixture) -> Callable[[], list[int]]:
    """The lock conflicts the retry helper saw, by code."""
    caplog.set_level(logging.DEBUG, logger="scheduler._store.retry")

    def seen() -> list[int]:
        return [r.code for r in caplog.records if getattr(r, "action", "").startswith("lock_")]

    return seen


def test_a_portable_claim_that_deadlocks_is_run_again(
    app: Scheduler, maria_url: str, conflicts: Callable[[], list[int]]
) -> None:
    """Without SKIP LOCKED both claimers see both jobs; the claim locks them in id order."""
    a, b = app.enqueue("h"), app.enqueue("h")
    app.store.engine.connect().close()
    app.store.caps = dataclasses.replace(app.store.caps, skip_locked=False)
    with Crosser(maria_url, first=lock_job(a), second=lock_job(b)):
        got = app.runner().claim(2)
    assert [j.id for j in got] == [a, b]
    assert conflicts() == [DEADLOCK]


def test_recording_outcomes_that_deadlock_is_run_again(
    app: Scheduler, maria_url: str, conflicts: Callable[[], list[int]]
) -> None:
    first, second = claimed(app, 2)
    runner = app.runner()
    outcomes = [runner.execute(first), runner.execute(second)]
    with Crosser(maria_url, first=lock_job(first.id), second=lock_job(second.id)):
        assert runner.record(outcomes) == ["succeeded", "succeeded"]
    assert conflicts() == [DEADLOCK]
    assert [r["outcome"] for r in app.history(first.id)] == ["succeeded"]


def test_a_heartbeat_that_deadlocks_is_run_again(
    app: Scheduler, maria_url: str, conflicts: Callable[[], list[int]]
) -> None:
    first, second = claimed(app, 2)
    with Crosser(maria_url, first=lock_job(first.id), second=lock_job(second.id)):
        assert app.runner().extend([first.id, second.id]) == 2
    assert conflicts() == [DEADLOCK]


def test_a_tick_row_that_deadlocks_is_a_lost_race_then_dispatched(
    app: Scheduler, maria_url: str, clock: ManualClock
) -> None:
    """The dispatch inserts the job, then swaps the row: the crosser holds the row and asks
    for the new job. Only where the swap waits for the row's lock (MySQL: without SKIP LOCKED
    nor SET STATEMENT); on MariaDB the swap does not wait, so it cannot deadlock there."""
    app.sync([ROW])
    clock.advance(minutes=2)
    app.store.engine.connect().close()  # or the tick passes over the row
    app.store.caps = dataclasses.replace(app.store.caps, skip_locked=False, nowait=False)
    with app.store.read() as conn:
        newest = conn.execute(select(jobs.c.id).order_by(jobs.c.id.desc())).scalar() or 0

    def new_jobs(conn: Connection) -> None:
        conn.execute(select(jobs.c.id).where(jobs.c.id > newest).with_for_update())

    with Crosser(maria_url, first=new_jobs, second=lock_row("r")):
        report = app.tick()
    assert report.lost_race == ["r"]
    assert app.tick().dispatched == ["r"]
    with app.store.read() as conn:
        assert len(conn.execute(select(jobs.c.id)).all()) == 1  # the lost dispatch left nothing
