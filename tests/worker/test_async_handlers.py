"""``async def`` handlers (SPEC §13): app.work(), work_async, the worker's event loop (limits,
leases, the loop-lag watchdog, cancellation at shutdown), scheduler.testing, current_job()."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from scheduler import RunningJob, Scheduler, SchedulerError, TaskSpec, current_job
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker
from scheduler.testing import ManualClock, drive


@pytest.fixture
def sp_app(db_url_sp: str) -> Iterator[Scheduler]:
    """A Scheduler with its own registry on SQLite and PostgreSQL."""
    app = Scheduler(db_url_sp, registry=Registry())
    yield app
    app.close()


class InFlight:
    """How many handler runs overlap, at most (counted by the handlers themselves)."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            yield
        finally:
            with self.lock:
                self.now -= 1


def states(app: Scheduler, ids: list[int]) -> list[tuple[str, str | None]]:
    found = [app.get_job(i) for i in ids]
    return [(j.state, j.last_error_code) for j in found if j is not None]


# -- app.work() and work_async ---------------------------------------------------------------
def test_work_awaits_async_handlers_and_current_job_is_each_runs_own(sp_app: Scheduler) -> None:
    seen: list[tuple[int, int, int]] = []

    @sp_app.handler("a.sleep")
    async def sleepy(job: RunningJob) -> None:
        await asyncio.sleep(0.01)

        async def child() -> int:  # a task it creates copies its context: the same job
            await asyncio.sleep(0)
            found = current_job()
            assert found is not None
            return found.id

        inner = current_job()
        assert inner is not None
        seen.append((job.id, inner.id, await asyncio.create_task(child())))

    ids = [sp_app.enqueue("a.sleep", {"n": n}) for n in range(3)]
    assert current_job() is None
    assert sp_app.work() == 3
    assert seen == [(i, i, i) for i in ids]
    assert states(sp_app, ids) == [("succeeded", None)] * 3
    assert current_job() is None


def test_one_loop_serves_every_work_call_of_a_scheduler(sp_app: Scheduler) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    @sp_app.handler("a.loop")
    async def which(job: RunningJob) -> None:
        loops.append(asyncio.get_running_loop())

    for _ in range(2):
        sp_app.enqueue("a.loop")
        assert sp_app.work() == 1
    assert len(loops) == 2 and loops[0] is loops[1]  # a client made in run 1 works in run 2


def test_async_failures_retry_or_abandon_with_an_async_hook(sp_app: Scheduler) -> None:
    abandoned: list[int] = []

    async def hook(job: RunningJob) -> None:
        await asyncio.sleep(0.01)
        abandoned.append(job.id)

    @sp_app.handler("a.flaky", retry_safe=True, max_attempts=2)
    async def flaky(job: RunningJob) -> None:
        await asyncio.sleep(0)
        raise ConnectionError("down")

    @sp_app.handler("a.unsafe", abandoned=hook)
    async def unsafe(job: RunningJob) -> None:
        await asyncio.sleep(0)
        raise ValueError("partway")

    retried, lost = sp_app.enqueue("a.flaky"), sp_app.enqueue("a.unsafe")
    assert sp_app.work() == 2
    assert states(sp_app, [retried, lost]) == [
        ("queued", "ConnectionError"),
        ("aborted", "abandoned"),
    ]
    assert abandoned == [lost]
    assert [r["error_code"] for r in sp_app.history(lost)] == ["ValueError"]


def test_a_sync_handler_returning_a_coroutine_is_never_a_success(sp_app: Scheduler) -> None:
    ran: list[int] = []

    async def body(job: RunningJob) -> None:
        ran.append(job.id)

    @sp_app.handler("s.forgot", retry_safe=True)
    def forgot(job: RunningJob) -> Any:
        return body(job)  # never awaited: closed by the runner (warnings are errors here)

    job = sp_app.enqueue("s.forgot")
    assert sp_app.work() == 1
    assert states(sp_app, [job]) == [("aborted", "handler_returned_awaitable")]
    assert ran == []


def test_work_inside_a_running_loop_is_refused_and_work_async_uses_that_loop(
    sp_app: Scheduler,
) -> None:
    loops: list[asyncio.AbstractEventLoop] = []
    threads: list[str] = []

    @sp_app.handler("a.here")
    async def here(job: RunningJob) -> None:
        loops.append(asyncio.get_running_loop())

    @sp_app.handler("s.there")
    def there(job: RunningJob) -> None:
        threads.append(threading.current_thread().name)

    async def main() -> tuple[int, asyncio.AbstractEventLoop]:
        with pytest.raises(SchedulerError, match="work_async"):
            sp_app.work()
        sp_app.enqueue("a.here")
        sp_app.enqueue("s.there")
        return await sp_app.work_async(), asyncio.get_running_loop()

    handled, loop = asyncio.run(main())
    assert handled == 2
    assert loops == [loop]
    assert threads and threads[0] != threading.main_thread().name  # off the loop's thread


def test_an_async_postgresql_query_in_a_handler(pg_url: str) -> None:
    app = Scheduler(pg_url, registry=Registry())
    conninfo = app.store.engine.url.set(drivername="postgresql").render_as_string(False)
    answers: list[tuple[Any, ...]] = []

    @app.handler("a.query")
    async def query(job: RunningJob) -> None:
        async with await psycopg.AsyncConnection.connect(conninfo) as conn:
            cursor = await conn.execute("SELECT pg_sleep(0.05)::text, %s::int", (job.id,))
            answers.append(tuple(await cursor.fetchone() or ()))

    job = app.enqueue("a.query")
    assert app.work() == 1
    assert answers == [("", job)]
    assert states(app, [job]) == [("succeeded", None)]
    app.close()


def test_testing_drive_runs_an_async_task(tmp_path: Path, sqlite_template: Path) -> None:
    import shutil

    db = tmp_path / "drive.db"
    shutil.copy(sqlite_template, db)
    task = TaskSpec(name="hourly", cron="0 * * * *", handler="a.hourly")
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    app = Scheduler(f"sqlite:///{db}", registry=Registry(), tasks=[task], clock=clock)
    runs: list[str | None] = []

    @app.handler("a.hourly")
    async def hourly(job: RunningJob) -> None:
        await asyncio.sleep(0)
        runs.append(job.task_name)

    app.sync()
    result = drive(
        app, datetime(2030, 1, 1, 0, 30, tzinfo=UTC), datetime(2030, 1, 1, 3, 30, tzinfo=UTC)
    )
    assert runs == ["hourly"] * 3
    assert len(result.times("hourly")) == 3
    app.close()


# -- the worker's event loop ------------------------------------------------------------------
def run_worker(app: Scheduler, **kwargs: Any) -> Worker:
    worker = Worker(app, **kwargs)
    worker.run(once=True)
    return worker


@pytest.mark.parametrize("limit", [4, 12])
def test_the_worker_runs_up_to_async_concurrency_at_once(sp_app: Scheduler, limit: int) -> None:
    sp_app.worker_settings = replace(sp_app.worker_settings, concurrency=2, async_concurrency=limit)
    overlap = InFlight()

    @sp_app.handler("a.wait")
    async def wait(job: RunningJob) -> None:
        with overlap.one():
            await asyncio.sleep(0.3)

    ids = [sp_app.enqueue("a.wait") for _ in range(12)]
    run_worker(sp_app)
    assert states(sp_app, ids) == [("succeeded", None)] * 12
    assert overlap.most == limit  # at most the limit, and the loop did fill it


def test_sync_and_async_jobs_each_have_their_own_slots(sp_app: Scheduler) -> None:
    sp_app.worker_settings = replace(sp_app.worker_settings, concurrency=2, async_concurrency=6)
    threads, loop = InFlight(), InFlight()

    @sp_app.handler("a.wait")
    async def wait(job: RunningJob) -> None:
        with loop.one():
            await asyncio.sleep(0.3)

    @sp_app.handler("s.wait")
    def block(job: RunningJob) -> None:
        with threads.one():
            time.sleep(0.3)

    ids = [sp_app.enqueue(h) for h in ("s.wait", "a.wait") * 6]
    run_worker(sp_app)
    assert states(sp_app, ids) == [("succeeded", None)] * 12
    assert (threads.most, loop.most) == (2, 6)


def test_async_jobs_leases_are_renewed_while_they_await(
    tmp_path: Path, sqlite_template: Path
) -> None:
    import shutil

    db = tmp_path / "lease.db"
    shutil.copy(sqlite_template, db)
    app = Scheduler(f"sqlite:///{db}", registry=Registry(), lease_seconds=1)

    @app.handler("a.long")
    async def long(job: RunningJob) -> None:
        await asyncio.sleep(3)  # three leases long: only the heartbeats keep it

    job = app.enqueue("a.long")
    run_worker(app)
    assert states(app, [job]) == [("succeeded", None)]
    assert [r["outcome"] for r in app.history(job)] == ["succeeded"]  # never lost, never rerun
    app.close()


def test_a_handler_blocking_the_loop_is_logged_by_name(
    sp_app: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    @sp_app.handler("a.blocks")
    async def blocks(job: RunningJob) -> None:
        time.sleep(1.6)  # blocks the event loop: the watchdog must say who

    @sp_app.handler("a.polite")
    async def polite(job: RunningJob) -> None:
        await asyncio.sleep(0.5)

    sp_app.enqueue("a.polite")
    job = sp_app.enqueue("a.blocks")
    with caplog.at_level(logging.WARNING, logger="scheduler._worker.events"):
        run_worker(sp_app)
    blocked = [r for r in caplog.records if getattr(r, "action", "") == "event_loop_blocked"]
    # One episode, one line; a busy machine may add an episode of its own (no job named).
    named = [r for r in blocked if getattr(r, "handler", None) is not None]
    assert [(r.job_id, r.handler) for r in named] == [(job, "a.blocks")]  # type: ignore[attr-defined]
    assert "'a.blocks'" in named[0].getMessage() and f"job {job}" in named[0].getMessage()


def test_shutdown_gives_async_jobs_the_grace_then_cancels_them(sp_app: Scheduler) -> None:
    sp_app.worker_settings = replace(sp_app.worker_settings, shutdown_grace_seconds=2.5)
    started: list[str] = []
    abandoned: list[int] = []
    cancelled: list[str] = []

    async def hook(job: RunningJob) -> None:
        await asyncio.sleep(0.01)
        abandoned.append(job.id)

    async def forever(job: RunningJob) -> None:
        started.append(job.handler)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(job.handler)
            raise

    sp_app.registry.handler("a.safe", retry_safe=True)(forever)
    sp_app.registry.handler("a.unsafe", abandoned=hook)(forever)

    @sp_app.handler("a.finishes")
    async def finishes(job: RunningJob) -> None:
        started.append(job.handler)
        await asyncio.sleep(1.0)  # well within the grace

    safe, unsafe = sp_app.enqueue("a.safe"), sp_app.enqueue("a.unsafe")
    done = sp_app.enqueue("a.finishes")
    worker = Worker(sp_app)
    thread = threading.Thread(target=worker.run)
    thread.start()
    deadline = time.monotonic() + 20
    while len(started) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert sorted(cancelled) == ["a.safe", "a.unsafe"]
    assert states(sp_app, [safe, unsafe, done]) == [
        ("queued", "worker_stopped"),  # retry-safe: queued again at once
        ("aborted", "abandoned"),  # not: its (async) abandoned hook ran
        ("succeeded", None),
    ]
    again = sp_app.get_job(safe)
    assert again is not None and again.attempts == 1 and again.lease_owner is None
    assert abandoned == [unsafe]
    assert [r["error_code"] for r in sp_app.history(unsafe)] == ["worker_stopped"]


# -- real worker processes: `scheduler worker` (SIGTERM, --once) and a kill -9 mid-await ------
ASYNC_JOBS_MODULE = """
import asyncio, pathlib
from scheduler import default_registry

async def forever(job):
    pathlib.Path(job.payload["dir"], f"{job.id}.started").touch()
    await asyncio.sleep(60)

async def note_abandoned(job):
    await asyncio.sleep(0)
    pathlib.Path(job.payload["dir"], f"{job.id}.abandoned").touch()

default_registry.handler("a.safe", retry_safe=True)(forever)
default_registry.handler("a.unsafe", abandoned=note_abandoned)(forever)

@default_registry.handler("a.mark", retry_safe=True)
async def mark(job):
    await asyncio.sleep(0.05)
    pathlib.Path(job.payload["dir"], f"{job.id}.done").touch()
"""


def async_config(tmp_path: Path, url: str, worker: str = "") -> Path:
    from helpers.cli import write_config

    (tmp_path / "async_jobs.py").write_text(ASYNC_JOBS_MODULE)
    config = write_config(tmp_path, url, worker=worker)
    config.write_text(config.read_text().replace('"cli_jobs"', '"async_jobs"'))
    return config


def wait_for_files(*paths: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {paths}"
        time.sleep(0.02)


@pytest.mark.slow
def test_sigterm_to_a_real_worker_cancels_its_async_jobs_after_the_grace(
    db_url_sp: str, sp_app: Scheduler, tmp_path: Path
) -> None:
    from helpers.worker_process import WorkerProcess

    config = async_config(tmp_path, db_url_sp, worker="shutdown_grace_seconds = 0.5\n")
    payload = {"dir": str(tmp_path)}
    safe, unsafe = sp_app.enqueue("a.safe", payload), sp_app.enqueue("a.unsafe", payload)
    worker = WorkerProcess(tmp_path, config)
    try:
        wait_for_files(tmp_path / f"{safe}.started", tmp_path / f"{unsafe}.started")
        assert worker.stop() == 0, worker.output()
    finally:
        worker.kill()
    assert "cancelling async job(s)" in worker.output()
    assert states(sp_app, [safe, unsafe]) == [
        ("queued", "worker_stopped"),
        ("aborted", "abandoned"),
    ]
    assert (tmp_path / f"{unsafe}.abandoned").exists()
    assert not (tmp_path / f"{safe}.abandoned").exists()


def test_worker_once_runs_async_handlers(tmp_path: Path, sqlite_template: Path) -> None:
    import shutil

    from helpers.cli import run_cli

    db = tmp_path / "once.db"
    shutil.copy(sqlite_template, db)
    app = Scheduler(f"sqlite:///{db}", registry=Registry())
    ids = [app.enqueue("a.mark", {"dir": str(tmp_path)}) for _ in range(3)]
    config = async_config(tmp_path, f"sqlite:///{db}")
    result = run_cli(tmp_path, "--config", str(config), "worker", "--once")
    assert result.returncode == 0, result.stderr
    assert states(app, ids) == [("succeeded", None)] * 3
    assert all((tmp_path / f"{i}.done").exists() for i in ids)
    app.close()


VICTIM = """
import sys
from scheduler import Scheduler, default_registry
from scheduler._worker.worker import Worker
import async_jobs  # registers the handlers

app = Scheduler(sys.argv[1], worker_id="victim", lease_seconds=1)
Worker(app).run(install_signals=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("retry_safe", [True, False])
def test_a_worker_killed_mid_await_has_its_job_taken_over(
    db_url_sp: str, sp_app: Scheduler, tmp_path: Path, retry_safe: bool
) -> None:
    import os
    import signal
    import subprocess
    import sys

    (tmp_path / "async_jobs.py").write_text(ASYNC_JOBS_MODULE)
    (tmp_path / "victim.py").write_text(VICTIM)
    name = "a.safe" if retry_safe else "a.unsafe"
    job = sp_app.enqueue(name, {"dir": str(tmp_path)})
    proc = subprocess.Popen(
        [sys.executable, "victim.py", db_url_sp],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_files(tmp_path / f"{job}.started")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    taken = sp_app.get_job(job)
    assert taken is not None and (taken.state, taken.lease_owner) == ("claimed", "victim")
    rescued: list[int] = []
    rescue_hook: list[int] = []

    async def rescue(job: RunningJob) -> None:
        await asyncio.sleep(0.01)
        rescued.append(job.id)

    async def hook(job: RunningJob) -> None:
        rescue_hook.append(job.id)

    sp_app.registry.handler(name, retry_safe=retry_safe, abandoned=hook)(rescue)
    time.sleep(1.2)  # the victim's 1-second lease runs out
    assert sp_app.work() == (1 if retry_safe else 0)
    outcomes = [(r["outcome"], r["error_code"], r["worker"]) for r in sp_app.history(job)]
    if retry_safe:
        assert states(sp_app, [job]) == [("succeeded", None)]
        assert rescued == [job] and rescue_hook == []
        assert outcomes == [
            ("lost", "lease_expired", "victim"),
            ("succeeded", None, sp_app.worker_id),
        ]
    else:
        assert states(sp_app, [job]) == [("aborted", "abandoned")]
        assert rescued == [] and rescue_hook == [job]
        assert outcomes[0] == ("lost", "lease_expired", "victim")


def test_the_claim_can_ask_for_some_handlers_jobs_or_for_the_others(app: Scheduler) -> None:
    """The worker's split claim, on every engine (the portable path on SQLite and MariaDB)."""
    ids = {h: [app.enqueue(h) for _ in range(3)] for h in ("a.one", "a.two", "s.three")}
    runner = app.runner()
    mine = runner.claim(10, handlers={"a.one", "a.two"})
    assert sorted(j.id for j in mine) == sorted(ids["a.one"] + ids["a.two"])
    assert runner.claim(10, handlers={"a.one", "a.two"}) == []
    others = runner.claim(2, handlers={"a.one", "a.two"}, exclude=True)
    assert [j.id for j in others] == ids["s.three"][:2]
    assert [j.handler for j in runner.claim(10)] == ["s.three"]


def test_a_sync_handlers_async_abandoned_hook_runs_on_the_workers_loop(
    sp_app: Scheduler,
) -> None:
    loops: list[tuple[str, asyncio.AbstractEventLoop]] = []

    async def hook(job: RunningJob) -> None:
        await asyncio.sleep(0)
        loops.append(("hook", asyncio.get_running_loop()))

    @sp_app.handler("s.unsafe", abandoned=hook)
    def unsafe(job: RunningJob) -> None:
        raise ValueError("partway")

    @sp_app.handler("a.mark")
    async def mark(job: RunningJob) -> None:
        loops.append(("handler", asyncio.get_running_loop()))

    ids = [sp_app.enqueue("s.unsafe"), sp_app.enqueue("a.mark")]
    run_worker(sp_app)
    assert states(sp_app, ids) == [("aborted", "abandoned"), ("succeeded", None)]
    assert sorted(kind for kind, _ in loops) == ["handler", "hook"]
    assert loops[0][1] is loops[1][1]  # one event loop per worker process
