"""Prometheus metrics (SPEC §12): a real ``scheduler worker`` scraped over HTTP, the database
gauges on every engine, what a scrape costs the database, and the ``[metrics]`` table."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers.config_metrics import config_metric_names
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event, update

from scheduler import ConfigError, PermanentError, Scheduler, TaskSpec
from scheduler._config import parse_config
from scheduler._model.handlers import Registry
from scheduler._store import jobs as _jobs
from scheduler._store.tables import jobs
from scheduler._worker.worker import Worker
from scheduler.metrics import Metrics, asgi_app

#: SPEC §12: every name and its labels (a histogram's labels are on its _count series).
SPEC_METRICS: dict[str, tuple[str, ...]] = {
    "scheduler_jobs_total": ("handler", "queue", "outcome"),
    "scheduler_job_duration_seconds_count": ("handler", "queue"),
    "scheduler_job_queue_wait_seconds_count": ("handler", "queue"),
    "scheduler_dispatch_lateness_seconds_count": (),
    "scheduler_tick_duration_seconds_count": (),
    "scheduler_tick_decisions_total": ("decision",),
    "scheduler_jobs_by_state": ("state", "queue"),
    "scheduler_tasks": ("state",),
    "scheduler_task_last_success_timestamp_seconds": ("task",),
    "scheduler_task_consecutive_failures": ("task",),
    "scheduler_worker_up": ("worker",),
}

#: SPEC §14: gauges read from PostgreSQL's statistics, served on PostgreSQL only.
POSTGRESQL_ONLY = {"scheduler_table_dead_tuples", "scheduler_oldest_transaction_age_seconds"}

JOBS = """
from scheduler import PermanentError, default_registry

@default_registry.handler("m.ok", retry_safe=True)
def ok(job):
    pass

@default_registry.handler("m.flaky", retry_safe=True, max_attempts=2, queue="slow")
def flaky(job):
    raise RuntimeError("always")

@default_registry.handler("m.bad", retry_safe=True)
def bad(job):
    raise PermanentError("bad_input")

@default_registry.handler("m.once")
def once(job):
    raise RuntimeError("side effects may have happened")
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return parse(text)


def parse(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, frozenset(sample.labels.items())] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


@pytest.fixture
def worker_dir(tmp_path: Path) -> Path:
    (tmp_path / "metrics_jobs.py").write_text(JOBS)
    return tmp_path


def start_worker(directory: Path, url: str, port: int) -> subprocess.Popen[str]:
    config = directory / "app.toml"
    config.write_text(
        f'[database]\nurl = "{url}"\n\n'
        "[scheduler]\ntick_interval = 0.2\n"
        "backoff_base_seconds = 0.1\nbackoff_max_seconds = 0.1\n\n"
        '[worker]\nimports = ["metrics_jobs"]\nqueues = ["default", "slow"]\n\n'
        f'[metrics]\nport = {port}\nhost = "127.0.0.1"\ncache_seconds = 0.2\n\n'
        '[[tasks]]\nname = "every-second"\ncron = "* * * * * *"\nhandler = "m.ok"\n'
    )
    env = {  # a pgbouncer case's pooler settings are kept
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SCHEDULER_")
        or k in ("SCHEDULER_DATABASE_POOLER", "SCHEDULER_DATABASE_LISTEN_URL")
    }
    command = [sys.executable, "-m", "scheduler.cli", "--config", str(config)]
    for step in ("migrate", "sync"):
        done = subprocess.run([*command, step], cwd=directory, env=env, capture_output=True)
        assert done.returncode == 0, done.stderr
    return subprocess.Popen(
        [*command, "worker"],
        cwd=directory,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for(port: int, proc: subprocess.Popen[str], ready: Any, timeout: float = 30) -> Samples:
    deadline = time.monotonic() + timeout
    samples: Samples = {}
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            samples = scrape(port)
        except OSError:
            samples = {}
        if samples and ready(samples):
            return samples
        time.sleep(0.2)
    raise AssertionError(f"metrics never got there; last scrape: {sorted(samples)}")


@pytest.fixture
def stop() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=30)


def test_worker_serves_every_spec_metric(
    db_url_sp: str, worker_dir: Path, stop: list[subprocess.Popen[str]]
) -> None:
    """A real worker runs jobs that succeed, fail and retry, abort and are abandoned; its
    /metrics, parsed by prometheus_client's own parser, has every name of SPEC §12 with the
    expected labels and values."""
    enqueuer = Scheduler(db_url_sp, registry=Registry())
    enqueuer.migrate()
    for _ in range(3):
        enqueuer.enqueue("m.ok", {"n": 1})
    enqueuer.enqueue("m.flaky", {}, queue="slow", max_attempts=2)
    enqueuer.enqueue("m.bad", {})
    enqueuer.enqueue("m.once", {})
    enqueuer.close()
    port = free_port()
    proc = start_worker(worker_dir, db_url_sp, port)
    stop.append(proc)

    def ready(s: Samples) -> bool:
        flaky = value(s, "scheduler_jobs_total", handler="m.flaky", queue="slow", outcome="aborted")
        ok = value(s, "scheduler_jobs_total", handler="m.ok", queue="default", outcome="succeeded")
        dispatched = value(s, "scheduler_tick_decisions_total", decision="dispatched") or 0
        succeeded = value(s, "scheduler_jobs_by_state", state="succeeded", queue="default") or 0
        return flaky == 1 and (ok or 0) >= 4 and dispatched >= 1 and succeeded >= 4

    s = wait_for(port, proc, ready)
    for name, labels in SPEC_METRICS.items():
        series = [dict(key) for n, key in s if n == name]
        assert series, f"{name} missing"
        assert all(set(found) == set(labels) for found in series), (name, series)

    def jobs(handler: str, queue: str, outcome: str) -> float | None:
        return value(s, "scheduler_jobs_total", handler=handler, queue=queue, outcome=outcome)

    assert jobs("m.flaky", "slow", "failed") == 1  # attempt 1 of 2: a retry
    assert jobs("m.flaky", "slow", "aborted") == 1  # attempt 2: attempts used up
    assert jobs("m.bad", "default", "aborted") == 1
    assert jobs("m.once", "default", "abandoned") == 1
    assert jobs("m.once", "default", "aborted") == 0  # one attempt, one outcome
    assert jobs("m.ok", "default", "failed") == 0
    ran = value(s, "scheduler_job_duration_seconds_count", handler="m.flaky", queue="slow")
    assert ran == 2
    waited = value(s, "scheduler_job_queue_wait_seconds_count", handler="m.ok", queue="default")
    assert waited is not None and waited >= 4
    assert (value(s, "scheduler_dispatch_lateness_seconds_count") or 0) >= 1
    assert (value(s, "scheduler_tick_duration_seconds_count") or 0) >= 1
    for decision in ("rerun", "held_back", "disabled", "lost_race"):
        assert value(s, "scheduler_tick_decisions_total", decision=decision) is not None
    assert value(s, "scheduler_jobs_by_state", state="aborted", queue="slow") == 1
    assert value(s, "scheduler_jobs_by_state", state="aborted", queue="default") == 2
    assert value(s, "scheduler_jobs_by_state", state="claimed", queue="slow") == 0
    assert value(s, "scheduler_tasks", state="enabled") == 1
    assert value(s, "scheduler_tasks", state="disabled") == 0
    last = value(s, "scheduler_task_last_success_timestamp_seconds", task="every-second")
    assert last is not None and abs(last - time.time()) < 60
    assert value(s, "scheduler_task_consecutive_failures", task="every-second") == 0
    up = [dict(k)["worker"] for n, k in s if n == "scheduler_worker_up"]
    assert len(up) == 1 and f":{proc.pid}:" in up[0]
    assert value(s, "scheduler_worker_up", worker=up[0]) == 1
    # config/: every name the alerting rules and the Grafana dashboard query is served.
    missing = config_metric_names() - names(s)
    if not db_url_sp.startswith("postgresql"):  # the MVCC horizon's gauges: PostgreSQL's own
        missing -= POSTGRESQL_ONLY
    assert not missing, f"config/ uses names a worker does not serve: {missing}"
    # No job id or payload in any label value.
    label_values = {v for n, key in s if n.startswith("scheduler_") for k, v in key if k != "le"}
    assert not any(v.isdigit() for v in label_values), label_values

    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    with pytest.raises(OSError):  # the server stopped with the worker
        scrape(port)


def test_worker_refuses_a_port_in_use(tmp_path: Path) -> None:
    """A port already taken: one line naming the file and the key, and no worker."""
    config = tmp_path / "app.toml"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        url = f"sqlite:///{tmp_path / 's.db'}"
        config.write_text(
            f'[database]\nurl = "{url}"\n[metrics]\nport = {port}\nhost = "127.0.0.1"\n'
        )
        app = Scheduler.from_toml(config, registry=Registry())
        app.migrate()
        with pytest.raises(ConfigError) as raised:
            Worker(app).run(once=True)
    assert str(raised.value) == (
        f"{config}: [metrics]: key 'port': cannot listen on 127.0.0.1:{port}:"
        " Address already in use"
    )
    assert app.status()["health"]["workers"] == []  # it never registered


def seeded(app: Scheduler) -> None:
    app.worker_settings = dataclasses.replace(app.worker_settings, queues=("default", "q2"))
    app.registry.handler("g.ok", retry_safe=True)(lambda job: None)
    app.registry.handler("g.bad", retry_safe=True, queue="q2")(
        lambda job: (_ for _ in ()).throw(PermanentError("no"))
    )
    app.migrate()
    app.enqueue("g.ok", {})
    app.enqueue("g.bad", {})
    app.enqueue("g.ok", {}, run_at=app.clock().replace(year=2100))


def test_database_gauges_on_every_engine(app: Scheduler) -> None:
    """The one statement of the gauges reads right on SQLite, PostgreSQL and MariaDB."""
    seeded(app)
    metrics = Metrics(app, cache_seconds=0)
    try:
        s = parse(generate_latest(metrics.registry).decode())
        assert value(s, "scheduler_jobs_by_state", state="queued", queue="default") == 2
        assert value(s, "scheduler_jobs_by_state", state="queued", queue="q2") == 1
        assert value(s, "scheduler_jobs_by_state", state="succeeded", queue="q2") == 0
        age = value(s, "scheduler_job_oldest_ready_age_seconds", queue="default")
        assert age is not None and 0 <= age < 60  # the job of 2100 is not ready
        assert app.work() == 2
        s = parse(generate_latest(metrics.registry).decode())
        assert value(s, "scheduler_jobs_by_state", state="queued", queue="default") == 1
        assert value(s, "scheduler_jobs_by_state", state="succeeded", queue="default") == 1
        assert value(s, "scheduler_jobs_by_state", state="aborted", queue="q2") == 1
        assert value(s, "scheduler_job_oldest_ready_age_seconds", queue="default") == 0
        assert value(s, "scheduler_jobs_total", handler="g.bad", queue="q2", outcome="aborted") == 1
    finally:
        metrics.close()


def test_each_tasks_last_success_is_its_newest_succeeded_jobs_end(app: Scheduler) -> None:
    """On every engine: a task's last success is its newest succeeded job's end, a failure after
    it notwithstanding; a task that never succeeded has no series."""
    app.migrate()
    app.sync([TaskSpec(n, "0 3 * * *", "h", {}, "UTC") for n in ("twice", "then-failed", "never")])
    t0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
    ended = {
        "twice": [("succeeded", t0), ("succeeded", t0 + timedelta(hours=1))],
        "then-failed": [
            ("succeeded", t0 + timedelta(hours=2)),
            ("aborted", t0 + timedelta(hours=3)),
        ],
        "never": [("aborted", t0)],
    }
    with app.store.begin() as conn:
        for task, finished in ended.items():
            for state, at in finished:
                values = _jobs.new_job_values(handler="h", payload="{}", now=t0, task_name=task)
                job_id = _jobs.insert_job(conn, values)
                conn.execute(
                    update(jobs).where(jobs.c.id == job_id).values(state=state, finished_at=at)
                )
    metrics = Metrics(app, cache_seconds=0)
    try:
        s = parse(generate_latest(metrics.registry).decode())
        name = "scheduler_task_last_success_timestamp_seconds"
        assert value(s, name, task="twice") == (t0 + timedelta(hours=1)).timestamp()
        assert value(s, name, task="then-failed") == (t0 + timedelta(hours=2)).timestamp()
        assert value(s, name, task="never") is None
        assert value(s, "scheduler_task_consecutive_failures", task="never") == 0
    finally:
        metrics.close()


def test_a_scrape_a_second_costs_one_statement_per_cache_period(app: Scheduler) -> None:
    """Scraped 20 times in under a second, the gauges read the database once; once the cache is
    older than cache_seconds, one statement again."""
    seeded(app)
    metrics = Metrics(app, cache_seconds=1.0)
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(app.store.engine, "before_cursor_execute", count)
    try:
        for _ in range(20):
            generate_latest(metrics.registry)
            time.sleep(0.02)
        assert len(statements) == 1, statements
        time.sleep(1.0)
        for _ in range(5):
            generate_latest(metrics.registry)
        assert len(statements) == 2
    finally:
        event.remove(app.store.engine, "before_cursor_execute", count)
        metrics.close()


def test_asgi_app_serves_the_metrics(app: Scheduler) -> None:
    """``scheduler.metrics.asgi_app(app)``, for the dashboard (or a host app) to mount."""
    import asyncio

    seeded(app)
    served = asgi_app(app)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/metrics",
        "query_string": b"",
        "headers": [],
    }
    asyncio.run(served(scope, receive, send))
    assert sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    assert value(parse(body), "scheduler_jobs_by_state", state="queued", queue="q2") == 1


def test_metrics_table_in_toml() -> None:
    config = parse_config({"metrics": {"port": 9464}}, "app.toml")
    assert config.metrics.port == 9464 and config.metrics.cache_seconds == 5.0
    assert parse_config({}, "app.toml").metrics.port == 0  # off by default
    for table, message in [
        ({"port": "9464"}, "app.toml: [metrics]: key 'port': expected an integer, got string"),
        ({"port": 70000}, "app.toml: [metrics]: key 'port': must be at most 65535, got 70000"),
        ({"port": -1}, "app.toml: [metrics]: key 'port': must be at least 0, got -1"),
        ({"prot": 1}, "app.toml: [metrics]: key 'prot': unknown key (did you mean 'port'?)"),
        ({"cache_seconds": 0}, "app.toml: [metrics]: key 'cache_seconds': must be greater"),
    ]:
        with pytest.raises(ConfigError) as raised:
            parse_config({"metrics": table}, "app.toml")
        assert str(raised.value).startswith(message), str(raised.value)


def test_no_prometheus_import_when_metrics_are_off(tmp_path: Path) -> None:
    """The core install stays small: a worker round with metrics off never imports
    prometheus_client."""
    script = (
        "import sys\n"
        "from scheduler import Scheduler\n"
        "from scheduler._model.handlers import Registry\n"
        "from scheduler._worker.worker import Worker\n"
        f"app = Scheduler('sqlite:///{tmp_path / 's.db'}', registry=Registry())\n"
        "app.migrate()\n"
        "Worker(app).run(once=True)\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
        "assert 'opentelemetry' not in sys.modules, 'imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_metrics_port_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCHEDULER_METRICS_PORT gives each instance of a systemd template unit its own port."""
    monkeypatch.setenv("SCHEDULER_METRICS_PORT", "9462")
    assert parse_config({"metrics": {"port": 9464}}, "app.toml").metrics.port == 9462
    monkeypatch.setenv("SCHEDULER_METRICS_PORT", "946x")
    with pytest.raises(ConfigError) as raised:
        parse_config({}, "app.toml")
    assert str(raised.value) == "SCHEDULER_METRICS_PORT: expected a port (0 to 65535), got '946x'"
    monkeypatch.setenv("SCHEDULER_METRICS_PORT", "")
    assert parse_config({"metrics": {"port": 9464}}, "app.toml").metrics.port == 9464


def test_the_run_policies_decisions_are_counted(tmp_path: Path) -> None:
    """skipped_overlap and missed feed scheduler_tick_decisions_total like the others."""
    from datetime import UTC, datetime, timedelta

    from scheduler import TaskSpec
    from scheduler.testing import ManualClock

    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    app = Scheduler(f"sqlite:///{tmp_path}/m.db", registry=Registry(), clock=ManualClock(t0))
    app.migrate()
    metrics = Metrics(app, cache_seconds=0)
    try:
        every = "*/10 * * * *"
        app.sync(
            [
                TaskSpec("s", every, "h", {}, "UTC", overlap="skip"),
                TaskSpec("m", every, "h", {}, "UTC", catchup_window=60),
            ]
        )
        for minutes in (10, 20):
            now = t0 + timedelta(minutes=minutes, seconds=61)
            metrics.ticked(0.001, app.tick(now=now))
        s = parse(generate_latest(metrics.registry).decode())
        assert value(s, "scheduler_tick_decisions_total", decision="skipped_overlap") == 1
        assert value(s, "scheduler_tick_decisions_total", decision="missed") == 2
        metrics.ticked(0.001, app.tick(now=t0 + timedelta(minutes=30)))
        s = parse(generate_latest(metrics.registry).decode())
        assert value(s, "scheduler_tick_decisions_total", decision="skipped_overlap") == 2
        assert value(s, "scheduler_tick_decisions_total", decision="dispatched") == 2
    finally:
        metrics.close()
        app.close()


def test_serve_stops_at_once_and_frees_its_port(tmp_path: Path) -> None:
    """``serve()``'s server answers over HTTP; ``shutdown()`` ends its thread and closes its
    socket before it returns (a worker's stop does not wait on a poll), so the port can be
    bound again right away; a second ``shutdown()`` does nothing."""
    import threading

    from scheduler.metrics import serve

    app = Scheduler(f"sqlite:///{tmp_path}/m.db", registry=Registry())
    app.migrate()
    app.enqueue("h", {})
    port = free_port()
    server = serve(app, port=port, host="127.0.0.1")
    try:
        assert server.server_port == port
        samples = scrape(port)
        assert value(samples, "scheduler_jobs_by_state", state="queued", queue="default") == 1
        assert any(t.name == "scheduler-metrics" for t in threading.enumerate())
    finally:
        server.shutdown()
    assert not any(t.name == "scheduler-metrics" for t in threading.enumerate())
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as any server binds
        again.bind(("127.0.0.1", port))
        again.listen()
    with pytest.raises(OSError):
        scrape(port)
    server.shutdown()
    metrics = getattr(app, "_metrics")  # noqa: B009 - kept on the app by metrics_for
    metrics.close()
    app.close()


def test_outcomes_are_counted_per_app_once_committed(tmp_path: Path) -> None:
    """The outcome counter is fed by the app's own runners after each commit: two apps in one
    process each count only their own jobs, and an abandoned attempt counts once, as
    ``abandoned`` (not also as ``aborted``)."""
    apps = []
    for name in ("a", "b"):
        registry = Registry()
        registry.handler("h.ok", retry_safe=True)(lambda job: None)
        registry.handler("h.fail", max_attempts=2, retry_safe=True)(
            lambda job: (_ for _ in ()).throw(RuntimeError("again"))
        )
        registry.handler("h.once")(lambda job: (_ for _ in ()).throw(RuntimeError("x")))
        app = Scheduler(f"sqlite:///{tmp_path}/{name}.db", registry=registry)
        app.migrate()
        apps.append(app)
    a, b = apps
    metrics_a, metrics_b = Metrics(a, cache_seconds=60), Metrics(b, cache_seconds=60)
    try:
        for _ in range(3):
            a.enqueue("h.ok", {})
        a.enqueue("h.fail", {})
        a.enqueue("h.once", {})
        b.enqueue("h.ok", {})
        assert a.work() == 5  # 3 ok, h.fail's first attempt (its retry waits), h.once
        assert b.work() == 1
        sa = parse(generate_latest(metrics_a.registry).decode())
        sb = parse(generate_latest(metrics_b.registry).decode())

        def jobs(s: Samples, handler: str, outcome: str) -> float | None:
            return value(
                s, "scheduler_jobs_total", handler=handler, queue="default", outcome=outcome
            )

        assert jobs(sa, "h.ok", "succeeded") == 3
        assert jobs(sb, "h.ok", "succeeded") == 1
        assert jobs(sa, "h.fail", "failed") == 1
        assert jobs(sa, "h.once", "abandoned") == 1
        assert jobs(sa, "h.once", "aborted") == 0  # one attempt, one outcome
        assert jobs(sb, "h.fail", "failed") == 0
    finally:
        metrics_a.close()
        metrics_b.close()
        for app in apps:
            app.close()


def test_run_time_histograms_read_as_prometheus_client_writes_them(tmp_path: Path) -> None:
    """The run-time and queue-wait histograms (our own collector, one lock per attempt) come
    out as a ``prometheus_client`` Histogram with the same buckets would: the same ``le``
    labels, cumulative counts, ``+Inf`` equal to ``_count``, and the sum."""
    from datetime import timedelta

    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.utils import floatToGoString

    from scheduler.metrics import JOB_BUCKETS, WAIT_BUCKETS, le

    assert [le(b) for b in (*JOB_BUCKETS, *WAIT_BUCKETS, float("inf"))] == [
        floatToGoString(b) for b in (*JOB_BUCKETS, *WAIT_BUCKETS, float("inf"))
    ]
    app = Scheduler(f"sqlite:///{tmp_path}/m.db", registry=Registry())
    app.migrate()
    job = app.get_job(app.enqueue("h", {}))
    assert job is not None
    metrics = Metrics(app, cache_seconds=60)
    reference = CollectorRegistry()
    ran = Histogram("ref_ran", "", buckets=JOB_BUCKETS, registry=reference)
    waited = Histogram("ref_wait", "", buckets=WAIT_BUCKETS, registry=reference)
    try:
        for seconds, wait in [(0.001, 0.0), (0.01, 0.05), (0.7, 3.0), (4000.0, 5000.0), (1, 1)]:
            metrics.ran(job, job.run_at + timedelta(seconds=wait), seconds)
            ran.observe(seconds)
            waited.observe(wait)
        ours = parse(generate_latest(metrics.registry).decode())
        theirs = parse(generate_latest(reference).decode())
        for name, ref in [
            ("scheduler_job_duration_seconds", "ref_ran"),
            ("scheduler_job_queue_wait_seconds", "ref_wait"),
        ]:
            labels = {"handler": "h", "queue": "default"}
            mine = {dict(key).get("le"): v for (n, key), v in ours.items() if n == f"{name}_bucket"}
            reference_buckets = {
                dict(key).get("le"): v for (n, key), v in theirs.items() if n == f"{ref}_bucket"
            }
            assert mine == reference_buckets
            assert value(ours, f"{name}_count", **labels) == 5
            assert value(ours, f"{name}_sum", **labels) == value(theirs, f"{ref}_sum")
    finally:
        metrics.close()
        app.close()


def test_every_tick_outcome_has_a_decision_series() -> None:
    """The decision counter reads the TickReport's lists by these names: one per outcome."""
    from scheduler._model.report import Outcome
    from scheduler.metrics import DECISIONS

    assert sorted(DECISIONS) == sorted(o.value for o in Outcome)


def test_tick_histograms_read_as_prometheus_client_writes_them() -> None:
    """The tick's unlabelled histograms (tick time, lateness) against a ``prometheus_client``
    Histogram fed the same values: the same buckets, count and sum."""
    from prometheus_client import CollectorRegistry, Histogram

    from scheduler.metrics import LATENESS_BUCKETS, TICK_BUCKETS, TickHistogram

    for bounds in (TICK_BUCKETS, LATENESS_BUCKETS):
        ours, theirs = CollectorRegistry(), CollectorRegistry()
        mine = TickHistogram("x_seconds", "x", bounds)
        ours.register(mine)
        reference = Histogram("x_seconds", "x", buckets=bounds, registry=theirs)
        for v in (0.0, 0.0004, 0.001, 0.003, 0.3, 7.0, 299.0, 301.0, 1e6):
            mine.observe(v)
            reference.observe(v)
        a = parse(generate_latest(ours).decode())
        b = parse(generate_latest(theirs).decode())
        assert {k: v for k, v in a.items() if k[0] != "x_seconds_created"} == {
            k: v for k, v in b.items() if k[0] != "x_seconds_created"
        }
