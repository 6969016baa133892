"""Wake-ups (scheduler/_wakeup.py): real LISTEN connections, real redis-server processes started
here on free ports, real worker processes whose safety-net poll is made a minute long, so that
only a wake-up can start a job within the tests' waits.

redis-server (Debian's package) is required under CI=true; elsewhere its tests skip.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import MYSQL_URL, PG_URL, make_url
from helpers.redis_server import RedisServer
from helpers.redis_server import redis_server as redis_server  # the fixture
from sqlalchemy import func, select, text

from scheduler import Scheduler
from scheduler._config import parse_config
from scheduler._errors import ConfigError
from scheduler._model.handlers import Registry
from scheduler._store import wakeup as _wakeup
from scheduler._store.jobs import insert_job, new_job_values
from scheduler._store.status import health as _health
from scheduler._store.tables import jobs

HERE = Path(__file__).resolve().parent
WORKER = HERE.parent / "helpers" / "wakeup_worker.py"
LONG_POLL = 60.0  # the workers' safety-net poll in these tests: only a wake-up is quicker
WAIT = 30.0  # how long a test waits for what a wake-up brings within milliseconds


def wait_for(condition: Callable[[], Any], timeout: float = WAIT, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what or condition}")


# -- worker processes -----------------------------------------------------------------------
class WorkerProcess:
    """tests/helpers/wakeup_worker.py in a process of its own: its jobs' lines in ``out``."""

    def __init__(self, url: str, out: Path, *args: str) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), url, str(out), "--poll", str(LONG_POLL), *args],
            env={**os.environ, "PYTHONPATH": str(HERE.parent)},
        )
        ready = Path(f"{out}.ready")
        wait_for(lambda: ready.exists() or self.proc.poll() is not None, 60, "the worker")
        assert self.proc.poll() is None, "the worker process died at start"
        self.listen_pid = int(ready.read_text().split()[1])

    def lines(self) -> list[list[str]]:
        if not self.out.exists():
            return []
        return [line.split() for line in self.out.read_text().splitlines() if line.strip()]

    def started(self) -> dict[int, float]:
        """Job id -> its first start, as the wall clock (time.time())."""
        found: dict[int, float] = {}
        for job_id, _lag, _attempt, started in self.lines():
            found.setdefault(int(job_id), float(started))
        return found

    def stop(self) -> tuple[int, int, int]:
        """SIGTERM, wait; (wake-ups, announcements heard, claims)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        done = Path(f"{self.out}.done")
        wakes, heard, claims = (int(x) for x in done.read_text().split())
        return wakes, heard, claims

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.kill()


def make_app(url: str, **kwargs: Any) -> Scheduler:
    return Scheduler(url, registry=Registry(), clock="local", **kwargs)


def succeeded(app: Scheduler) -> int:
    with app.store.read() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(jobs).where(jobs.c.state == "succeeded")
            ).scalar_one()
        )


# -- the pieces -------------------------------------------------------------------------------
def test_payloads_say_the_queue_and_when() -> None:
    wake = _wakeup._common.Wake()
    wake.add("default", None)
    wake.add("default", None)
    wake.add("mail box", 1_900_000_000.25)
    wake.add("mail box", 1_800_000_000.5)  # the earliest later run_at is kept
    assert wake.now == {"default": 2}
    assert sorted(wake.payloads()) == ["0 default", "1800000000.500 mail box"]
    assert _wakeup.parse_payload("0 default") == ("default", None)
    assert _wakeup.parse_payload("1800000000.500 mail box") == ("mail box", 1_800_000_000.5)
    assert _wakeup.parse_payload("not ours") is None


def test_broker_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_BROKER_URL", raising=False)
    config = parse_config({"broker": {"url": "redis://cache:6380/2"}}, "app.toml")
    assert config.broker.url == "redis://cache:6380/2" and config.broker.prefix == "scheduler"
    assert parse_config({}, "app.toml").broker.url is None
    bad = {
        "redis://": "expected a host",
        "http://cache:6379": "expected a Redis URL",
        "redis://cache:port/0": "not a URL",
    }
    for url, why in bad.items():
        with pytest.raises(ConfigError, match=f"app.toml: \\[broker\\]: key 'url': {why}"):
            parse_config({"broker": {"url": url}}, "app.toml")
    with pytest.raises(ConfigError, match=r"\[broker\]: key 'urls': unknown key"):
        parse_config({"broker": {"urls": "redis://cache"}}, "app.toml")
    with pytest.raises(ConfigError, match=r"\[broker\]: key 'url': expected a string"):
        parse_config({"broker": {"url": 6379}}, "app.toml")
    with pytest.raises(ConfigError, match=r"\[broker\]: key 'prefix': expected 1 to 100"):
        parse_config({"broker": {"prefix": "a b"}}, "app.toml")
    with pytest.raises(ConfigError, match=r"\[scheduler\]: key 'wakeups': expected a boolean"):
        parse_config({"scheduler": {"wakeups": "no"}}, "app.toml")
    monkeypatch.setenv("SCHEDULER_BROKER_URL", "redis://other:6379/1")
    config = parse_config({"broker": {"url": "redis://cache:6380/2"}}, "app.toml")
    assert config.broker.url == "redis://other:6379/1"
    monkeypatch.setenv("SCHEDULER_BROKER_URL", "ftp://other")
    with pytest.raises(ConfigError, match="SCHEDULER_BROKER_URL: key 'url': expected a Redis"):
        parse_config({}, "app.toml")


def test_a_burst_of_announcements_is_a_few_wake_ups() -> None:
    event = threading.Event()
    waiter = _wakeup.Waiter(event, ["default"], lambda: datetime.now(UTC))
    try:
        began = time.monotonic()
        for _ in range(10_000):
            waiter.notice("default", None)
        took = time.monotonic() - began
        time.sleep(2 * _wakeup.COOLDOWN_SECONDS)  # the wake-up held back by the cooldown
        assert waiter.heard == 10_000
        # the first at once, then at most one per cooldown, and one at the end of the last
        assert 2 <= waiter.wakes <= took / _wakeup.COOLDOWN_SECONDS + 3
        assert event.is_set()
        event.clear()
        assert not waiter.notice("other", None) and not event.is_set()  # not its queue
    finally:
        waiter.close()


def test_a_later_run_at_sets_a_timer_not_a_wake_up() -> None:
    event = threading.Event()
    waiter = _wakeup.Waiter(event, ["default"], lambda: datetime.now(UTC))
    try:
        at = time.time() + 0.4
        waiter.notice("default", at + 5)
        waiter.notice("default", at)  # earlier: the timer moves to it
        assert not event.wait(0.2)
        assert event.wait(5) and time.time() >= at
        assert waiter.wakes == 1
    finally:
        waiter.close()


# -- rollbacks ---------------------------------------------------------------------------------
def _write_job(app: Scheduler, *, commit: bool) -> None:
    """A job and its announcement in one transaction, committed or rolled back."""
    values = new_job_values(handler="wake.stamp", payload="{}", now=datetime.now(UTC))
    with app.store.engine.connect() as conn:
        with conn.begin() as tx:
            insert_job(conn, values)
            _wakeup.announce(app.store, conn, [("default", None)])
            if not commit:
                tx.rollback()


@pytest.mark.citus
def test_a_rolled_back_enqueue_wakes_nobody_postgresql(pg_url: str) -> None:
    app = make_app(pg_url)
    waiter = _wakeup.Waiter(threading.Event(), ["default"], app.clock)
    source = _wakeup._postgres.PostgresSource(
        app.store.database.listen_url, app.store.engine, waiter
    )
    source.start()
    try:
        wait_for(lambda: waiter.heard == 1, what="the LISTEN connection")  # its first look
        _write_job(app, commit=False)
        time.sleep(0.5)
        assert waiter.heard == 1
        _write_job(app, commit=True)  # the same, committed: heard
        wait_for(lambda: waiter.heard == 2, what="the NOTIFY of the commit")
    finally:
        source.stop()
        app.close()


def test_a_rolled_back_enqueue_wakes_nobody_through_the_broker(
    redis_server: RedisServer, pg_url: str
) -> None:
    app = make_app(pg_url, broker_url=redis_server.url)
    client = redis_server.client()
    key = _wakeup.token_key("scheduler", "default")
    try:
        _write_job(app, commit=False)
        time.sleep(0.5)
        assert client.llen(key) == 0
        _write_job(app, commit=True)
        wait_for(lambda: client.llen(key) == 1, what="the token")
        app.enqueue("wake.stamp")
        wait_for(lambda: client.llen(key) == 2, what="the enqueue's token")
    finally:
        client.close()
        app.close()


@pytest.mark.parametrize("close", [False, True], ids=["exit", "close"])
def test_a_process_that_enqueues_and_exits_still_wakes_the_workers(
    redis_server: RedisServer, tmp_path: Path, sqlite_template: Path, close: bool
) -> None:
    """A script (a cron job, a management command) that enqueues and exits at once, with or
    without closing its Scheduler: the push to the broker, made by a thread of its own, goes
    out before the process ends."""
    url = make_url("sqlite", tmp_path, sqlite_template)
    code = (
        "import sys\n"
        "from scheduler import Scheduler\n"
        "app = Scheduler(sys.argv[1], broker_url=sys.argv[2])\n"
        "app.enqueue('wake.stamp')\n"
        "app.enqueue('wake.stamp', queue='reports')\n" + ("app.close()\n" if close else "")
    )
    subprocess.run([sys.executable, "-c", code, url, redis_server.url], check=True, timeout=60)
    client = redis_server.client()
    try:
        assert client.llen(_wakeup.token_key("scheduler", "default")) == 1
        assert client.llen(_wakeup.token_key("scheduler", "reports")) == 1
    finally:
        client.close()


def test_a_rolled_back_enqueue_wakes_nobody_in_the_process(tmp_path: Path, sqlite_template: Path):
    url = make_url("sqlite", tmp_path, sqlite_template)
    app = make_app(url)
    waiter = _wakeup.Waiter(threading.Event(), ["default"], app.clock)
    listening = _wakeup.listen(app.store, waiter)
    try:
        assert "sqlite-watch" in listening.how
        wait_for(lambda: waiter.heard == 1, what="the watcher's first look")
        _write_job(app, commit=False)
        time.sleep(0.3)
        assert waiter.heard == 1
        _write_job(app, commit=True)
        wait_for(lambda: waiter.heard >= 2, what="the in-process wake-up")
    finally:
        listening.close()
        app.close()


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_this_process_s_workers_are_woken_after_the_commit_only(
    backend: str, tmp_path: Path, sqlite_template: Path
) -> None:
    """A worker in the enqueuing process is woken directly, once the transaction commits: not
    for a rollback, and not before the commit (its claim would not see the job yet)."""
    app = make_app(make_url(backend, tmp_path, sqlite_template))
    waiter = _wakeup.Waiter(threading.Event(), ["default"], app.clock)
    key = _wakeup.database_key(app.store.engine)
    with _wakeup._process.local_lock:
        _wakeup._process.local_waiters.setdefault(key, []).append(waiter)
    try:
        _write_job(app, commit=False)
        assert waiter.heard == 0
        values = new_job_values(handler="wake.stamp", payload="{}", now=datetime.now(UTC))
        with app.store.begin() as conn:
            insert_job(conn, values)
            _wakeup.announce(app.store, conn, [("default", None)])
            assert waiter.heard == 0  # not yet committed
        assert waiter.heard == 1
        app.enqueue("wake.stamp")  # (on PostgreSQL its NOTIFY rides in the INSERT)
        assert waiter.heard == 2
    finally:
        with _wakeup._process.local_lock:
            _wakeup._process.local_waiters[key].remove(waiter)
        app.close()


def test_announce_on_a_session_s_connection_publishes_at_its_commit(
    tmp_path: Path, sqlite_template: Path
) -> None:
    """The way ``enqueue(..., connection=session)`` announces: on the Session's Connection, in
    its transaction; the wake-up follows the Session's commit, and a rollback drops it."""
    from sqlalchemy.orm import Session

    app = make_app(make_url("sqlite", tmp_path, sqlite_template))
    waiter = _wakeup.Waiter(threading.Event(), ["default"], app.clock)
    key = _wakeup.database_key(app.store.engine)
    with _wakeup._process.local_lock:
        _wakeup._process.local_waiters.setdefault(key, []).append(waiter)
    values = new_job_values(handler="wake.stamp", payload="{}", now=datetime.now(UTC))
    try:
        with Session(app.store.engine) as session:
            insert_job(session.connection(), dict(values))
            _wakeup.announce(app.store, session.connection(), [("default", None)])
            session.rollback()
        assert waiter.heard == 0
        with Session(app.store.engine) as session:
            insert_job(session.connection(), dict(values))
            _wakeup.announce(app.store, session.connection(), [("default", None)])
            assert waiter.heard == 0
            session.commit()
            assert waiter.heard == 1
    finally:
        with _wakeup._process.local_lock:
            _wakeup._process.local_waiters[key].remove(waiter)
        app.close()


def test_a_sqlite_worker_does_not_wake_itself(tmp_path: Path, sqlite_template: Path) -> None:
    """Its own commits (presence, ticks, claims) change the WAL index too: not news. Another
    process's commit is."""
    url = make_url("sqlite", tmp_path, sqlite_template)
    app = make_app(url)
    waiter = _wakeup.Waiter(threading.Event(), ["default"], app.clock)
    listening = _wakeup.listen(app.store, waiter)
    try:
        wait_for(lambda: waiter.heard == 1, what="the watcher's first look")
        if sys.platform == "linux":  # told of each write to the -wal file, no polling
            assert [getattr(s, "how", None) for s in listening.sources] == ["inotify"]
        for _ in range(20):
            _health.touch(app.store, "me", datetime.now(UTC), None)
            app.tick()
        time.sleep(0.3)
        assert waiter.heard == 1
        database = url.removeprefix("sqlite:///")
        code = (
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
            " c.execute(\"UPDATE scheduler_workers SET pid = 1 WHERE id = 'me'\"); c.commit()"
        )
        subprocess.run([sys.executable, "-c", code, database], check=True)
        wait_for(lambda: waiter.heard == 2, what="the other process's commit")
    finally:
        listening.close()
        app.close()


# -- as many workers as there are jobs -------------------------------------------------------------
@pytest.mark.citus
def test_the_broker_wakes_one_worker_per_job(redis_server: RedisServer, pg_url: str) -> None:
    app = make_app(pg_url, broker_url=redis_server.url)
    waiters = [_wakeup.Waiter(threading.Event(), ["default"], app.clock) for _ in range(3)]
    sources = [_wakeup._broker.BrokerSource(redis_server.url, "scheduler", w) for w in waiters]
    for source in sources:
        source.start()
    try:
        wait_for(lambda: all(w.heard == 1 for w in waiters), what="the broker's listeners")
        app.enqueue("wake.stamp")
        wait_for(lambda: sum(w.heard for w in waiters) == 4, what="a token")
        time.sleep(0.3)
        assert sum(w.heard for w in waiters) == 4  # one woken, the others not
        values = new_job_values(handler="wake.stamp", payload="{}", now=datetime.now(UTC))
        with app.store.begin() as conn:  # two jobs in one transaction: two workers
            insert_job(conn, dict(values))
            insert_job(conn, dict(values))
            _wakeup.announce(app.store, conn, [("default", None)] * 2)
        wait_for(lambda: sum(w.heard for w in waiters) == 6, what="two tokens")
        time.sleep(0.3)
        assert sum(w.heard for w in waiters) == 6
        assert sorted(w.heard for w in waiters) in ([2, 2, 2], [1, 2, 3])
    finally:
        for source in sources:
            source.stop()
        app.close()


@pytest.mark.citus
def test_the_process_wakes_one_worker_per_job_with_a_free_slot(pg_url: str) -> None:
    app = make_app(pg_url)
    free = [False, True, True]
    waiters = [
        _wakeup.Waiter(threading.Event(), ["default"], app.clock, lambda i=i: free[i])
        for i in range(3)
    ]
    key = _wakeup.database_key(app.store.engine)
    with _wakeup._process.local_lock:
        _wakeup._process.local_waiters.setdefault(key, []).extend(waiters)
    try:
        app.enqueue("wake.stamp")
        assert [w.heard for w in waiters] == [0, 1, 0]  # the busy one is passed over
    finally:
        with _wakeup._process.local_lock:
            for waiter in waiters:
                _wakeup._process.local_waiters[key].remove(waiter)
        app.close()


# -- worker processes ---------------------------------------------------------------------------
BACKENDS = ["sqlite", "postgresql", "postgresql+broker", "mariadb+broker", "citus"]


@pytest.mark.citus
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_process_starts_each_new_job_without_waiting_for_its_poll(
    backend: str,
    tmp_path: Path,
    sqlite_template: Path,
    workers: list[WorkerProcess],
    request: pytest.FixtureRequest,
) -> None:
    """An enqueuing process (this one) and a worker process whose poll is a minute: every job
    starts long before that poll, each through the wake-ups, a retry at the end of its back-off
    too (a timer), and so does a job another process's tick dispatches."""
    engine, _, broker = backend.partition("+")
    url = make_url(engine, tmp_path, sqlite_template)
    extra: list[str] = ["--backoff", "1", "--tick-interval", "3600"]
    broker_url = None
    if broker:
        broker_url = request.getfixturevalue("redis_server").url
        extra += ["--broker", broker_url]
    worker = WorkerProcess(url, tmp_path / "out", *extra)
    workers.append(worker)
    app = make_app(url, broker_url=broker_url, tick_interval=3600)
    began = time.monotonic()
    ids = []
    for _ in range(5):
        time.sleep(random.uniform(0.05, 0.2))
        ids.append(app.enqueue("wake.stamp", {"t": time.time()}))
    ids.append(app.enqueue("wake.stamp", {"fail_first": True}))  # retried a second later
    wait_for(lambda: len(worker.lines()) == 7, what="7 runs")
    assert time.monotonic() - began < LONG_POLL / 2
    assert sorted({int(line[0]) for line in worker.lines()}) == sorted(ids)
    # A fresh dispatch by another process's tick (the worker's own ticks hourly).
    app.sync([_task("every-second")])
    wait_for(lambda: app.tick().dispatched, 10, "a dispatch")
    wait_for(lambda: len(worker.lines()) == 8, what="the dispatched job")
    wakes, heard, _claims = worker.stop()
    assert wakes >= 7 and heard >= 6  # (a timer's wake-up is not an announcement heard)
    assert succeeded(app) == 7
    app.close()


def _task(name: str) -> Any:
    from scheduler._model.rows import TaskSpec

    return TaskSpec(name=name, cron="* * * * * *", handler="wake.stamp")


@pytest.mark.citus
@pytest.mark.slow
def test_a_killed_listen_connection_loses_no_job(
    pg_url: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """``pg_terminate_backend`` on the worker's LISTEN connection while jobs keep coming: the
    jobs of the outage start when it is listening again (it looks at once), none is lost, and
    the jobs after it start at once again."""
    worker = WorkerProcess(pg_url, tmp_path / "out")
    workers.append(worker)
    app = make_app(pg_url)
    ids = [app.enqueue("wake.stamp", {"t": time.time()}) for _ in range(5)]
    wait_for(lambda: len(worker.lines()) == 5, what="the first jobs")
    with app.store.engine.connect() as conn:
        killed = conn.execute(
            text("SELECT pg_terminate_backend(CAST(:pid AS integer))"), {"pid": worker.listen_pid}
        ).scalar()
    assert killed
    ids += [app.enqueue("wake.stamp", {"t": time.time()}) for _ in range(5)]
    wait_for(lambda: len(worker.lines()) == 10, what="the outage's jobs")
    after = []
    for _ in range(5):
        time.sleep(0.1)
        after.append(app.enqueue("wake.stamp", {"t": time.time()}))
    wait_for(lambda: len(worker.lines()) == 15, what="the jobs after the reconnection")
    assert sorted(worker.started()) == sorted(ids + after)
    with app.store.engine.connect() as conn:  # listening again, on a new connection
        pids = conn.execute(
            text(
                "SELECT pid FROM pg_stat_activity WHERE application_name = :name"
                " AND query = 'LISTEN ' || quote_ident(left('scheduler:' || current_schema(), 63))"
            ),
            {"name": _wakeup.LISTEN_APPLICATION_NAME},
        ).scalars()
        assert list(pids) not in ([], [worker.listen_pid])
    worker.stop()
    assert succeeded(app) == 15
    app.close()


@pytest.mark.slow
def test_a_stopped_broker_loses_no_job_and_status_says_so(
    redis_server: RedisServer, pg_url: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = WorkerProcess(pg_url, tmp_path / "out", "--broker", redis_server.url)
    workers.append(worker)
    app = make_app(pg_url, broker_url=redis_server.url)
    ids = [app.enqueue("wake.stamp", {"t": time.time()}) for _ in range(5)]
    wait_for(lambda: len(worker.lines()) == 5, what="the first jobs")
    assert not [w for w in app.status()["health"]["warnings"] if "broker" in w]
    redis_server.stop()
    ids += [app.enqueue("wake.stamp", {"t": time.time()}) for _ in range(5)]  # no error
    warnings = app.status()["health"]["warnings"]
    assert [w for w in warnings if "broker" in w and "unreachable" in w], warnings
    time.sleep(1)
    redis_server.start()  # a restart: an empty Redis on the same port
    wait_for(lambda: len(worker.lines()) == 10, what="the outage's jobs")
    after = []
    for _ in range(5):
        time.sleep(0.1)
        after.append(app.enqueue("wake.stamp", {"t": time.time()}))
    wait_for(lambda: len(worker.lines()) == 15, what="the jobs after the restart")
    assert sorted(worker.started()) == sorted(ids + after)
    worker.stop()
    assert succeeded(app) == 15
    assert not [w for w in app.status()["health"]["warnings"] if "broker" in w]
    app.close()


@pytest.mark.slow
def test_a_burst_is_not_a_wake_up_per_job_for_every_worker(
    direct_pg_url: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """10,000 jobs in 100 transactions, then 1,000 enqueues from four threads, to two worker
    processes: each transaction is one notification whatever its jobs, the notifications that
    come close together are one wake-up, and a worker with no free slot claims nothing.
    (Directly: the notifications are the same through a pooler, whose small pool would only
    make this burst slow.)"""
    pg_url = direct_pg_url
    for name in ("a", "b"):
        workers.append(WorkerProcess(pg_url, tmp_path / name))
    app = make_app(pg_url)
    now = datetime.now(UTC)
    values = new_job_values(handler="wake.stamp", payload="{}", now=now)
    for _ in range(100):
        with app.store.begin() as conn:
            conn.execute(jobs.insert(), [dict(values) for _ in range(100)])
            _wakeup.announce(app.store, conn, [("default", None)] * 100)

    def enqueue(n: int) -> None:
        for _ in range(n):
            app.enqueue("wake.stamp")

    threads = [threading.Thread(target=enqueue, args=(250,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wait_for(lambda: succeeded(app) == 11_000, 120, "11,000 jobs")
    for worker in workers:
        wakes, heard, claims = worker.stop()
        assert heard <= 1 + 100 + 1_000  # its first look, one per transaction
        assert wakes < heard  # coalesced
        assert claims < 11_000 / 2
    ran = [len(w.lines()) for w in workers]
    assert sum(ran) == 11_000 and min(ran) > 0
    app.close()


def test_behind_a_pooler_without_listen_url_workers_poll_and_status_says_so(
    pg_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCHEDULER_DATABASE_LISTEN_URL", raising=False)
    app = make_app(pg_url, pooler="transaction")
    waiter = _wakeup.Waiter(threading.Event(), ["default"], app.clock)
    _wakeup._common.said.discard("no_listen")
    listening = _wakeup.listen(app.store, waiter)
    try:
        assert "notify" not in listening.how and not listening.sources
        assert "transaction pooler" in caplog.text
        warnings = app.status()["health"]["warnings"]
        assert [w for w in warnings if w.startswith("wake-ups are off")], warnings
    finally:
        listening.close()
        app.close()
    listened = make_app(pg_url, pooler="transaction", listen_url=PG_URL)  # a direct URL
    waiter = _wakeup.Waiter(threading.Event(), ["default"], listened.clock)
    listening = _wakeup.listen(listened.store, waiter)
    try:
        assert "notify" in listening.how
        wait_for(lambda: waiter.heard == 1, what="the LISTEN connection on listen_url")
        listened.enqueue("wake.stamp")
        wait_for(lambda: waiter.heard == 2, what="the NOTIFY")
        assert not [w for w in listened.status()["health"]["warnings"] if "wake-ups" in w]
    finally:
        listening.close()
        listened.close()


@pytest.mark.citus
def test_wake_ups_off_announce_nothing(pg_url: str) -> None:
    app = make_app(pg_url, wakeups=False)
    waiter = _wakeup.Waiter(threading.Event(), ["default"], app.clock)
    listening = _wakeup.listen(app.store, waiter)
    source = _wakeup._postgres.PostgresSource(
        app.store.database.listen_url, app.store.engine, waiter
    )
    source.start()
    try:
        assert listening.how == []
        wait_for(lambda: waiter.heard == 1, what="the LISTEN connection")
        app.enqueue("wake.stamp")
        time.sleep(0.5)
        assert waiter.heard == 1
    finally:
        source.stop()
        listening.close()
        app.close()


def test_mariadb_without_a_broker_says_it_polls(
    tmp_path: Path, sqlite_template: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = make_url("mariadb", tmp_path, sqlite_template)
    assert url == MYSQL_URL
    app = make_app(url)
    _wakeup._common.said.discard("no_notify_mysql")
    _wakeup._common.said.discard("no_notify_mariadb")
    listening = _wakeup.listen(app.store, _wakeup.Waiter(threading.Event(), ["default"], app.clock))
    try:
        assert listening.how == ["process"]
        assert "set [broker] url" in caplog.text
    finally:
        listening.close()
        app.close()
