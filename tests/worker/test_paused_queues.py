"""Paused queues (``app.pause_queue`` / ``scheduler pause``): every worker stops claiming from
the queue within a second, running jobs finish, other queues go on, a resume lets the jobs run.
Real workers on threads of their own (each its own Scheduler and connections), real time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.worker_thread import Running, wait_until

from scheduler import Scheduler
from scheduler._config import WorkerSettings
from scheduler._model.handlers import Registry
from scheduler._worker.worker import PRESENCE_SECONDS

HONOURED_WITHIN = 1.0  # seconds from the pause's commit to the last claim from the queue
QUEUES = ("default", "other")


def _app(db_url: str, ran: list[tuple[str, float]], release: threading.Event) -> Scheduler:
    app = Scheduler(
        db_url, registry=Registry(), worker=WorkerSettings(concurrency=2, queues=QUEUES)
    )

    @app.handler("p.quick")
    def quick(job: Any) -> None:
        ran.append((job.payload["tag"], time.monotonic()))

    @app.handler("p.other", queue="other")
    def other(job: Any) -> None:
        ran.append((job.payload["tag"], time.monotonic()))

    @app.handler("p.long")
    def long(job: Any) -> None:
        ran.append(("long-started", time.monotonic()))
        assert release.wait(30)

    return app


@pytest.fixture
def two(
    db_url: str,
) -> Iterator[tuple[Scheduler, Scheduler, list[tuple[str, float]], threading.Event]]:
    ran: list[tuple[str, float]] = []
    release = threading.Event()
    first, second = _app(db_url, ran, release), _app(db_url, ran, release)
    yield first, second, ran, release
    release.set()
    first.close()
    second.close()


def _state(app: Scheduler, job_id: int) -> str:
    job = app.get_job(job_id)
    assert job is not None
    return job.state


def test_every_worker_stops_claiming_within_a_second_and_resumes(
    two: tuple[Scheduler, Scheduler, list[tuple[str, float]], threading.Event],
) -> None:
    assert PRESENCE_SECONDS < HONOURED_WITHIN
    first, second, ran, release = two
    long_id = first.enqueue("p.long")
    with Running(first), Running(second):
        wait_until(lambda: any(tag == "long-started" for tag, _ in ran))
        assert first.pause_queue("default", reason="deploy") is True
        paused_at = time.monotonic()
        # Jobs enqueued from the moment the pause is a second old are claimed by nobody.
        time.sleep(HONOURED_WITHIN)
        waiting = [first.enqueue("p.quick", {"tag": f"q{i}"}) for i in range(6)]
        other = first.enqueue("p.other", {"tag": "other"})
        wait_until(lambda: _state(first, other) == "succeeded")  # other queues go on
        release.set()  # the running job of the paused queue finishes
        wait_until(lambda: _state(first, long_id) == "succeeded")
        time.sleep(1.5)  # several polls of both workers
        assert [_state(first, j) for j in waiting] == ["queued"] * 6
        assert not [tag for tag, _ in ran if tag.startswith("q")]
        assert time.monotonic() - paused_at > 2.5
        assert second.resume_queue("default") is True
        resumed_at = time.monotonic()
        wait_until(lambda: all(_state(first, j) == "succeeded" for j in waiting), 10)
    started = [at for tag, at in ran if tag.startswith("q")]
    assert len(started) == 6
    assert min(started) - resumed_at < 2.0  # within a poll of the resume


def test_work_leaves_a_paused_queue_alone(db_url: str) -> None:
    ran: list[tuple[str, float]] = []
    app = _app(db_url, ran, threading.Event())
    try:
        app.pause_queue("default")
        job_id = app.enqueue("p.quick", {"tag": "q"})
        other = app.enqueue("p.other", {"tag": "other"})
        assert app.work(limit=5) == 1  # the other queue's job only
        assert _state(app, job_id) == "queued"
        assert _state(app, other) == "succeeded"
        app.resume_queue("default")
        assert app.work(limit=5) == 1
        assert _state(app, job_id) == "succeeded"
    finally:
        app.close()
