"""The worker: graceful SIGTERM, leases kept alive, database errors survived, the example demo."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import write_config
from helpers.worker_process import WorkerProcess
from sqlalchemy import create_engine, select, text
from sqlalchemy.exc import OperationalError

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import workers
from scheduler._worker.worker import MAX_TICK_OFFSET, Worker, tick_offset, until_next_tick

ROOT = Path(__file__).resolve().parents[2]

OWN_APP_MODULE = '''
"""Its own Scheduler.from_toml (the CLI exports SCHEDULER_CONFIG); lands in default_registry."""
import os, pathlib, time
from scheduler import Scheduler

app = Scheduler.from_toml(os.environ["SCHEDULER_CONFIG"])

@app.handler("t.slow", retry_safe=True)
def slow(job):
    pathlib.Path(job.payload["started"]).touch()
    time.sleep(job.payload["seconds"])
'''


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def spawn() -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(cwd: Path, config: Path, *args: str) -> WorkerProcess:
        started.append(WorkerProcess(cwd, config, *args))
        return started[-1]

    yield start
    for process in started:
        process.kill()


@pytest.fixture
def client(db_url_sp: str) -> Iterator[Scheduler]:
    app = Scheduler(db_url_sp, registry=Registry())
    yield app
    app.close()


def slow_job(app: Scheduler, tmp_path: Path, name: str, seconds: float) -> int:
    started = tmp_path / f"{name}.started"
    return app.enqueue("t.slow", {"started": str(started), "seconds": seconds})


def worker_rows(app: Scheduler) -> list[Any]:
    with app.store.read() as conn:
        return list(conn.execute(select(workers)))


def test_sigterm_lets_the_running_job_finish(
    db_url_sp: str, client: Scheduler, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    (tmp_path / "own_jobs.py").write_text(OWN_APP_MODULE)
    config = write_config(tmp_path, db_url_sp, worker="concurrency = 1\n")
    config.write_text(config.read_text().replace('"cli_jobs"', '"own_jobs"'))
    first = slow_job(client, tmp_path, "first", 2.0)
    second = slow_job(client, tmp_path, "second", 2.0)
    worker = spawn(tmp_path, config)
    wait_for((tmp_path / "first.started").exists, 20, "the first job to start")
    assert len(worker_rows(client)) == 1  # registered while alive

    assert worker.stop() == 0, worker.output()
    assert client.get_job(first).state == "succeeded"  # type: ignore[union-attr]
    waiting = client.get_job(second)
    assert (waiting.state, waiting.attempts) == ("queued", 0)  # type: ignore[union-attr]
    assert "SIGTERM: stopping" in worker.output()
    # Unregistered on a clean exit; its last tick stays on record under the host's entry.
    assert [w.id for w in worker_rows(client)] == [f"{socket.gethostname()}:tick"]


def test_jobs_still_running_after_the_grace_are_left_to_their_lease(
    tmp_path: Path, sqlite_template: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    db = tmp_path / "grace.db"
    shutil.copy(sqlite_template, db)
    client = Scheduler(f"sqlite:///{db}", registry=Registry())
    config = write_config(tmp_path, f"sqlite:///{db}", worker="shutdown_grace_seconds = 0.5\n")
    job = slow_job(client, tmp_path, "stuck", 60.0)
    worker = spawn(tmp_path, config)
    wait_for((tmp_path / "stuck.started").exists, 20, "the job to start")
    began = time.monotonic()
    assert worker.stop() == 0, worker.output()
    assert time.monotonic() - began < 10
    assert "still running, left to lease expiry" in worker.output()
    assert client.get_job(job).state == "claimed"  # type: ignore[union-attr]
    client.close()


def test_database_errors_are_retried_with_backoff(
    tmp_path: Path,
    sqlite_template: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = tmp_path / "flaky.db"
    shutil.copy(sqlite_template, db)
    # A 2.4 s lease (below what a config file allows): the heartbeat renews it every 0.8 s.
    app = Scheduler(f"sqlite:///{db}", registry=Registry(), tick_interval=0.05, lease_seconds=2.4)
    leases: list[datetime] = []

    @app.handler("t.watch", retry_safe=True)
    def watch(job: Any) -> None:  # outlives its first lease: only heartbeats let it finish
        leases.append(app.get_job(job.id).lease_expires_at)  # type: ignore[union-attr,arg-type]
        time.sleep(2.8)
        leases.append(app.get_job(job.id).lease_expires_at)  # type: ignore[union-attr,arg-type]

    calls = 0
    real_tick = app.tick  # the worker's tick (it records its ticks with its presence)

    def flaky_tick(now: datetime | None = None, *, record: bool = True) -> Any:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))
        return real_tick(now, record=record)

    monkeypatch.setattr(app, "tick", flaky_tick)
    job = app.enqueue("t.watch", {})
    worker = Worker(app, concurrency=2)
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(worker.run()))
    with caplog.at_level(logging.INFO, logger="scheduler"):
        thread.start()
        wait_for(lambda: app.get_job(job).state == "succeeded", 20, "the job")  # type: ignore[union-attr]
        assert calls > 3 and len(worker_rows(app)) == 1
        worker.stop()
        thread.join(20)
    assert results[0].handled == 1 and results[0].left_running == 0
    assert leases[1] - leases[0] >= timedelta(seconds=1.5)
    text = caplog.text
    assert "database error in tick: server closed the connection; retrying in 0.5s" in text
    assert "retrying in 1s" in text
    assert [w.id for w in worker_rows(app)] == [f"{socket.gethostname()}:tick"]
    app.close()


def test_killed_connections_lose_no_job(
    direct_pg_url: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    pg_url = direct_pg_url  # the worker's own backends to terminate: never through PgBouncer
    victim = f"{pg_url}&application_name=sched_worker_{os.getpid()}"
    survive_database_outage(victim, tmp_path, spawn, lambda: terminate_backends(pg_url, victim))


def pg_restart_allowed() -> str | None:
    if shutil.which("pg_ctlcluster") is None or not Path("/etc/postgresql").is_dir():
        return "pg_ctlcluster is not available"
    if not (os.environ.get("CI") or os.environ.get("SCHEDULER_TEST_PG_RESTART")):
        return "restarts the shared server: set SCHEDULER_TEST_PG_RESTART=1 (CI runs it)"
    return None


@pytest.mark.slow
@pytest.mark.exclusive
def test_postgresql_restart_loses_no_job(
    pg_url: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    reason = pg_restart_allowed()
    if reason:
        pytest.skip(reason)
    survive_database_outage(pg_url, tmp_path, spawn, restart_postgresql)


def survive_database_outage(
    url: str, tmp_path: Path, spawn: Callable[..., WorkerProcess], outage: Callable[[], None]
) -> None:
    client = Scheduler(url, registry=Registry())
    config = write_config(tmp_path, url, worker="concurrency = 3\n")
    ids = [slow_job(client, tmp_path, f"before-{i}", 0.3) for i in range(12)]
    worker = spawn(tmp_path, config)

    def done() -> int:
        return sum(client.get_job(i).state == "succeeded" for i in ids)  # type: ignore[union-attr]

    wait_for(lambda: done() >= 3, 20, "a few jobs to succeed")
    outage()
    ids += [slow_job(client, tmp_path, f"after-{i}", 0.1) for i in range(6)]
    wait_for(lambda: done() == len(ids), 40, "every job to succeed")
    assert worker.proc.poll() is None, worker.output()
    assert worker.stop() == 0, worker.output()
    client.close()


def terminate_backends(admin_url: str, victim_url: str) -> None:
    """Kill the worker's connections again and again for a second and a half."""
    name = victim_url.rsplit("application_name=", 1)[1]
    engine = create_engine(admin_url)
    killed = 0
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        with engine.begin() as conn:
            killed += conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = :name"
                ),
                {"name": name},
            ).scalar_one()
        time.sleep(0.02)
    engine.dispose()
    assert killed, "the worker had no connection to kill"


def restart_postgresql() -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    for _ in range(60):
        ready = subprocess.run(
            ["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"], check=False, timeout=10
        )
        if ready.returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError("PostgreSQL did not come back")


def test_the_example_configuration_alerts(
    tmp_path: Path,
    sqlite_template: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = tmp_path / "example.db"
    shutil.copy(sqlite_template, db)
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", f"sqlite:///{db}")
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    app = Scheduler.from_toml(ROOT / "app.example.toml", clock=lambda: now[0])
    __import__(app.worker_settings.imports[0])  # what the worker does at start-up
    app.sync()
    with caplog.at_level(logging.INFO, logger="scheduler"):
        for step in range(1, 6):
            now[0] = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=5 * step)
            app.tick()
            app.work()
    flaky, heartbeat = app.get_row("flaky-sync"), app.get_row("heartbeat")
    assert flaky is not None and heartbeat is not None
    assert (flaky.enabled, flaky.disabled_reason, flaky.consecutive_failures) == (
        False,
        "max_consecutive_failures",
        3,
    )
    assert (heartbeat.enabled, heartbeat.last_job_state) == (True, "succeeded")
    alerts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT")]
    assert alerts == [
        "ALERT: task 'flaky-sync' disabled after 3 consecutive failures"
        " (last error upstream_unavailable)"
    ]
    app.close()


class _ChecksLate(Worker):
    """A worker whose jobs all finish between a fill and the loop's "anything left?" check:
    what fast jobs on many threads sometimes do (the scheduling of threads made real)."""

    def _fill(self, pool: Any) -> int | None:
        submitted = super()._fill(pool)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self._lock:
                if not self._running:
                    break
            time.sleep(0.001)
        return submitted


def test_once_drains_every_ready_job_even_when_each_batch_ends_before_the_check(
    app: Scheduler,
) -> None:
    app.handler("fast", retry_safe=True)(lambda job: None)
    for _ in range(30):
        app.enqueue("fast", {})
    result = _ChecksLate(app, concurrency=2).run(once=True)
    assert result.handled == 30
    with app.store.read() as conn:
        states = conn.execute(text("SELECT state, count(*) FROM scheduler_jobs GROUP BY state"))
        assert dict(states.all()) == {"succeeded": 30}


@pytest.mark.parametrize(
    ("wall", "interval", "offset", "expected"),
    [
        (100.30, 1.0, 0.02, 0.72),  # mid-interval: wait for the next whole second + offset
        (100.01, 1.0, 0.02, 0.01),  # just before this second's tick
        (100.02, 1.0, 0.02, 1.00),  # on the tick: the next one, a whole interval on
        (7.20, 5.0, 0.01, 2.81),  # multiples of 5 s: 10.01
        (0.35, 0.25, 0.0, 0.15),
    ],
)
def test_ticks_fall_on_the_wall_clock_grid_plus_the_offset(
    wall: float, interval: float, offset: float, expected: float
) -> None:
    assert until_next_tick(wall, interval, offset) == pytest.approx(expected)


def test_each_worker_has_a_stable_small_offset() -> None:
    offsets = [tick_offset(f"host:{pid}", 1.0) for pid in range(200)]
    assert offsets == [tick_offset(f"host:{pid}", 1.0) for pid in range(200)]
    assert all(0 <= o < MAX_TICK_OFFSET for o in offsets)
    assert len({round(o, 4) for o in offsets}) > 150  # spread, not one value
    assert all(0 <= tick_offset(f"host:{pid}", 0.1) < 0.01 for pid in range(200))  # interval/10


class _RecordsTicks(Worker):
    def __init__(self, app: Scheduler) -> None:
        super().__init__(app, concurrency=1)
        self.walls: list[float] = []

    def _tick(self) -> None:
        self.walls.append(time.time())
        super()._tick()


def test_the_worker_ticks_on_the_grid_whatever_its_start(tmp_path: Path) -> None:
    """Started half-way between two grid points, the worker ticks at once and then on the grid
    (plus its offset): a cron slot on a whole second no longer waits up to a whole interval."""
    app = Scheduler(f"sqlite:///{tmp_path / 'grid.db'}", tick_interval=1.0)
    app.migrate()
    worker = _RecordsTicks(app)
    offset = tick_offset(app.worker_id, 1.0)
    time.sleep(until_next_tick(time.time(), 1.0, offset + 0.5))  # half-way
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: len(worker.walls) >= 4, 10, "four ticks")
    finally:
        worker.stop()
        thread.join(10)
        app.close()
    phases = [(wall - offset) % 1.0 for wall in worker.walls]
    assert 0.4 < phases[0] < 0.75  # the first tick: at start, mid-interval
    late = [round(p, 3) for p in phases[1:4] if p > 0.25]  # 0.25 s of slack for a busy machine
    assert late == [], phases


def test_a_once_worker_leaves_its_tick_on_record_for_status(app: Scheduler) -> None:
    """cron(8) running `worker --once`: between runs `status` still sees the last tick (under
    the host's one-shot entry, as `scheduler tick` records it) and warns of nothing."""

    from scheduler import TaskSpec

    app.handler("t.ok", retry_safe=True)(lambda job: None)
    every_minute = TaskSpec(
        name="every-minute", cron="* * * * *", handler="t.ok", payload={}, timezone="UTC"
    )
    app.sync([every_minute])
    before = app.status()["health"]
    assert before["warnings"] == ["no worker is running: start `scheduler worker`"]
    began = datetime.now(UTC)
    Worker(app, concurrency=1).run(once=True)
    health = app.status()["health"]
    assert health["warnings"] == []
    assert health["workers"] == []  # it stopped: not counted as running
    assert began <= datetime.fromisoformat(health["last_tick_at"]) <= datetime.now(UTC)


def _leases_lost(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "leases_lost"]


def test_a_job_recorded_while_the_heartbeat_runs_is_not_a_lost_lease(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat renews the leases of the jobs still running; one whose outcome was just
    written (its lease ended with it) but that has not left the worker's running set yet is
    not lost. A slow log sink holds the recorder right after its commit, at the job's `job N
    succeeded` line, for three heartbeats (a 1 s lease is renewed every 0.5 s): each used to
    warn "1 of 1 running job(s) lost their lease"."""
    app = Scheduler(db_url, registry=Registry(), lease_seconds=1)

    @app.handler("quick")
    def quick(job: Any) -> None:
        pass

    class SlowSink(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "action", "") == "job_done":
                time.sleep(1.5)

    sink = SlowSink()
    logging.getLogger("scheduler").addHandler(sink)
    try:
        job_id = app.enqueue("quick")
        with caplog.at_level(logging.INFO, logger="scheduler"):
            with app.background_worker(concurrency=1):
                wait_for(lambda: app.get_job(job_id).state == "succeeded", 10, "the job")  # type: ignore[union-attr]
                time.sleep(1.6)  # the sink's wait, and the heartbeats during it
    finally:
        logging.getLogger("scheduler").removeHandler(sink)
        app.close()
    assert any(getattr(r, "action", "") == "job_done" for r in caplog.records)
    assert _leases_lost(caplog) == []


def test_a_lease_taken_from_a_running_job_is_reported_lost(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The other side of the test above: a lease that another worker holds now is lost, and
    the heartbeat says so while the job still runs; its outcome is then discarded."""
    app = Scheduler(db_url, registry=Registry(), lease_seconds=1)
    started, finish = threading.Event(), threading.Event()

    @app.handler("long")
    def long(job: Any) -> None:
        started.set()
        finish.wait(10)

    job_id = app.enqueue("long")
    try:
        with caplog.at_level(logging.INFO, logger="scheduler"):
            with app.background_worker(concurrency=1):
                assert started.wait(10)
                with app.store.engine.begin() as conn:
                    conn.execute(
                        text("UPDATE scheduler_jobs SET lease_owner = 'another' WHERE id = :id"),
                        {"id": job_id},
                    )
                wait_for(lambda: bool(_leases_lost(caplog)), 5, "the heartbeat's warning")
                finish.set()
                wait_for(
                    lambda: any("lease lost before it finished" in m for m in caplog.messages),
                    10,
                    "the outcome's warning",
                )
    finally:
        finish.set()
        app.close()
    assert _leases_lost(caplog)[0] == "1 of 1 running job(s) lost their lease"
