"""The worker's prefetch: while its jobs are short it holds up to
``PREFETCH_FACTOR`` jobs per thread, claimed several per statement; a job held beyond the
threads waits for one of them while another worker may be idle. So one long job among short
ones stops the prefetch: the jobs that come next are claimed only for free threads, and the
rest stay queued for any worker.

Through a real worker on a thread, its claims read back from the database (who holds what).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs
from scheduler._worker.worker import PREFETCH_FACTOR, SLOW_JOB_SECONDS, Worker

THREADS = 2


def wait_for(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def count(app: Scheduler, handler: str, state: str) -> int:
    query = select(func.count()).where(jobs.c.handler == handler, jobs.c.state == state)
    with app.store.read() as conn:
        return int(conn.execute(query).scalar_one())


@pytest.fixture
def app(db_url_sp: str) -> Iterator[Scheduler]:
    app = Scheduler(db_url_sp, registry=Registry())
    yield app
    app.close()


@pytest.mark.parametrize("long_job_before", [False, True], ids=["all-short", "one-long"])
def test_a_long_job_among_short_ones_stops_the_prefetch(
    app: Scheduler, long_job_before: bool
) -> None:
    release = threading.Event()

    @app.handler("t.short", retry_safe=True)
    def short(job: Any) -> None:
        return None

    @app.handler("t.long", retry_safe=True)
    def long(job: Any) -> None:
        time.sleep(SLOW_JOB_SECONDS * 1.2)

    @app.handler("t.blocked", retry_safe=True)
    def blocked(job: Any) -> None:
        release.wait(30)

    worker = Worker(app, concurrency=THREADS)
    thread = threading.Thread(target=worker.run, daemon=True)
    for _ in range(20):
        app.enqueue("t.short", {})
    thread.start()
    try:
        wait_for(lambda: count(app, "t.short", "succeeded") == 20, 20, "the short jobs")
        if long_job_before:
            app.enqueue("t.long", {})
            wait_for(lambda: count(app, "t.long", "succeeded") == 1, 20, "the long job")
            for _ in range(10):  # the moving average back under its bound
                app.enqueue("t.short", {})
            wait_for(lambda: count(app, "t.short", "succeeded") == 30, 20, "more short jobs")
        for _ in range(3 * THREADS * PREFETCH_FACTOR):
            app.enqueue("t.blocked", {})
        wait_for(lambda: count(app, "t.blocked", "claimed") >= THREADS, 20, "a claim")
        time.sleep(0.3)  # a claim has ended: the worker's threads are all busy now
        held = count(app, "t.blocked", "claimed")
    finally:
        release.set()
        worker.stop()
        thread.join(30)
    # the moving average of run times is short either way (0.6 s among 30 no-ops: 0.06 s
    # right after it, 0.02 s ten jobs later)
    assert held == (THREADS if long_job_before else THREADS * PREFETCH_FACTOR)


def test_a_thread_takes_the_next_job_while_the_last_outcome_waits_to_be_written(
    direct_pg_url: str,
):
    """A slot is free once its handler returned: with one thread and no prefetch (the last
    job took SLOW_JOB_SECONDS), a second job starts while the first one's outcome cannot be
    written yet (its row locked by another transaction). The first stays claimed, its lease
    held, until the write goes through; then it is recorded as succeeded, once."""
    from sqlalchemy import create_engine

    app = Scheduler(direct_pg_url, registry=Registry(), concurrency=1)
    a_started, go_a, b_started = threading.Event(), threading.Event(), threading.Event()

    @app.handler("a")
    def first(job: Any) -> None:
        a_started.set()
        assert go_a.wait(30)

    @app.handler("b")
    def second(job: Any) -> None:
        b_started.set()

    locker = create_engine(direct_pg_url)
    worker = Worker(app, serve_metrics=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        thread.start()
        assert worker.started.wait(10)
        a = app.enqueue("a")
        assert a_started.wait(10)
        with locker.connect() as lock:
            lock.exec_driver_sql(f"SELECT id FROM scheduler_jobs WHERE id = {a} FOR UPDATE")
            b = app.enqueue("b")
            time.sleep(SLOW_JOB_SECONDS + 0.1)  # job a is slow: no prefetch from here on
            go_a.set()
            assert b_started.wait(10), "job b waited for job a's outcome to be written"
            job_a = app.get_job(a)
            assert job_a is not None and job_a.state == "claimed"  # not written yet
            lock.rollback()
        wait_for(lambda: count(app, "a", "succeeded") == 1, 10, "job a recorded")
        wait_for(lambda: count(app, "b", "succeeded") == 1, 10, "job b recorded")
        assert [r["outcome"] for r in app.history(a)] == ["succeeded"]
        assert [r["outcome"] for r in app.history(b)] == ["succeeded"]
    finally:
        go_a.set()
        worker.stop(force=True)
        thread.join(15)
        locker.dispose()
        app.close()
