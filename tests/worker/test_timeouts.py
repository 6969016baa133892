"""Timeouts (``@app.handler(timeout=...)``, ``[worker] cancel_grace``): a running attempt is
asked to stop at its limit and fenced after the grace, with a real worker, real time and real
threads on every engine (docs/howto/timeouts.md)."""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.worker_thread import Running, wait_until

from scheduler import Cancelled, ConfigError, LeaseLost, RunningJob, Scheduler, TaskSpec
from scheduler._config import load_config
from scheduler._model.handlers import Registry
from scheduler._worker.worker import PREFETCH_FACTOR, Worker

LIMIT, GRACE = 0.5, 0.5
# Upper bounds carry this much slack for a loaded machine (the suite runs beside other work):
# every handler here runs 30 s or for ever unless it is stopped, so they still tell.
SLACK = 8.0


@pytest.fixture
def quick(db_url: str) -> Iterator[Scheduler]:
    """A Scheduler with its own registry, two threads, a grace of half a second."""
    app = Scheduler(db_url, registry=Registry(), concurrency=2, cancel_grace=GRACE)
    yield app
    app.close()


def ended(app: Scheduler, job_id: int) -> tuple[str, str | None] | None:
    job = app.get_job(job_id)
    assert job is not None
    return (job.state, job.last_error_code) if job.state in ("succeeded", "aborted") else None


def outcomes(app: Scheduler, job_id: int) -> list[tuple[str, str | None]]:
    return [(r["outcome"], r["error_code"]) for r in app.history(job_id)]


def test_a_sync_handler_that_checks_stops_at_its_timeout(quick: Scheduler) -> None:
    seen: list[str] = []

    @quick.handler("s.checks", timeout=LIMIT)
    def checks(job: RunningJob) -> None:
        assert not job.cancel_requested
        for _ in range(400):  # 20 s if never stopped
            time.sleep(0.05)
            try:
                job.check()
            except Cancelled:
                seen.append("cancelled")
                raise

    job_id = quick.enqueue("s.checks")
    began = time.monotonic()
    Worker(quick, serve_metrics=False).run(once=True)
    took = time.monotonic() - began
    assert seen == ["cancelled"]
    assert ended(quick, job_id) == ("aborted", "timeout")
    assert outcomes(quick, job_id) == [("aborted", "timeout")]
    assert LIMIT <= took < LIMIT + GRACE + SLACK  # stopped at the limit, well within the grace


def test_a_retry_safe_handler_that_times_out_is_retried(quick: Scheduler) -> None:
    quick.settings = quick.settings.__class__(
        **{**quick.settings.__dict__, "backoff_base_seconds": 0.1, "backoff_max_seconds": 0.1}
    )
    calls: list[int] = []

    @quick.handler("s.once_slow", timeout=LIMIT, retry_safe=True, max_attempts=2)
    def once_slow(job: RunningJob) -> None:
        calls.append(job.attempt)
        while job.attempt == 1:
            time.sleep(0.02)
            job.check()

    job_id = quick.enqueue("s.once_slow")
    with Running(quick):
        assert wait_until(lambda: ended(quick, job_id)) == ("succeeded", None)
    assert calls == [1, 2]
    assert outcomes(quick, job_id) == [("failed", "timeout"), ("succeeded", None)]


def test_a_handler_blocked_for_good_is_fenced_and_its_thread_counted(quick: Scheduler) -> None:
    """Blocked in a socket read that never checks: after the grace the worker ends the attempt
    itself; the thread's late heartbeat and return change nothing; the worker runs one job
    fewer at once and ``status`` says so until the thread returns."""
    ours, theirs = socket.socketpair()
    late: list[str] = []

    @quick.handler("s.hangs", timeout=LIMIT)
    def hangs(job: RunningJob) -> None:
        ours.recv(1)  # never checks
        try:
            job.heartbeat()
        except LeaseLost:
            late.append("heartbeat refused")

    @quick.handler("s.quick")
    def fine(job: RunningJob) -> None:
        pass

    try:
        job_id = quick.enqueue("s.hangs")
        with Running(quick) as worker:
            began = time.monotonic()
            assert wait_until(lambda: ended(quick, job_id)) == ("aborted", "timeout")
            took = time.monotonic() - began
            assert LIMIT + GRACE <= took < LIMIT + GRACE + SLACK
            assert worker.stuck_threads() == 1
            assert worker._capacity() in (1, PREFETCH_FACTOR)  # two threads, one hung
            line = f"1 attempt(s) still running past their stop on worker {quick.worker_id}"
            wait_until(lambda: any(line in w for w in quick.status()["health"]["warnings"]))
            other = quick.enqueue("s.quick")  # the free thread still runs jobs
            assert wait_until(lambda: ended(quick, other)) == ("succeeded", None)

            theirs.send(b"x")  # the socket answers at last: the thread returns
            wait_until(lambda: late)
            wait_until(lambda: worker.stuck_threads() == 0)
            assert worker._capacity() in (2, 2 * PREFETCH_FACTOR)
            wait_until(lambda: not any(line in w for w in quick.status()["health"]["warnings"]))
        assert late == ["heartbeat refused"]
        assert ended(quick, job_id) == ("aborted", "timeout")
        assert outcomes(quick, job_id) == [("aborted", "timeout")]  # its return wrote nothing
    finally:
        ours.close()
        theirs.close()


def test_an_async_handler_is_cancelled_at_its_timeout(quick: Scheduler) -> None:
    seen: list[str] = []

    @quick.handler("a.sleeps", timeout=LIMIT)
    async def sleeps(job: RunningJob) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    job_id = quick.enqueue("a.sleeps")
    began = time.monotonic()
    Worker(quick, serve_metrics=False).run(once=True)
    took = time.monotonic() - began
    assert seen == ["cancelled"]
    assert ended(quick, job_id) == ("aborted", "timeout")
    assert outcomes(quick, job_id) == [("aborted", "timeout")]
    assert LIMIT <= took < LIMIT + SLACK


def test_a_hung_job_holds_its_task_at_most_timeout_plus_grace(quick: Scheduler) -> None:
    """A task every second whose first run hangs: its row is held while the run is in flight,
    for at most timeout + cancel_grace; the next slot reruns the job in place."""
    ours, theirs = socket.socketpair()
    runs: list[float] = []

    @quick.handler("s.first_hangs", timeout=LIMIT)
    def first_hangs(job: RunningJob) -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            ours.recv(1)

    quick.tasks = (TaskSpec("every-second", "* * * * * *", "s.first_hangs"),)
    quick.sync()
    try:
        with Running(quick):
            row = wait_until(lambda: last_job(quick))
            first = wait_until(lambda: len(runs) >= 1 and runs[0])
            wait_until(lambda: len(runs) >= 2)
            held = runs[1] - first
            assert LIMIT + GRACE <= held < LIMIT + GRACE + SLACK
            wait_until(lambda: ended(quick, row) == ("succeeded", None))
        assert last_job(quick) == row  # rerun in place, same job
        assert outcomes(quick, row)[:2] == [("aborted", "timeout"), ("succeeded", None)]
    finally:
        theirs.send(b"x")
        ours.close()
        theirs.close()


def last_job(app: Scheduler) -> int | None:
    row = app.get_row("every-second")
    assert row is not None
    return row.last_job_id


@pytest.mark.parametrize(
    ("timeout", "error", "says"),
    [
        (-1, ValueError, "got -1"),
        (math.nan, ValueError, "got nan"),
        (math.inf, ValueError, "got inf"),
        ("5", TypeError, "got str"),
        (True, TypeError, "got bool"),
    ],
)
def test_a_bad_timeout_is_refused_at_registration(timeout: Any, error: type, says: str) -> None:
    registry = Registry()
    with pytest.raises(error, match=f"handler 'h.bad': timeout must be .*{says}"):

        @registry.handler("h.bad", timeout=timeout)
        def bad(job: RunningJob) -> None:
            pass

    assert "h.bad" not in registry


def test_no_timeout_by_default_and_zero_is_none() -> None:
    registry = Registry()

    @registry.handler("h.none", timeout=0)
    def none(job: RunningJob) -> None:
        pass

    handler = registry.get("h.none")
    assert handler is not None and handler.timeout is None


@pytest.mark.parametrize(
    ("value", "says"), [("-1", "at least 0, got -1"), ('"soon"', "expected a number")]
)
def test_a_bad_cancel_grace_is_one_line_naming_file_and_key(
    tmp_path: Path, value: str, says: str
) -> None:
    path = tmp_path / "scheduler.toml"
    path.write_text(f"[worker]\ncancel_grace = {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message and "[worker]" in message and "cancel_grace" in message
    assert says in message


def test_cancel_grace_defaults_to_ten_seconds(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.toml"
    path.write_text("[worker]\ncancel_grace = 2.5\n")
    assert load_config(str(path)).worker.cancel_grace == 2.5
    path.write_text("[worker]\n")
    assert load_config(str(path)).worker.cancel_grace == 10.0
