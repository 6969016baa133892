"""The metrics with ``[database] shards = 4``: the database gauges read every shard, each
series labelled with its ``shard``; a worker serving every shard counts every shard's runs
in the one set of metrics it serves (a real PostgreSQL; ``promtool`` checks the text)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from helpers.shard_reads import SHARDS, Seeded, seed, sharded_app
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler import Scheduler, TaskSpec
from scheduler._config import MetricsSettings
from scheduler._store.status import health as _health
from scheduler._worker.shards import ShardedWorker
from scheduler.metrics import Metrics

Samples = list[tuple[str, dict[str, str], float]]
ALL = {str(k) for k in range(SHARDS)}


def parse(text: str) -> Samples:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def series(samples: Samples, name: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, n) for found, labels, n in samples if found == name]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def seeded(sharded_url: str) -> Iterator[Seeded]:
    port = free_port()
    app = sharded_app(sharded_url, metrics=MetricsSettings(port=port, host="127.0.0.1"))
    yield seed(app)
    app.close()


def test_every_database_gauge_reads_every_shard_with_a_shard_label(seeded: Seeded) -> None:
    app = seeded.app
    now = app.clock()
    _health.touch(app.shards[2].store, "host:1:abc", now, now)  # a worker of shard 2 only
    metrics = Metrics(app, cache_seconds=0)
    text = generate_latest(metrics.registry).decode()
    samples = parse(text)

    by_state = series(samples, "scheduler_jobs_by_state")
    assert all(set(labels) == {"state", "queue", "shard"} for labels, _ in by_state)
    assert {labels["shard"] for labels, _ in by_state} == ALL
    for shard in ALL:
        counted = {labels["state"]: n for labels, n in by_state if labels["shard"] == shard}
        assert counted == {"queued": 15, "claimed": 0, "succeeded": 1, "aborted": 1}
    oldest = series(samples, "scheduler_job_oldest_ready_age_seconds")
    assert sorted(labels["shard"] for labels, _ in oldest) == sorted(ALL)

    tasks = {
        (labels["shard"], labels["state"]): n for labels, n in series(samples, "scheduler_tasks")
    }
    for index, names in seeded.tasks.items():
        assert tasks[str(index), "enabled"] == len(names) - 1
        assert tasks[str(index), "disabled"] == 1
    failures = series(samples, "scheduler_task_consecutive_failures")
    assert sorted(labels["task"] for labels, _ in failures) == seeded.names
    for labels, _ in failures:
        assert labels["shard"] == str(seeded.shard_of_task(labels["task"]))
    success = series(samples, "scheduler_task_last_success_timestamp_seconds")
    assert {(labels["task"], labels["shard"]) for labels, _ in success} == {
        (names[0], str(index)) for index, names in seeded.tasks.items()
    }
    assert series(samples, "scheduler_worker_up") == [({"worker": "host:1:abc", "shard": "2"}, 1)]
    dead = series(samples, "scheduler_table_dead_tuples")
    assert {labels["shard"] for labels, _ in dead} == ALL
    assert len(dead) == 4 * SHARDS  # each table of each shard
    assert series(samples, "scheduler_oldest_transaction_age_seconds")[0][0] == {}

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return parse(r.read().decode())


def test_a_worker_of_every_shard_serves_every_shards_gauges_and_runs(seeded: Seeded) -> None:
    app = seeded.app
    worker = ShardedWorker(app, concurrency=4)
    thread = threading.Thread(target=worker.run, name="test-sharded-worker", daemon=True)
    thread.start()
    try:
        assert worker.started.wait(30)
        deadline = time.monotonic() + 60
        while True:
            samples = scrape(app.metrics_settings.port)
            ran = series(samples, "scheduler_job_duration_seconds_count")
            runs = sum(n for labels, n in ran if labels["handler"] == "t.ok")
            ticks = series(samples, "scheduler_tick_duration_seconds_count")
            if runs >= 15 * SHARDS and ticks and ticks[0][1] >= SHARDS:
                break
            assert time.monotonic() < deadline, (ran, ticks)
            time.sleep(0.2)
        ups = series(samples, "scheduler_worker_up")
        assert {labels["shard"] for labels, _ in ups} == ALL
        assert {labels["worker"] for labels, _ in ups} == {app.worker_id}
        assert {labels["shard"] for labels, _ in series(samples, "scheduler_tasks")} == ALL
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_one_shard_has_no_shard_label(app: Scheduler) -> None:
    app.sync([TaskSpec("nightly", "0 3 * * *", "ok")])
    samples = parse(generate_latest(Metrics(app, cache_seconds=0).registry).decode())
    assert series(samples, "scheduler_jobs_by_state")
    assert not [s for s in samples if "shard" in s[1]]
