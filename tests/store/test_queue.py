"""The durable job queue's contract (SPEC §1) over SQLite files, PostgreSQL and MariaDB.

Races use real connections (threads) and real processes (multiprocessing, spawn); time is the
Scheduler's ``clock=`` or freezegun. Nothing here is mocked.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import multiprocessing
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time
from helpers.queue_worker import RACE_HANDLER, Clock, race_worker, read_lines
from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from scheduler import LeaseLost, PayloadError, PermanentError, Scheduler, TaskSpec
from scheduler._errors import JobStateError
from scheduler._model.handlers import Registry
from scheduler._store import jobs as _jobs
from scheduler._store.jobs import new_job_values
from scheduler._store.tables import jobs, metadata, runs
from scheduler._worker.runner import RunningJob

T0 = datetime(2030, 1, 7, 12, 0, 0, 250_000, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def make_app(db_url: str, clock: Clock) -> Iterator[Callable[..., Scheduler]]:
    """Schedulers on this test's database, all on the test's clock unless told otherwise."""
    made: list[Scheduler] = []

    def make(**kwargs: Any) -> Scheduler:
        kwargs.setdefault("registry", Registry())
        kwargs.setdefault("clock", clock)
        app = Scheduler(db_url, **kwargs)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


def job_count(app: Scheduler) -> int:
    with app.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # reported by the test thread
            out["error"] = exc
        out["done_at"] = time.monotonic()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


def joined(thread: threading.Thread, out: dict[str, Any]) -> Any:
    thread.join(30)
    assert not thread.is_alive(), "the second connection never finished"
    if "error" in out:
        raise out["error"]
    return out["result"]


# -- claiming: one conditional statement decides -------------------------------------------
def test_claim_race_at_sql_level_exactly_one_update_lands(make_app: Callable[..., Scheduler]):
    """Two connections both see the job queued, both run the conditional claim: 1 vs 0 rows."""
    app = make_app()
    job_id = app.enqueue("race")
    store = app.store
    sqlite = store.caps.dialect == "sqlite"
    queued = select(jobs.c.id).where(jobs.c.state == "queued")

    def claim_stmt(owner: str) -> Any:
        return (
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state == "queued")
            .values(
                state="claimed",
                lease_owner=owner,
                lease_expires_at=T0 + timedelta(minutes=1),
                attempts=jobs.c.attempts + 1,
            )
        )

    b_saw_it, a_updated = threading.Event(), threading.Event()

    def worker_b() -> int:
        if sqlite:
            # A WAL reader runs beside A's write transaction; B then needs its own write
            # transaction (BEGIN IMMEDIATE waits for A's commit under the busy timeout).
            with store.read() as conn:
                assert list(conn.execute(queued).scalars()) == [job_id]
            b_saw_it.set()
            assert a_updated.wait(30)
            with store.begin() as conn:
                return int(conn.execute(claim_stmt("B")).rowcount)
        with store.begin() as conn:
            assert list(conn.execute(queued).scalars()) == [job_id]
            b_saw_it.set()
            assert a_updated.wait(30)
            # Blocks on A's row lock, then re-evaluates the WHERE against A's committed row.
            return int(conn.execute(claim_stmt("B")).rowcount)

    with store.engine.connect() as a:
        with a.begin():
            assert list(a.execute(queued).scalars()) == [job_id]
            thread, out = run_in_thread(worker_b)
            assert b_saw_it.wait(30)
            assert a.execute(claim_stmt("A")).rowcount == 1
            a_updated.set()
            time.sleep(0.2)  # B is now waiting on A
            committed_at = time.monotonic()
    assert joined(thread, out) == 0
    assert out["done_at"] >= committed_at
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.lease_owner, job.attempts) == ("claimed", "A", 1)


@pytest.mark.parametrize(
    ("skip_locked", "returning"),
    [(True, True), (False, True), (False, False)],
    ids=["native", "no-skip-locked", "portable"],
)
def test_claim_in_overlapping_transactions_gives_the_job_to_one(
    make_app: Callable[..., Scheduler], clock: Clock, skip_locked: bool, returning: bool
):
    """``_jobs.claim`` itself, in two open transactions. The capability flags are optimisations:
    without SKIP LOCKED, or without UPDATE ... RETURNING too (the portable path), the
    conditional UPDATE alone must still give the job to exactly one."""
    app = make_app()
    job_id = app.enqueue("race")
    store = app.store
    store.caps = dataclasses.replace(
        store.caps,
        skip_locked=store.caps.skip_locked and skip_locked,
        update_returning=store.caps.update_returning and returning,
    )

    def claim(conn: Any, owner: str) -> list[int]:
        got = _jobs.claim(store, conn, owner=owner, now=clock(), lease=timedelta(minutes=1))
        return [j.id for j in got]

    with store.begin() as a:
        assert claim(a, "A") == [job_id]

        def worker_b() -> list[int]:
            with store.begin() as b:
                return claim(b, "B")

        thread, out = run_in_thread(worker_b)
        time.sleep(0.2)
    assert joined(thread, out) == []
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.lease_owner, job.attempts) == ("claimed", "A", 1)


def race_on_one_job_set(url: str, out: Path, processes: int) -> list[int | None]:
    """`processes` spawned processes call work() on the same job set at once; exit codes.

    They start together once every one has connected (a barrier, not a fixed wait: on a
    loaded machine the first process ready used to run all the jobs before the others had
    imported the package)."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(processes + 1)
    procs = [
        ctx.Process(target=race_worker, args=(url, str(out), start, f"w{n}"))
        for n in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        start.wait(120)
        for proc in procs:
            proc.join(120)  # spawn and import are slow on a loaded machine
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [p.exitcode for p in procs]


def test_processes_racing_on_one_job_set_run_each_job_exactly_once(db_url: str, tmp_path: Path):
    """Spawned processes call work() on the same 60 jobs at once: four on SQLite and
    PostgreSQL, three on MariaDB (where a deadlock once reached the caller)."""
    app = Scheduler(db_url, registry=Registry())
    try:
        processes = 3 if app.store.caps.dialect == "mysql" else 4
        ids = [app.enqueue(RACE_HANDLER, {"n": n}) for n in range(60)]
        out = tmp_path / "calls.log"
        assert race_on_one_job_set(db_url, out, processes) == [0] * processes
        calls = [line.split() for line in read_lines(out)]
        per_job = Counter(int(job_id) for job_id, _ in calls)
        assert per_job == Counter(ids), "a job ran twice or never"
        assert len({worker for _, worker in calls}) >= 2, "only one process got work: no race"
        for job_id in ids:
            job = app.get_job(job_id)
            assert job is not None
            assert (job.state, job.attempts) == ("succeeded", 1)
            assert [r["outcome"] for r in app.history(job_id)] == ["succeeded"]
    finally:
        app.close()


def test_claim_takes_no_more_than_its_limit(make_app: Callable[..., Scheduler]):
    app = make_app()
    ids = [app.enqueue("j") for _ in range(5)]
    runner = app.runner()
    assert [j.id for j in runner.claim(1)] == ids[:1]
    assert [j.id for j in runner.claim(2)] == ids[1:3]
    with app.store.read() as conn:
        states = conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state))
        assert {state: n for state, n in states} == {"claimed": 3, "queued": 2}


def test_claim_takes_priority_then_run_at_and_leaves_future_jobs(
    make_app: Callable[..., Scheduler], clock: Clock
):
    """Lower priority values run first (as in Oban), then the oldest ``run_at``."""
    app = make_app()
    later = app.enqueue("j", run_at=T0 + timedelta(seconds=1))
    newer = app.enqueue("j", run_at=T0 - timedelta(minutes=5))
    lazy = app.enqueue("j", priority=5, run_at=T0 - timedelta(hours=1))
    urgent = app.enqueue("j", priority=-1)
    older = app.enqueue("j", run_at=T0 - timedelta(minutes=10))
    runner = app.runner()
    assert [j.id for j in runner.claim(10)] == [urgent, older, newer, lazy]
    assert runner.claim(10) == []
    clock.advance(seconds=1)
    assert [j.id for j in runner.claim(10)] == [later]


# -- leases: takeover, lockout, heartbeats ---------------------------------------------------
def test_stopped_worker_is_locked_out_after_takeover(
    make_app: Callable[..., Scheduler], clock: Clock
):
    registry = Registry()
    a = make_app(registry=registry, worker_id="A", lease_seconds=60)
    b = make_app(registry=registry, worker_id="B", lease_seconds=60)
    ran_as: list[str] = []
    running = ["A"]

    @a.handler("lock.job", retry_safe=True, max_attempts=3)
    def body(job: Any) -> None:
        ran_as.append(running[0])

    job_id = a.enqueue("lock.job")
    ra, rb = a.runner(), b.runner()
    [job_a] = ra.claim()
    clock.advance(seconds=61)
    [job_b] = rb.take_over()
    assert (job_b.id, job_b.attempts, job_b.lease_owner) == (job_id, 2, "B")

    # A is told, and changes nothing.
    with pytest.raises(LeaseLost):
        RunningJob(job_a, ra).heartbeat()
    assert ra.extend([job_id]) == 0
    before = a.get_job(job_id)
    assert ra.run(job_a) == "lease_lost"
    assert a.get_job(job_id) == before
    assert before is not None and (before.state, before.lease_owner) == ("claimed", "B")

    running[0] = "B"
    assert rb.run(job_b) == "succeeded"
    running[0] = "A"
    assert ra.run(job_a) == "lease_lost"  # still nothing after B finished
    job = a.get_job(job_id)
    assert job is not None
    assert (job.state, job.attempts, job.last_error_code, job.lease_owner) == (
        "succeeded",
        2,
        None,
        None,
    )
    assert job.finished_at == clock()
    assert ran_as == ["A", "B", "A"]
    assert [
        (r["attempt"], r["outcome"], r["error_code"], r["worker"]) for r in a.history(job_id)
    ] == [
        (1, "lost", "lease_expired", "A"),
        (2, "succeeded", None, "B"),
    ]


def test_expired_worker_cannot_finish_even_before_a_takeover(
    make_app: Callable[..., Scheduler], clock: Clock
):
    """A lease that ran out is lost at once: a failure is not recorded as a retry either."""
    a = make_app(worker_id="A", lease_seconds=30)

    @a.handler("slow.job", retry_safe=True, max_attempts=3)
    def body(job: Any) -> None:
        clock.advance(seconds=31)
        raise TimeoutError

    job_id = a.enqueue("slow.job")
    ra = a.runner()
    [job] = ra.claim()
    assert ra.run(job) == "lease_lost"
    after = a.get_job(job_id)
    assert after is not None
    assert (after.state, after.lease_owner, after.last_error_code) == ("claimed", "A", None)
    assert a.history(job_id) == []
    # Another worker then takes it over and runs attempt 2.
    b = make_app(registry=a.registry, worker_id="B")
    assert [j.attempts for j in b.runner().take_over()] == [2]


def test_stopped_worker_of_a_non_retry_safe_job_never_runs_the_abandoned_hook(
    make_app: Callable[..., Scheduler], clock: Clock
):
    """B abandons the job after A's lease expired; A's handler then raises: A's lease is gone,
    so A neither runs the hook a second time nor changes the job."""
    registry = Registry()
    a = make_app(registry=registry, worker_id="A", lease_seconds=60)
    b = make_app(registry=registry, worker_id="B", lease_seconds=60)
    hooks: list[int] = []

    @a.handler("charge.card", abandoned=lambda job: hooks.append(job.id))
    def charge(job: Any) -> None:
        clock.advance(seconds=61)
        assert b.runner().take_over() == []  # B abandoned it: nothing to rerun
        raise ConnectionError

    job_id = a.enqueue("charge.card")
    ra = a.runner()
    [job] = ra.claim()
    assert ra.run(job) == "lease_lost"
    assert hooks == [job_id]
    final = a.get_job(job_id)
    assert final is not None
    assert (final.state, final.last_error_code, final.attempts) == ("aborted", "abandoned", 1)
    assert [(r["outcome"], r["error_code"], r["worker"]) for r in a.history(job_id)] == [
        ("lost", "lease_expired", "A"),
        ("abandoned", "lease_expired", "B"),
    ]


def test_takeover_race_on_a_stale_snapshot_has_one_winner(
    make_app: Callable[..., Scheduler], clock: Clock
):
    """Two workers read the same expired job, then both try the conditional takeover; later,
    the loser's snapshot stays stale even once the winner's own lease has run out."""
    app = make_app(worker_id="A", lease_seconds=60)
    job_id = app.enqueue("j", max_attempts=5)
    app.runner().claim()
    now = clock.advance(seconds=61)
    with app.store.read() as conn:
        [seen] = _jobs.expired(conn, now=now, limit=10)
    assert (seen.id, seen.lease_owner) == (job_id, "A")

    def take(snapshot: Any, owner: str) -> bool:
        with app.store.begin() as conn:
            return _jobs.take_over(
                conn, snapshot, owner=owner, now=clock(), lease=timedelta(minutes=1), rerun=True
            )

    assert [take(seen, "B"), take(seen, "C")] == [True, False]
    job = app.get_job(job_id)
    assert job is not None
    assert (job.lease_owner, job.attempts) == ("B", 2)

    clock.advance(seconds=61)  # B stopped too; C's snapshot of A's lease is still stale
    assert not take(seen, "C")
    with app.store.read() as conn:
        [fresh] = _jobs.expired(conn, now=clock(), limit=10)
    assert take(fresh, "C")
    job = app.get_job(job_id)
    assert job is not None
    assert (job.lease_owner, job.attempts) == ("C", 3)
    assert [(r["attempt"], r["worker"]) for r in app.history(job_id)] == [(1, "A"), (2, "B")]


def test_a_live_lease_cannot_be_taken_over_or_expired(
    make_app: Callable[..., Scheduler], clock: Clock
):
    """Even with an exact, current snapshot of the job: the lease has not run out yet."""
    app = make_app(worker_id="A", lease_seconds=60)
    job_id = app.enqueue("j", max_attempts=1)
    [claimed] = app.runner().claim()
    now = clock.advance(seconds=59)
    for rerun in (True, False):
        with app.store.begin() as conn:
            assert not _jobs.take_over(
                conn, claimed, owner="B", now=now, lease=timedelta(minutes=1), rerun=rerun
            )
    with app.store.begin() as conn:
        assert not _jobs.abort_expired(conn, claimed, now=now)
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.lease_owner, job.attempts) == ("claimed", "A", 1)
    assert app.history(job_id) == []


@pytest.mark.parametrize("beats", [True, False], ids=["heartbeat", "no-heartbeat"])
def test_heartbeats_keep_the_lease(make_app: Callable[..., Scheduler], clock: Clock, beats: bool):
    """A running job that heartbeats outlives its original expiry; without, it is taken."""
    registry = Registry()
    a = make_app(registry=registry, worker_id="A", lease_seconds=60)
    b = make_app(registry=registry, worker_id="B", lease_seconds=60)
    seen: dict[str, Any] = {}

    @a.handler("long.job", retry_safe=True)
    def long_job(job: Any) -> None:
        clock.advance(seconds=50)
        if beats:
            job.heartbeat()
        clock.advance(seconds=20)  # past the original expiry at +60 s
        seen["taken"] = [j.id for j in b.runner().take_over()]
        with a.store.begin() as conn:
            seen["stale"] = _jobs.take_over(
                conn, claimed, owner="C", now=clock(), lease=timedelta(minutes=1), rerun=True
            )

    job_id = a.enqueue("long.job")
    ra = a.runner()
    [claimed] = ra.claim()
    assert claimed.lease_expires_at == T0 + timedelta(seconds=60)
    outcome = ra.run(claimed)
    job = a.get_job(job_id)
    assert job is not None
    if beats:
        assert seen == {"taken": [], "stale": False}
        assert outcome == "succeeded"
        assert (job.state, job.attempts) == ("succeeded", 1)
        assert [r["worker"] for r in a.history(job_id)] == ["A"]
    else:
        assert seen == {"taken": [job_id], "stale": False}
        assert outcome == "lease_lost"
        assert (job.state, job.lease_owner, job.attempts) == ("claimed", "B", 2)


def test_heartbeat_extends_from_now(make_app: Callable[..., Scheduler], clock: Clock):
    app = make_app(worker_id="A", lease_seconds=60)
    job_id = app.enqueue("j")
    runner = app.runner()
    [job] = runner.claim()
    clock.advance(seconds=45)
    RunningJob(job, runner).heartbeat()
    after = app.get_job(job_id)
    assert after is not None
    assert after.lease_expires_at == T0 + timedelta(seconds=105)
    clock.advance(seconds=61)
    with pytest.raises(LeaseLost):
        RunningJob(job, runner).heartbeat()


# -- outcomes, retries and codes -------------------------------------------------------------
class UpstreamDown(Exception):
    code = "upstream_down"


class NumericCode(Exception):
    code = 503


def test_backoff_doubles_from_one_minute_caps_at_an_hour_then_aborts_with_last_code(
    db_url: str,
):
    attempts_seen: list[int] = []
    with freeze_time("2030-03-04 05:06:07.123456") as frozen:
        app = Scheduler(db_url, registry=Registry(), clock="local")  # what freezegun freezes

        @app.handler("flaky", retry_safe=True, max_attempts=10)
        def flaky(job: Any) -> None:
            attempts_seen.append(job.attempt)
            if job.attempt < job.max_attempts:
                raise ValueError("try again")
            raise UpstreamDown("gave up")

        job_id = app.enqueue("flaky")
        for attempt, minutes in enumerate([1, 2, 4, 8, 16, 32, 60, 60, 60], start=1):
            failed_at = datetime.now(UTC)
            assert app.work() == 1
            job = app.get_job(job_id)
            assert job is not None
            assert (job.state, job.attempts, job.last_error_code) == (
                "queued",
                attempt,
                "ValueError",
            )
            assert job.run_at == failed_at + timedelta(minutes=minutes)
            frozen.move_to(job.run_at - timedelta(microseconds=1))
            assert app.work() == 0, "ran before its backoff was over"
            frozen.move_to(job.run_at)
        assert app.work() == 1
        job = app.get_job(job_id)
        assert job is not None
        assert (job.state, job.attempts, job.last_error_code) == ("aborted", 10, "upstream_down")
        assert attempts_seen == list(range(1, 11))
        history = app.history(job_id)
        assert [r["outcome"] for r in history] == ["failed"] * 9 + ["aborted"]
        assert [r["error_code"] for r in history] == ["ValueError"] * 9 + ["upstream_down"]
        app.close()


def test_backoff_base_and_cap_are_configurable(make_app: Callable[..., Scheduler], clock: Clock):
    app = make_app(backoff_base_seconds=10, backoff_max_seconds=30)

    @app.handler("flaky", retry_safe=True, max_attempts=5)
    def flaky(job: Any) -> None:
        raise ValueError

    job_id = app.enqueue("flaky")
    delays = []
    for _ in range(4):
        assert app.work() == 1
        job = app.get_job(job_id)
        assert job is not None
        delays.append((job.run_at - clock()).total_seconds())
        clock.now = job.run_at
    assert delays == [10, 20, 30, 30]


def test_permanent_error_aborts_at_once(make_app: Callable[..., Scheduler]):
    app = make_app()

    @app.handler("strict", retry_safe=True, max_attempts=5)
    def strict(job: Any) -> None:
        raise PermanentError("bad_input")

    job_id = app.enqueue("strict")
    assert app.work() == 1
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.attempts, job.last_error_code) == ("aborted", 1, "bad_input")
    assert [(r["outcome"], r["error_code"]) for r in app.history(job_id)] == [
        ("aborted", "bad_input")
    ]
    assert app.work() == 0


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UpstreamDown(), "upstream_down"),
        (NumericCode(), "NumericCode"),
        (KeyError("k"), "KeyError"),
    ],
)
def test_stored_code_is_the_code_attribute_else_the_class_name(
    make_app: Callable[..., Scheduler], exc: Exception, code: str
):
    app = make_app()

    @app.handler("h", retry_safe=True, max_attempts=1)
    def h(job: Any) -> None:
        raise exc

    job_id = app.enqueue("h")
    app.work()
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.last_error_code) == ("aborted", code)


def test_job_without_a_handler_aborts_no_handler(make_app: Callable[..., Scheduler]):
    app = make_app()
    job_id = app.enqueue("nobody.home")
    assert app.work() == 1
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.attempts, job.last_error_code) == ("aborted", 1, "no_handler")


def test_non_retry_safe_handler_that_raises_is_abandoned_once(make_app: Callable[..., Scheduler]):
    app = make_app()
    hooks: list[tuple[int, int]] = []

    @app.handler(
        "send.mail", max_attempts=3, abandoned=lambda job: hooks.append((job.id, job.attempt))
    )
    def send(job: Any) -> None:
        raise UpstreamDown

    job_id = app.enqueue("send.mail")
    assert app.work() == 1
    assert app.work() == 0
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.attempts, job.last_error_code) == ("aborted", 1, "abandoned")
    assert hooks == [(job_id, 1)]
    assert [(r["outcome"], r["error_code"]) for r in app.history(job_id)] == [
        ("abandoned", "upstream_down")
    ]


def test_successful_job_records_its_run(make_app: Callable[..., Scheduler], clock: Clock):
    app = make_app(worker_id="W")
    got: list[Any] = []

    @app.handler("ok")
    def ok(job: Any) -> None:
        got.append((job.id, job.payload, job.attempt))
        clock.advance(seconds=2)

    job_id = app.enqueue("ok", {"region": "eu", "n": [1, 2]})
    assert app.work() == 1
    assert got == [(job_id, {"region": "eu", "n": [1, 2]}, 1)]
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.attempts, job.lease_owner, job.lease_expires_at) == (
        "succeeded",
        1,
        None,
        None,
    )
    [run] = app.history(job_id)
    assert (run["attempt"], run["outcome"], run["worker"]) == (1, "succeeded", "W")
    assert (run["started_at"], run["finished_at"]) == (T0, T0 + timedelta(seconds=2))


# -- dedupe ----------------------------------------------------------------------------------
def test_dedupe_key_holds_one_active_job_and_is_released_when_it_ends(
    make_app: Callable[..., Scheduler],
):
    app = make_app()

    @app.handler("report")
    def report(job: Any) -> None:
        pass

    first = app.enqueue("report", {"a": 1}, dedupe_key="daily")
    assert app.enqueue("report", {"a": 2}, dedupe_key="daily") == first
    runner = app.runner()
    [job] = runner.claim()
    assert app.enqueue("report", dedupe_key="daily") == first  # claimed is still active
    assert runner.run(job) == "succeeded"
    second = app.enqueue("report", dedupe_key="daily")
    assert second != first
    assert app.enqueue("report", dedupe_key="other") not in (first, second)
    assert job_count(app) == 3
    finished = app.get_job(first)
    assert finished is not None and finished.dedupe_key is None


def test_dedupe_key_is_released_by_an_abort_too(make_app: Callable[..., Scheduler]):
    app = make_app()
    first = app.enqueue("no.such.handler", dedupe_key="k")
    app.work()
    assert app.enqueue("no.such.handler", dedupe_key="k") != first


def test_dedupe_is_enforced_by_the_database(make_app: Callable[..., Scheduler]):
    app = make_app()
    app.enqueue("report", dedupe_key="daily")
    values = new_job_values(handler="report", payload="{}", now=T0, dedupe_key="daily")
    with pytest.raises(IntegrityError), app.store.begin() as conn:
        conn.execute(insert(jobs).values(**values))
    assert job_count(app) == 1


def test_concurrent_enqueues_with_one_key_make_one_job(make_app: Callable[..., Scheduler]):
    app = make_app()
    barrier = threading.Barrier(6)

    def enqueue() -> int:
        barrier.wait(10)
        return app.enqueue("report", dedupe_key="burst")

    started = [run_in_thread(enqueue) for _ in range(6)]
    ids = {joined(thread, out) for thread, out in started}
    assert len(ids) == 1
    assert job_count(app) == 1


# -- payload rules ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "payload",
    [
        {"password": "hunter2"},
        {"api_key": "hunter2"},
        {"apiKey": "hunter2"},
        {"API-Key": "hunter2"},
        {"Authorization": "Bearer hunter2"},
        {"passwd": "hunter2"},
        {"client_secret": "hunter2"},
        {"refresh_token": "hunter2"},
        {"private_key": "hunter2"},
        {"credentials": {"user": "bob"}},
        {"session": "hunter2"},
        {"Cookie": "hunter2"},
        {"headers": {"Authorization": "Bearer hunter2"}},
        {"items": [1, {"deep": [{"x": {"Password": "hunter2"}}]}]},
        {"targets": [{"url": "https://example"}, {"apikey": "hunter2"}]},
    ],
)
def test_credential_like_keys_are_refused_at_any_depth(
    make_app: Callable[..., Scheduler], payload: dict[str, Any]
):
    app = make_app()
    with pytest.raises(PayloadError) as info:
        app.enqueue("h", payload)
    assert "hunter2" not in str(info.value)
    assert job_count(app) == 0


def test_ordinary_keys_are_accepted(make_app: Callable[..., Scheduler]):
    app = make_app()
    payload = {"region": "eu", "user": "bob", "key_id": "k1", "items": [{"sku": "a"}]}
    job = app.get_job(app.enqueue("h", payload))
    assert job is not None and job.payload == payload


def test_payload_up_to_64_kib_is_stored_whole_and_over_it_refused(
    make_app: Callable[..., Scheduler],
):
    app = make_app()
    # '{"x":"' + n + '"}' is n + 8 bytes of JSON.
    limit = 64 * 1024
    fits = {"x": "a" * (limit - 8)}
    job = app.get_job(app.enqueue("h", fits))
    assert job is not None and job.payload == fits
    with pytest.raises(PayloadError, match="65537 bytes"):
        app.enqueue("h", {"x": "a" * (limit - 7)})
    assert job_count(app) == 1


# The columns hold 200, 100 and 200 characters; PostgreSQL and MariaDB raised a DataError past
# them and SQLite stored the whole value. "é" is one character of two UTF-8 bytes.
@pytest.mark.parametrize(
    ("field", "limit"), [("handler", 200), ("queue", 100), ("dedupe_key", 200)]
)
def test_over_long_handler_queue_or_dedupe_key_is_refused_before_the_database(
    make_app: Callable[..., Scheduler], field: str, limit: int
):
    app = make_app()

    def enqueue(value: str) -> int:
        args: dict[str, Any] = {"handler": "h", field: value}
        return app.enqueue(args.pop("handler"), {}, **args)

    fits = "é" + "x" * (limit - 1)
    job = app.get_job(enqueue(fits))
    assert job is not None and getattr(job, field) == fits
    for too_long in (fits + "x", "x" * (limit + 100)):
        with pytest.raises(ValueError) as info:
            enqueue(too_long)
        assert str(info.value) == (
            f"{field} is {len(too_long)} characters, over the {limit}-character limit"
        )
    assert job_count(app) == 1


def test_a_handler_with_an_over_long_name_or_queue_is_refused_at_registration(
    make_app: Callable[..., Scheduler],
):
    """Every job the handler makes (enqueued or dispatched by the tick) carries both, so they
    are checked when the handler is registered, not when its first job is written."""
    app = make_app()
    with pytest.raises(ValueError, match=r"queue is 101 characters, over the 100-character"):
        app.handler("long.queue", queue="q" * 101)(lambda job: None)
    with pytest.raises(ValueError, match=r"handler is 201 characters, over the 200-character"):
        app.handler("h" * 201)(lambda job: None)
    app.handler("long.queue", queue="q" * 100)(lambda job: None)  # at the limit: fine
    job = app.get_job(app.enqueue("long.queue"))
    assert job is not None and job.queue == "q" * 100
    assert job_count(app) == 1


# -- error messages stay out of the database ---------------------------------------------------
SECRET = "SECRET-MESSAGE-xyz"


def all_text(engine: Engine) -> str:
    """Every value of every column of our tables, as text."""
    parts = []
    with engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(select(table)):
                parts.extend(str(value) for value in row)
    return "\n".join(parts)


def test_exception_messages_never_reach_the_database(
    make_app: Callable[..., Scheduler], clock: Clock, db_url: str
):
    app = make_app()

    @app.handler("leaky.retry", retry_safe=True, max_attempts=2)
    def leaky_retry(job: Any) -> None:
        raise ValueError(SECRET)

    @app.handler("leaky.once")
    def leaky_once(job: Any) -> None:
        raise ValueError(SECRET)

    @app.handler("leaky.permanent")
    def leaky_permanent(job: Any) -> None:
        raise PermanentError("bad_input", SECRET)

    ids = [app.enqueue(name) for name in ("leaky.retry", "leaky.once", "leaky.permanent")]
    assert app.work() == 3
    clock.advance(minutes=2)
    assert app.work() == 1
    states = [(j.state, j.last_error_code) for j in map(app.get_job, ids) if j is not None]
    assert states == [("aborted", "ValueError"), ("aborted", "abandoned"), ("aborted", "bad_input")]
    text = all_text(app.store.engine)
    assert "ValueError" in text and "bad_input" in text
    assert SECRET not in text
    if app.store.caps.dialect == "sqlite":
        app.close()
        path = Path(db_url.removeprefix("sqlite:///"))
        with sqlite3.connect(path) as raw:
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        raw.close()
        data = path.read_bytes()
        wal = path.with_name(path.name + "-wal")
        if wal.exists():
            data += wal.read_bytes()
        assert b"ValueError" in data
        assert SECRET.encode() not in data


# -- purge -----------------------------------------------------------------------------------
def test_purge_removes_old_succeeded_jobs_keeps_aborted_and_row_jobs(
    make_app: Callable[..., Scheduler], clock: Clock
):
    app = make_app()

    @app.handler("ok")
    def ok(job: Any) -> None:
        pass

    def finished_job(handler: str) -> int:
        job_id = app.enqueue(handler)
        assert app.work() == 1
        return job_id

    clock.now = T0 - timedelta(days=23)
    ancient_aborted = finished_job("missing")
    clock.now = T0
    old_ok = finished_job("ok")
    old_aborted = finished_job("missing")
    app.sync([TaskSpec(name="nightly", cron="0 3 * * *", handler="ok", payload={}, timezone="UTC")])
    app.trigger("nightly")
    assert app.tick().dispatched == ["nightly"]
    assert app.work() == 1
    row = app.get_row("nightly")
    assert row is not None and row.last_job_state == "succeeded"
    pinned = row.last_job_id
    old_queued = app.enqueue("ok", run_at=T0 + timedelta(days=100))
    clock.now = T0 + timedelta(days=2)
    young_ok = finished_job("ok")

    clock.now = T0 + timedelta(days=8)
    assert app.purge() == 2
    gone = {ancient_aborted, old_ok}
    for job_id in (ancient_aborted, old_ok, old_aborted, pinned, old_queued, young_ok):
        assert (app.get_job(job_id) is None) == (job_id in gone), job_id
        if job_id in gone:  # purged with its history: no such job any more
            with pytest.raises(JobStateError, match=f"no job {job_id}"):
                app.history(job_id)
        else:
            assert (app.history(job_id) == []) == (job_id == old_queued), job_id
    with app.store.read() as conn:
        orphans = conn.execute(
            select(func.count()).select_from(runs).where(runs.c.job_id.not_in(select(jobs.c.id)))
        ).scalar_one()
    assert orphans == 0
    assert app.purge() == 0


# -- time ------------------------------------------------------------------------------------
def test_timestamps_come_back_aware_utc_with_microseconds(
    make_app: Callable[..., Scheduler], clock: Clock
):
    app = make_app(worker_id="W")

    @app.handler("ok")
    def ok(job: Any) -> None:
        clock.advance(microseconds=1)

    at = datetime(2030, 1, 7, 12, 8, 9, 654_321, tzinfo=ZoneInfo("Europe/Berlin"))
    job_id = app.enqueue("ok", run_at=at)
    job = app.get_job(job_id)
    assert job is not None
    assert job.run_at == at and job.run_at.tzinfo is UTC
    assert job.run_at.isoformat() == "2030-01-07T11:08:09.654321+00:00"
    assert job.created_at == T0 and job.created_at.tzinfo is UTC
    assert app.work() == 1
    job = app.get_job(job_id)
    assert job is not None
    assert job.finished_at == T0 + timedelta(microseconds=1) and job.finished_at.tzinfo is UTC
    [run] = app.history(job_id)
    assert run["started_at"] == T0 and run["started_at"].tzinfo is UTC
    assert run["finished_at"].microsecond == 250_001
    runner = app.runner()
    app.enqueue("ok")
    [claimed] = runner.claim()
    assert claimed.lease_expires_at == T0 + timedelta(seconds=60, microseconds=1)
    assert claimed.lease_expires_at.tzinfo is UTC


def test_naive_run_at_is_refused(make_app: Callable[..., Scheduler]):
    app = make_app()
    with pytest.raises(ValueError, match="naive"):
        app.enqueue("h", run_at=datetime(2030, 1, 1, 12, 0))
    assert job_count(app) == 0


# -- statement counts ----------------------------------------------------------------------
def load_benchmark() -> Any:
    spec = importlib.util.spec_from_file_location(
        "query_counts", ROOT / "benchmarks" / "query_counts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# (statements, transactions) per operation, BEGIN/COMMIT excluded, as measured by
# benchmarks/query_counts.py. A change here changes the queue's cost per job: make it on purpose.
_COMMON = {
    "enqueue": (1, 1),  # INSERT
    # INSERT ... ON CONFLICT DO NOTHING RETURNING id (a key held already: then its SELECT)
    "enqueue with dedupe key": (1, 1),
    "claim": (1, 1),  # UPDATE ... RETURNING
    "complete (success)": (2, 1),  # guarded UPDATE, history INSERT
    "fail (retry later)": (2, 1),
    # the paused queues' SELECT (once per call), expired-lease SELECT, claim
    "work(), nothing ready": (3, 3),
    # due-row SELECT; the probing rows' SELECT (recovery probes: once, then only when one is
    # due, running or a minute passed); record: UPDATE, INSERT
    "tick, idle, first of the process": (4, 3),
    "tick, idle": (1, 1),  # due-row SELECT (the record waits TICK_RECORD_SECONDS)
    "tick, idle, 5 s later": (2, 2),  # due-row SELECT; the record's UPDATE
    # due-row SELECT; INSERT job + row compare-and-swap + its decision-log entry
    "tick, one row dispatched": (4, 2),
    "work(), one job": (7, 6),
}
EXPECTED_COUNTS = {
    "sqlite": _COMMON,
    # The dispatch is one statement (compare-and-swap, INSERT and log entry in one CTE), its own
    # transaction; then the batch's one wake-up NOTIFY, after its rows' commits.
    # A retry's NOTIFY rides in the transaction that records it (one per batch of outcomes);
    # an enqueue's rides in its INSERT ... RETURNING (no statement of its own).
    # A batch of successes is one statement in autocommit (_store/outcomes.py): no BEGIN.
    "postgresql": {
        **_COMMON,
        "tick, one row dispatched": (3, 3),
        "fail (retry later)": (3, 1),
        "complete (success)": (1, 1),
        "work(), one job": (6, 6),
    },
    # No UPDATE ... RETURNING: SELECT ... SKIP LOCKED, UPDATE, SELECT the jobs won.
    # The tick's dispatch is one query (INSERT job; the swap, which refuses to wait for a
    # locked row; INSERT ... SELECT its entry), sent as one statement.
    "mysql": {
        **_COMMON,
        "enqueue with dedupe key": (2, 1),  # SELECT the active holder, INSERT (no ON CONFLICT)
        "claim": (3, 1),
        "work(), one job": (9, 6),
        "tick, one row dispatched": (2, 2),
    },
}


def test_statement_counts_per_operation(make_app: Callable[..., Scheduler]):
    app = make_app()
    url = app.store.engine.url.render_as_string(hide_password=False)
    assert load_benchmark().measure(url) == EXPECTED_COUNTS[app.store.caps.dialect]


def test_sqlite_lock_past_the_busy_timeout_is_sqlalchemys_operational_error(
    tmp_path: Path,
) -> None:
    """BEGIN IMMEDIATE goes straight to the driver; a lock that outlasts the busy timeout
    still reaches callers (the worker's retry on transient errors) as OperationalError."""
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError

    path = tmp_path / "locked.db"
    app = Scheduler(f"sqlite:///{path}", registry=Registry())
    app.migrate()

    @event.listens_for(app.store.engine, "connect")
    def short_timeout(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA busy_timeout=50")

    app.store.engine.dispose()  # new connections get the short timeout
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(OperationalError, match="locked"), app.store.begin():
            pass
        with app.store.read() as conn:  # a reader does not need the write lock
            assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        app.close()
    app = Scheduler(f"sqlite:///{path}", registry=Registry())
    try:
        assert app.enqueue("h", {}) > 0  # the lock is gone: writes work again
    finally:
        app.close()


def _traced(engine: Engine, into: Path) -> Any:
    """libpq's own trace of every message each pooled connection sends and receives, written
    to ``into`` while the connection is checked out; returns the open file (close it)."""
    from sqlalchemy import event

    sink = into.open("a")

    @event.listens_for(engine.pool, "checkout")
    def trace(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        dbapi_connection.pgconn.trace(sink.fileno())

    @event.listens_for(engine.pool, "checkin")
    def untrace(dbapi_connection: Any, _record: Any) -> None:
        if dbapi_connection is not None:
            dbapi_connection.pgconn.untrace()
        sink.flush()

    return sink


def _sent(trace: Path) -> list[str]:
    """The messages the client sent (libpq trace lines ``time F length Message ...``)."""
    found = []
    for line in trace.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) > 3 and fields[1] == "F":
            detail = fields[4].strip()[:20] if len(fields) > 4 else ""
            found.append(f"{fields[3]} {detail}".strip())
    return found


def test_enqueue_without_a_key_is_one_round_trip_on_postgresql(direct_pg_url: str, tmp_path: Path):
    """A job without a dedupe key is one INSERT in the driver's autocommit: no BEGIN and no
    COMMIT on the wire (one Sync: one round trip); the job is committed when enqueue returns.
    With a dedupe key it stays a transaction of its own (BEGIN, INSERT ... ON CONFLICT,
    COMMIT)."""
    registry = Registry()
    registry.handler("h")(lambda job: None)
    app = Scheduler(direct_pg_url, registry=registry)
    other = Scheduler(direct_pg_url, registry=Registry())
    trace = tmp_path / "libpq.trace"
    sink = None
    try:
        app.enqueue("h", {})  # connect, and load the types, before the trace
        sink = _traced(app.store.engine, trace)
        job_id = app.enqueue("h", {"n": 1})
        sent = _sent(trace)
        assert [m.split()[0] for m in sent] == ["Parse", "Bind", "Describe", "Execute", "Sync"]
        assert not any(m.startswith("Query") for m in sent), sent
        seen = other.get_job(job_id)  # another connection sees it committed
        assert seen is not None and seen.payload == {"n": 1} and seen.state == "queued"

        trace.write_text("")
        keyed = app.enqueue("h", {}, dedupe_key="k")
        sent = _sent(trace)
        assert sent[0] == 'Query "BEGIN"' and sent[-1] == 'Query "COMMIT"', sent
        assert app.enqueue("h", {}, dedupe_key="k") == keyed
    finally:
        app.close()
        other.close()
        if sink is not None:
            sink.close()
