"""A worker process killed with SIGKILL mid-job, and what happens to its job (SPEC §1).

The victim (``helpers/queue_worker.py crash``) claims the job under a 1-second lease, starts the
handler, which drops a marker file and sleeps; the test kills it for real. Once the lease has
run out, two rescuers (threads, each its own engine) are released together and call ``work()``
until the job is settled: both see the expired job, only one may take it over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers.queue_worker import append_line, read_lines

from scheduler import Job, Scheduler
from scheduler._model.handlers import Registry
from scheduler._store import jobs as _jobs

HELPER = Path(__file__).resolve().parents[1] / "helpers" / "queue_worker.py"
LEASE_SECONDS = 1


def kill_victim_mid_job(url: str, handler: str, retry_safe: bool, markers: Path) -> None:
    """Start a worker process, wait until its handler runs, then SIGKILL it."""
    started = markers / f"{handler}.started"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HELPER),
            "crash",
            url,
            handler,
            "1" if retry_safe else "0",
            str(markers),
            str(LEASE_SECONDS),
        ],
        cwd=markers,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            if proc.poll() is not None:
                _, err = proc.communicate()
                pytest.fail(
                    f"victim exited {proc.returncode} before its handler ran:\n{err.decode()}"
                )
            assert time.monotonic() < deadline, "victim never started its handler"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


class LateRescuer:
    """A third worker that read the expired job just before the rescuers moved, and acts only
    while one of them is running it: its takeover works on a stale snapshot of the victim's
    lease and must change nothing."""

    def __init__(self, app: Scheduler) -> None:
        self.app = app
        self.snapshot: Job | None = None
        self.won: list[bool] = []

    def look(self, job_id: int) -> None:
        with self.app.store.read() as conn:
            [self.snapshot] = _jobs.expired(conn, now=datetime.now(UTC), limit=10)
        assert (self.snapshot.id, self.snapshot.lease_owner) == (job_id, "victim")

    def act(self) -> None:
        assert self.snapshot is not None
        with self.app.store.begin() as conn:
            won = _jobs.take_over(
                conn,
                self.snapshot,
                owner="late",
                now=datetime.now(UTC),
                lease=timedelta(seconds=30),
                rerun=True,
            )
        self.won.append(won)


def rescue(rescuers: list[Scheduler], job_id: int, late: LateRescuer) -> Job:
    """Once the victim's lease has run out, release every rescuer at the same instant (so they
    all read the expired job before any takes it over), each calling work() until it settles."""
    job = rescuers[0].get_job(job_id)
    assert job is not None and job.lease_expires_at is not None
    time.sleep(max((job.lease_expires_at - datetime.now(UTC)).total_seconds(), 0) + 0.02)
    late.look(job_id)
    barrier = threading.Barrier(len(rescuers))
    errors: list[BaseException] = []

    def rescuer(app: Scheduler) -> None:
        try:
            barrier.wait(10)
            deadline = time.monotonic() + 20
            while True:
                app.work()
                current = app.get_job(job_id)
                if current is not None and current.state in ("succeeded", "aborted"):
                    return
                assert time.monotonic() < deadline, f"job never settled: {current}"
                time.sleep(0.02)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=rescuer, args=(app,)) for app in rescuers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if errors:
        raise errors[0]
    settled = rescuers[0].get_job(job_id)
    assert settled is not None
    return settled


@pytest.fixture
def rescuers(db_url: str) -> Iterator[list[Scheduler]]:
    registry = Registry()
    apps = [
        Scheduler(db_url, registry=registry, worker_id=f"rescuer-{n}", lease_seconds=30)
        for n in (1, 2)
    ]
    yield apps
    for app in apps:
        app.close()


@pytest.fixture
def late(db_url: str) -> Iterator[LateRescuer]:
    app = Scheduler(db_url, registry=Registry(), worker_id="late")
    yield LateRescuer(app)
    app.close()


def victim_claimed(app: Scheduler, job_id: int) -> None:
    job = app.get_job(job_id)
    assert job is not None
    assert (job.state, job.lease_owner, job.attempts) == ("claimed", "victim", 1)


def test_retry_safe_job_runs_again_after_its_worker_is_killed(
    db_url: str, rescuers: list[Scheduler], late: LateRescuer, tmp_path: Path
):
    handler = "crash.retry_safe"
    runs = tmp_path / f"{handler}.runs"

    @rescuers[0].handler(handler, retry_safe=True, max_attempts=3)
    def again(job: Any) -> None:
        append_line(runs, f"rescued {os.getpid()} attempt {job.attempt}")
        late.act()

    job_id = rescuers[0].enqueue(handler, {"order": 7})
    kill_victim_mid_job(db_url, handler, True, tmp_path)
    victim_claimed(rescuers[0], job_id)

    job = rescue(rescuers, job_id, late)
    assert (job.state, job.attempts, job.last_error_code) == ("succeeded", 2, None)
    assert late.won == [False]
    lines = read_lines(runs)
    assert len(lines) == 2 and lines[0].startswith("run ")
    assert lines[1] == f"rescued {os.getpid()} attempt 2"
    history = rescuers[0].history(job_id)
    assert [(r["attempt"], r["outcome"], r["error_code"]) for r in history] == [
        (1, "lost", "lease_expired"),
        (2, "succeeded", None),
    ]
    assert history[0]["worker"] == "victim"
    assert history[1]["worker"].startswith("rescuer-")


def test_non_retry_safe_job_is_abandoned_once_after_its_worker_is_killed(
    db_url: str, rescuers: list[Scheduler], late: LateRescuer, tmp_path: Path
):
    handler = "crash.charge_card"
    runs, abandoned = tmp_path / f"{handler}.runs", tmp_path / f"{handler}.abandoned"

    def on_abandoned(job: Any) -> None:
        append_line(abandoned, f"abandoned {job.id} attempt {job.attempt}")
        late.act()

    @rescuers[0].handler(handler, abandoned=on_abandoned)
    def charge(job: Any) -> None:
        append_line(runs, "charged twice!")

    job_id = rescuers[0].enqueue(handler)
    kill_victim_mid_job(db_url, handler, False, tmp_path)
    victim_claimed(rescuers[0], job_id)

    job = rescue(rescuers, job_id, late)
    assert (job.state, job.last_error_code, job.attempts) == ("aborted", "abandoned", 1)
    assert late.won == [False]
    assert job.lease_owner is None
    assert len(read_lines(runs)) == 1, "the handler ran again"
    assert read_lines(abandoned) == [f"abandoned {job_id} attempt 1"]
    history = rescuers[0].history(job_id)
    assert [(r["attempt"], r["outcome"], r["error_code"]) for r in history] == [
        (1, "lost", "lease_expired"),
        (1, "abandoned", "lease_expired"),
    ]
    assert history[0]["worker"] == "victim"


def test_crash_on_the_last_attempt_ends_aborted_lease_expired(
    db_url: str, rescuers: list[Scheduler], late: LateRescuer, tmp_path: Path
):
    handler = "crash.last_attempt"
    runs = tmp_path / f"{handler}.runs"

    @rescuers[0].handler(handler, retry_safe=True)
    def again(job: Any) -> None:
        append_line(runs, "ran after its last attempt!")

    job_id = rescuers[0].enqueue(handler, max_attempts=1)
    kill_victim_mid_job(db_url, handler, True, tmp_path)
    victim_claimed(rescuers[0], job_id)

    job = rescue(rescuers, job_id, late)
    assert (job.state, job.last_error_code, job.attempts) == ("aborted", "lease_expired", 1)
    late.act()
    assert late.won == [False]
    assert job.lease_owner is None and job.finished_at is not None
    assert len(read_lines(runs)) == 1
    history = rescuers[0].history(job_id)
    assert [(r["attempt"], r["outcome"], r["error_code"], r["worker"]) for r in history] == [
        (1, "lost", "lease_expired", "victim"),
    ]
