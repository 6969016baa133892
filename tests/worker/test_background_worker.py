"""``app.background_worker()``: the worker on a thread of this process, with and async with.

It ticks and runs jobs, installs no signal handler, stops within the grace period on exit, and
any number of them may run at once on one database (each slot dispatched once).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler import Scheduler, SchemaOutdated, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs, workers


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def count(app: Scheduler, table: Any, *where: Any) -> int:
    with app.store.read() as conn:
        query = select(func.count()).select_from(table).where(*where)
        return int(conn.execute(query).scalar_one())


@pytest.fixture
def sched(db_url_sp: str) -> Iterator[Scheduler]:
    app = Scheduler(db_url_sp, registry=Registry(), tick_interval=0.2)
    yield app
    app.close()


def test_it_runs_jobs_and_ticks_and_leaves_no_trace_on_exit(sched: Scheduler) -> None:
    ran: list[int] = []

    @sched.handler("note")
    def note(job: Any) -> None:
        ran.append(job.payload["n"])

    sched.sync([TaskSpec("every-second", "* * * * * *", "note", {"n": -1})])
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with sched.background_worker(concurrency=2) as worker:
        assert worker.running
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
        assert count(sched, workers, workers.c.id == sched.worker_id) == 1
        sched.enqueue_many([{"handler": "note", "payload": {"n": n}} for n in range(5)])
        wait_for(lambda: set(range(5)) <= set(ran) and -1 in ran)  # jobs run, the task ticks
    assert not worker.running
    assert worker.result is not None and worker.result.handled >= 6
    assert worker.result.left_running == 0
    assert count(sched, workers, workers.c.id == sched.worker_id) == 0  # its row is gone


def test_async_with_in_an_event_loop(sched: Scheduler) -> None:
    done = threading.Event()

    @sched.handler("async-note")
    async def note(job: Any) -> None:
        done.set()

    async def main() -> None:
        async with sched.background_worker() as worker:
            await asyncio.to_thread(sched.enqueue, "async-note")
            assert await asyncio.to_thread(done.wait, 20)
        assert not worker.running

    asyncio.run(main())


def test_exit_waits_for_running_jobs_within_the_grace_period(sched: Scheduler) -> None:
    started, finished = threading.Event(), threading.Event()

    @sched.handler("slow")
    def slow(job: Any) -> None:
        started.set()
        time.sleep(1.0)
        finished.set()

    with sched.background_worker(shutdown_grace_seconds=10) as worker:
        job = sched.enqueue("slow")
        assert started.wait(20)
    assert finished.is_set()
    assert worker.result is not None and worker.result.left_running == 0
    assert sched.get_job(job).state == "succeeded"  # type: ignore[union-attr]


def test_a_job_past_the_grace_period_is_left_to_its_lease(sched: Scheduler) -> None:
    started, release = threading.Event(), threading.Event()

    @sched.handler("stuck")
    def stuck(job: Any) -> None:
        started.set()
        release.wait(30)

    try:
        with sched.background_worker(shutdown_grace_seconds=0.2) as worker:
            job = sched.enqueue("stuck")
            assert started.wait(20)
            began = time.monotonic()
        assert time.monotonic() - began < 10
        assert worker.result is not None and worker.result.left_running == 1
        assert sched.get_job(job).state == "claimed"  # type: ignore[union-attr]
    finally:
        release.set()  # its thread ends; its lease would expire and be taken over
        for thread in threading.enumerate():
            if thread.name.startswith("scheduler-job"):
                thread.join(10)


def test_a_start_up_failure_is_raised_by_enter(tmp_path: Path) -> None:
    app = Scheduler(f"sqlite:///{tmp_path / 'none.db'}", registry=Registry())
    try:
        with pytest.raises(SchemaOutdated, match="scheduler migrate"), app.background_worker():
            pytest.fail("entered")
    finally:
        app.close()


def test_settings_are_worker_settings(sched: Scheduler) -> None:
    with pytest.raises(TypeError, match="colour"):
        sched.background_worker(colour="red")
    worker = sched.background_worker(queues=["a", "b"], concurrency=0)
    assert worker.settings.queues == ("a", "b") and worker.settings.concurrency == 0
    worker.start()
    with pytest.raises(Exception, match="started already"):
        worker.start()
    worker.stop()


def test_several_at_once_dispatch_each_slot_once(db_url_sp: str) -> None:
    """Four background workers on one database (as four web processes would run them): every
    per-second slot of a task is dispatched once, whichever worker's tick got it."""
    apps = [Scheduler(db_url_sp, registry=Registry(), tick_interval=0.1) for _ in range(4)]
    try:
        for app in apps:
            app.handler("noop")(lambda job: None)
        apps[0].sync([TaskSpec("fast", "* * * * * *", "noop", {}, overlap="allow")])
        contexts = [app.background_worker(concurrency=1) for app in apps]
        for context in contexts:
            context.start()
        time.sleep(3.5)
        for context in contexts:
            context.stop()
        with apps[0].store.read() as conn:
            slots = list(conn.execute(select(jobs.c.slot).where(jobs.c.task_name == "fast")))
        assert len(slots) >= 2
        assert len(slots) == len(set(slots))  # no slot twice
    finally:
        for app in apps:
            app.close()
