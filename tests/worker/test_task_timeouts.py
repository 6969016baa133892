"""A task's ``timeout`` (TOML, ``TaskSpec``, ``put_task``) wins over its handler's for the
task's jobs: a real worker, real threads, real time for the attempts; the scheduler's clock is
a ManualClock so that the every-minute task's next slot comes when the test says."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers.worker_thread import Running, wait_until
from sqlalchemy import func, select

from scheduler import ConfigError, RunningJob, Scheduler, TaskSpec
from scheduler._config import SchedulerSettings, WorkerSettings, load_config
from scheduler._model.handlers import Registry
from scheduler._store.tables import audit, rows
from scheduler.testing import ManualClock

LIMIT, GRACE = 0.5, 0.5
SLOT = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    found = Scheduler(
        db_url,
        registry=Registry(),
        clock=ManualClock(SLOT - timedelta(seconds=30)),
        settings=SchedulerSettings(tick_interval=0.2),
        worker=WorkerSettings(concurrency=2, cancel_grace=GRACE),
    )
    yield found
    found.close()


def _dispatch(app: Scheduler, spec: TaskSpec) -> int:
    """Create the task half a minute before SLOT, tick at SLOT; the job dispatched."""
    app.put_task(spec)
    assert isinstance(app.clock, ManualClock)
    app.clock.set(SLOT)
    assert app.tick(now=SLOT).dispatched == [spec.name]
    row = app.get_row(spec.name)
    assert row is not None and row.last_job_id is not None
    return row.last_job_id


def _job(app: Scheduler, job_id: int) -> tuple[str, str | None]:
    job = app.get_job(job_id)
    assert job is not None
    return job.state, job.last_error_code


def test_a_hung_every_minute_job_holds_its_row_at_most_timeout_plus_grace(
    app: Scheduler,
) -> None:
    """The handler's timeout is a minute; the task's, half a second, wins. The first run
    hangs for good (a thread blocked on an event nobody sets until the end): its row is held
    for timeout + cancel_grace, then the job ends ``timeout``; the next minute's slot reruns
    it in place and that run succeeds."""
    hang = threading.Event()
    runs: list[float] = []

    @app.handler("m.first_hangs", timeout=60, max_attempts=1)
    def first_hangs(job: RunningJob) -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            hang.wait(60)  # never checks: only the fence ends this attempt

    job_id = _dispatch(app, TaskSpec("every-minute", "* * * * *", "m.first_hangs", timeout=LIMIT))
    row = app.get_row("every-minute")
    assert row is not None and row.timeout == LIMIT
    try:
        with Running(app) as worker:
            began = wait_until(lambda: runs and runs[0])
            wait_until(lambda: _job(app, job_id)[0] == "aborted", 10)
            held = time.monotonic() - began
            assert _job(app, job_id) == ("aborted", "timeout")
            assert LIMIT + GRACE <= held < LIMIT + GRACE + 8.0  # never the handler's minute
            assert worker.stuck_threads() == 1  # the hung thread, counted
            assert isinstance(app.clock, ManualClock)
            app.clock.set(SLOT + timedelta(minutes=1))  # the next slot: the worker ticks
            wait_until(lambda: _job(app, job_id) == ("succeeded", None), 10)
        row = app.get_row("every-minute")
        assert row is not None and row.last_job_id == job_id  # rerun in place, same job
        outcomes = [(r["outcome"], r["error_code"]) for r in app.history(job_id)]
        assert outcomes == [("aborted", "timeout"), ("succeeded", None)]
        assert len(runs) == 2
    finally:
        hang.set()


def test_a_task_timeout_of_zero_lifts_the_handlers(app: Scheduler) -> None:
    @app.handler("m.slow", timeout=LIMIT)
    def slow(job: RunningJob) -> None:
        time.sleep(LIMIT + GRACE + 0.5)  # past the handler's limit and grace

    job_id = _dispatch(app, TaskSpec("unbounded", "* * * * *", "m.slow", timeout=0))
    row = app.get_row("unbounded")
    assert row is not None and row.timeout == 0
    with Running(app):
        wait_until(lambda: _job(app, job_id)[0] in ("succeeded", "aborted"), 10)
    assert _job(app, job_id) == ("succeeded", None)


def test_a_task_without_timeout_keeps_its_handlers(app: Scheduler) -> None:
    @app.handler("m.hangs", timeout=LIMIT, max_attempts=1)
    def hangs(job: RunningJob) -> None:
        while True:
            time.sleep(0.02)
            job.check()

    job_id = _dispatch(app, TaskSpec("bounded", "* * * * *", "m.hangs"))
    row = app.get_row("bounded")
    assert row is not None and row.timeout is None
    with Running(app):
        wait_until(lambda: _job(app, job_id)[0] in ("succeeded", "aborted"), 10)
    assert _job(app, job_id) == ("aborted", "timeout")


def _count(app: Scheduler, table: Any) -> int:
    with app.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (-1, "must be a positive number of seconds (0 for no limit), got -1"),
        (float("nan"), "must be a positive number of seconds (0 for no limit), got nan"),
        ("30", "expected a number of seconds (0 for no limit), got '30'"),
        (True, "expected a number of seconds (0 for no limit), got True"),
    ],
)
def test_put_task_refuses_a_bad_timeout_and_writes_nothing(
    app: Scheduler, value: Any, says: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        app.put_task(TaskSpec("bad", "* * * * *", "m.any", timeout=value))
    assert str(refused.value) == f"task 'bad': key 'timeout': {says}"
    assert _count(app, rows) == 0 and _count(app, audit) == 0


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("-5", "must be a positive number of seconds (0 for no limit), got -5"),
        ('"soon"', "expected a number of seconds (0 for no limit), got 'soon'"),
        ("nan", "must be a positive number of seconds (0 for no limit), got nan"),
    ],
)
def test_a_bad_timeout_in_the_file_is_one_line_naming_file_task_and_key(
    tmp_path: Path, value: str, says: str
) -> None:
    path = tmp_path / "app.toml"
    path.write_text(
        f'[[tasks]]\nname = "nightly"\ncron = "0 3 * * *"\nhandler = "h"\ntimeout = {value}\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_config(str(path))
    message = str(refused.value)
    assert "\n" not in message
    assert str(path) in message and "'nightly'" in message and "timeout" in message
    assert says in message


def test_the_files_timeout_is_synced_and_shown(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "app.toml"
    path.write_text(
        f'[database]\nurl = "{db_url}"\n\n'
        '[[tasks]]\nname = "nightly"\ncron = "0 3 * * *"\nhandler = "h"\ntimeout = 90\n'
    )
    (spec,) = load_config(str(path)).tasks
    assert spec.timeout == 90.0
    app = Scheduler.from_toml(str(path))
    try:
        app.sync()
        row = app.get_row("nightly")
        assert row is not None and row.timeout == 90.0
        (shown,) = app.status()["rows"]
        assert shown["timeout"] == 90.0
        assert app.explain("nightly")["policies"]["timeout"] == 90.0
        assert app.sync().unchanged == ["nightly"]  # the stored float compares equal
    finally:
        app.close()
