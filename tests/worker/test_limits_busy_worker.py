"""A worker kept busy by jobs under a limit (their places handed on from each ending attempt
to the next) still finds a job under no limit that no wake-up announced: it claims jobs under
no limit after a wake-up, a tick or the poll, and at least once a poll's time while its own
jobs' endings keep waking it. Real databases, a real worker on a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.worker_thread import Running, wait_until

from scheduler import Limit, Scheduler
from scheduler._model.handlers import Registry


@pytest.fixture
def apps(db_url: str) -> Iterator[tuple[Scheduler, Scheduler]]:
    registry = Registry()
    limit = Limit("api", handlers=["api.call"], concurrency=2)
    worker_app = Scheduler(db_url, registry=registry, limits=[limit], concurrency=3)
    quiet = Scheduler(db_url, registry=registry, wakeups=False)  # enqueues announce nothing
    yield worker_app, quiet
    worker_app.close()
    quiet.close()


def test_a_job_under_no_limit_is_found_while_limited_jobs_keep_the_worker_busy(
    apps: tuple[Scheduler, Scheduler],
) -> None:
    app, quiet = apps
    calls: list[float] = []
    started = threading.Event()
    plain: list[float] = []

    @app.handler("api.call", retry_safe=True)
    def call(job: Any) -> None:
        calls.append(time.monotonic())
        started.set()
        time.sleep(0.01)

    @app.handler("plain")
    def plain_job(job: Any) -> None:
        plain.append(time.monotonic())

    app.enqueue_many([{"handler": "api.call", "payload": {"n": n}} for n in range(3000)])
    with Running(app):
        assert started.wait(10)
        time.sleep(0.5)  # the limit's places now pass from each ending to the next
        asked = time.monotonic()
        quiet.enqueue("plain")
        wait_until(lambda: plain, seconds=10)
        busy = len(calls)
    assert plain[0] - asked < 3.0  # within a poll or two, not once the limited jobs run out
    assert busy < 3000  # the limited jobs were still running
