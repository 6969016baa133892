"""Limits hold for every worker together: eight real ``scheduler worker`` processes race over
one limit, and the handlers themselves count what runs at once (a counter row they increment
and decrement in the database) while the run history says when each attempt started. A worker
killed with ``kill -9`` while it holds the limit's places gives them back when another takes
its leases over. SQLite, PostgreSQL (directly and through PgBouncer) and MariaDB."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from helpers.worker_process import WorkerProcess
from helpers.worker_thread import wait_until
from sqlalchemy import Engine, create_engine, select, text

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import runs

WORKERS = 8
JOBS_MODULE = """
import os, pathlib, time
from datetime import datetime
from sqlalchemy import create_engine, text
from scheduler import default_registry

_url = os.environ["LIMITS_TEST_URL"]
# Through PgBouncer (transaction pooling) psycopg must not prepare statements.
_args = {"prepare_threshold": None} if _url.startswith("postgresql") else {}
_engine = create_engine(_url, connect_args=_args)
_counter = os.environ["LIMITS_TEST_TABLE"]
_out = pathlib.Path(os.environ["LIMITS_TEST_OUT"])


def _count(step):
    with _engine.begin() as conn:
        change = f"UPDATE {_counter} SET running = running + :s WHERE id = 1"
        conn.execute(text(change), {"s": step})
        return conn.execute(text(f"SELECT running FROM {_counter} WHERE id = 1")).scalar_one()


def _work(job):
    running = _count(1)
    with _engine.begin() as conn:  # when the claim started this attempt, as the job row says
        claimed = conn.execute(
            text("SELECT started_at FROM scheduler_jobs WHERE id = :id"), {"id": job.id}
        ).scalar_one()
    if isinstance(claimed, str):  # SQLite
        claimed = datetime.fromisoformat(claimed)
    fd = os.open(_out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, f"{job.id} {running} {os.getpid()} {claimed.isoformat()}\\n".encode())
    os.close(fd)
    try:
        if job.payload.get("hang"):
            time.sleep(120)
        time.sleep(job.payload.get("seconds", 0.02))
    finally:
        _count(-1)


@default_registry.handler("lim.work", retry_safe=True)
def work(job):
    _work(job)


@default_registry.handler("lim.hang")
def hang(job):
    _work(job)
"""

LIMITS = """
[[limits]]
name = "api"
handlers = ["lim.work", "lim.hang"]
{keys}
"""


@pytest.fixture
def counter(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """The handlers' counter row, and the environment their module reads."""
    table = f"limit_counter_{os.getpid()}"
    engine = create_engine(
        db_url, connect_args={"prepare_threshold": None} if db_url.startswith("postgres") else {}
    )
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        conn.execute(text(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, running INTEGER)"))
        conn.execute(text(f"INSERT INTO {table} (id, running) VALUES (1, 0)"))
    monkeypatch.setenv("LIMITS_TEST_URL", db_url)
    monkeypatch.setenv("LIMITS_TEST_TABLE", table)
    monkeypatch.setenv("LIMITS_TEST_OUT", str(tmp_path / "starts.txt"))
    (tmp_path / "limit_jobs.py").write_text(JOBS_MODULE)
    yield engine
    engine.dispose()


def write_config(tmp_path: Path, url: str, keys: str, *, lease: int = 30, threads: int = 4) -> Path:
    path = tmp_path / "app.toml"
    path.write_text(
        f'[database]\nurl = "{url}"\n\n[scheduler]\ntick_interval = 1.0\n\n'
        f'[worker]\nimports = ["limit_jobs"]\nconcurrency = {threads}\nlease_seconds = {lease}\n'
        + LIMITS.format(keys=keys)
    )
    return path


def starts(tmp_path: Path) -> list[tuple[int, int, int]]:
    """What the handlers wrote: (job id, attempts running after theirs started, pid)."""
    return [(int(a), int(b), int(c)) for a, b, c, _ in _lines(tmp_path)]


def claimed_at(tmp_path: Path) -> list[datetime]:
    """When each attempt started, as the handler read it from its job row (the claim's)."""
    return sorted(datetime.fromisoformat(at) for *_, at in _lines(tmp_path))


def _lines(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "starts.txt"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def start_workers(tmp_path: Path, config: Path, count: int) -> list[WorkerProcess]:
    workers = [WorkerProcess(tmp_path, config) for _ in range(count)]

    def up() -> bool:
        for worker in workers:
            assert worker.proc.poll() is None, worker.output()
        return all("started" in w.output() for w in workers)

    wait_until(up, 90)
    return workers


def app_for(config: Path) -> Scheduler:
    return Scheduler.from_toml(config, registry=Registry())


@pytest.mark.slow
def test_eight_workers_never_run_more_than_the_concurrency(
    db_url: str, tmp_path: Path, counter: Engine
) -> None:
    # One thread a worker: the three places are held by three workers at least, so the place
    # is raced for between processes even where one worker's own wake-ups would keep every
    # place it holds busy (through PgBouncer no notification wakes the others: they poll)
    config = write_config(tmp_path, db_url, "concurrency = 3", threads=1)
    workers = start_workers(tmp_path, config, WORKERS)
    app = app_for(config)
    try:
        # 80 jobs of 0.25 s under 3 places: ~7 s
        app.enqueue_many([{"handler": "lim.work", "payload": {"seconds": 0.25}}] * 80)
        wait_until(lambda: len(app.jobs(state="succeeded", limit=100)) == 80, 120)
    finally:
        for worker in workers:
            worker.stop()
        app.close()
    seen = starts(tmp_path)
    assert len(seen) == 80
    assert max(running for _, running, _ in seen) <= 3
    assert max(running for _, running, _ in seen) == 3, "the limit was never reached: no race"
    assert len({pid for _, _, pid in seen}) >= 3, "fewer workers than places ran: no race"


@pytest.mark.slow
def test_eight_workers_never_start_more_than_the_rate_in_any_window(
    db_url: str, tmp_path: Path, counter: Engine
) -> None:
    config = write_config(tmp_path, db_url, 'rate = "10/2s"')
    workers = start_workers(tmp_path, config, WORKERS)
    app = app_for(config)
    try:
        app.enqueue_many([{"handler": "lim.work"}] * 40)
        wait_until(lambda: len(app.jobs(state="succeeded", limit=100)) == 40, 120)
    finally:
        for worker in workers:
            worker.stop()
        app.close()
    started = claimed_at(tmp_path)
    assert len(started) == 40
    window = timedelta(seconds=2)
    most = max(sum(1 for t in started if s <= t < s + window) for s in started)
    assert most == 10  # reached, never passed
    assert started[-1] - started[0] >= 3 * window * 0.99  # 40 starts need four windows


@pytest.mark.slow
def test_kill_9_of_a_worker_holding_places_gives_them_back_at_takeover(
    db_url: str, tmp_path: Path, counter: Engine
) -> None:
    config = write_config(tmp_path, db_url, "concurrency = 2", lease=5)
    (victim,) = start_workers(tmp_path, config, 1)
    app = app_for(config)
    try:
        hung = app.enqueue_many([{"handler": "lim.hang", "payload": {"hang": True}}] * 2)
        wait_until(lambda: len(starts(tmp_path)) == 2, 60)
        rest = app.enqueue_many([{"handler": "lim.work"}] * 4)
        time.sleep(1.5)
        assert len(starts(tmp_path)) == 2  # the victim's places are full
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        (heir,) = start_workers(tmp_path, config, 1)
        try:
            wait_until(lambda: len(app.jobs(state="succeeded")) == 4, 60)
        finally:
            heir.stop()
        for job_id in hung:
            job = app.get_job(job_id)
            assert job is not None and (job.state, job.last_error_code) == ("aborted", "abandoned")
        assert {j.id for j in app.jobs(state="succeeded")} == set(rest)
        with app.store.read() as conn:
            taken_over = (
                conn.execute(
                    select(runs.c.finished_at).where(
                        runs.c.job_id.in_(hung), runs.c.outcome == "lost"
                    )
                )
                .scalars()
                .all()
            )
            rest_started = (
                conn.execute(select(runs.c.started_at).where(runs.c.job_id.in_(rest)))
                .scalars()
                .all()
            )
    finally:
        victim.kill()
        app.close()
    # Not one of the others started before the takeover gave the places back.
    assert len(taken_over) == 2 and len(rest_started) == 4
    assert min(rest_started) >= max(taken_over)
    # The counter keeps the killed attempts (their handlers never decremented it): the heir
    # ran at most 2 at once on top of them.
    heir_runs = [r for _, r, pid in starts(tmp_path) if pid != victim.proc.pid]
    assert len(heir_runs) == 4 and max(heir_runs) <= 2 + 2
