"""A transaction that holds the MVCC horizon: named by ``status``, timed and counted by the
metrics (PostgreSQL). Real transactions held open on the real server."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._model.rules import Thresholds
from scheduler._store.status import health as _health
from scheduler._store.status import horizon as _horizon
from scheduler._store.status.health import HealthSettings
from scheduler.metrics import Metrics


@contextmanager
def held_horizon(url: str, name: str) -> Iterator[int]:
    """A REPEATABLE READ transaction that has taken its snapshot, left idle on `url`'s
    database under application_name `name`; yields its backend's pid."""
    engine = create_engine(url, connect_args={"application_name": name})
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            conn.execute(text("SELECT count(*) FROM scheduler_jobs"))  # the snapshot
            yield int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            conn.rollback()
    finally:
        engine.dispose()


def status(app: Scheduler, thresholds: Thresholds | None = None) -> dict[str, Any]:
    """``_health.status`` given what it needs of ``app``, with other thresholds if asked."""
    settings = app.health_settings()
    if thresholds is not None:
        settings = HealthSettings(
            settings.max_consecutive_failures, settings.clock_mode, thresholds
        )
    return _health.status(app.store, app.clock(), settings)


def mine(warnings: list[str], name: str) -> list[str]:
    return [w for w in warnings if repr(name) in w]


def test_status_names_the_transaction_that_holds_the_horizon(pg_url: str) -> None:
    """Held longer than the threshold: one warning naming its application_name, state and
    pid; under the threshold, or once it ended, none."""
    app = Scheduler(pg_url, registry=Registry())
    name = f"held-by-test-{os.getpid()}"
    try:
        with held_horizon(pg_url, name) as pid:
            time.sleep(1.2)
            warnings = status(app, thresholds=Thresholds(horizon=1.0))["health"]["warnings"]
            [warning] = mine(warnings, name)
            assert f"pid {pid}" in warning and "idle in transaction" in warning, warning
            assert "MVCC horizon for more than 1s" in warning, warning
            assert mine(status(app)["health"]["warnings"], name) == []  # 5 minutes: not yet
            found = [h for h in _read_holders(app) if h.pid == pid]
            assert len(found) == 1 and found[0].age >= 1.0
            assert found[0].application_name == name and found[0].state == "idle in transaction"
        warnings = status(app, thresholds=Thresholds(horizon=0.0))["health"]["warnings"]
        assert mine(warnings, name) == []
    finally:
        app.close()


def _read_holders(app: Scheduler) -> list[_horizon.Holder]:
    with app.store.read() as conn:
        return _horizon.holders(conn, limit=1000)


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text_out = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text_out)
        for s in family.samples
    }


def test_the_gauges_count_dead_rows_and_time_the_oldest_holder(pg_url: str) -> None:
    """On PostgreSQL: a dead-tuple series per scheduler table (the queue's writes leave some),
    and the oldest holder's age (at least the one held here)."""
    app = Scheduler(pg_url, registry=Registry())
    app.registry.handler("h.ok", retry_safe=True)(lambda job: None)
    metrics = Metrics(app, cache_seconds=0)
    try:
        for _ in range(20):
            app.enqueue("h.ok", {})
        assert app.work() == 20  # each job: a claim and an outcome, two dead versions
        deadline = time.monotonic() + 30  # backends report their counts within seconds
        while True:
            s = samples(metrics)
            jobs_dead = s[("scheduler_table_dead_tuples", (("table", "scheduler_jobs"),))]
            if jobs_dead >= 20 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert jobs_dead >= 20
        tables = {dict(k)["table"] for n, k in s if n == "scheduler_table_dead_tuples"}
        assert tables == set(_horizon.TABLES)
        with held_horizon(pg_url, f"held-by-gauge-test-{os.getpid()}"):
            time.sleep(1.2)
            age = samples(metrics)[("scheduler_oldest_transaction_age_seconds", ())]
            assert age >= 1.0
    finally:
        metrics.close()
        app.close()


@pytest.fixture(params=["sqlite", "mariadb"])
def other_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    from conftest import make_url

    return make_url(request.param, tmp_path, sqlite_template)


def test_no_horizon_figures_elsewhere(other_url: str) -> None:
    """SQLite and MariaDB: no such gauges, no such warning, nothing read."""
    app = Scheduler(other_url, registry=Registry())
    try:
        metrics = Metrics(app, cache_seconds=0)
        try:
            names = {n for n, _ in samples(metrics)}
        finally:
            metrics.close()
        assert "scheduler_oldest_transaction_age_seconds" not in names
        assert not any(n.startswith("scheduler_table_dead_tuples") for n in names)
        with app.store.read() as conn:
            assert _horizon.holders(conn) == [] and _horizon.dead_tuples(conn) == {}
        assert not any("horizon" in w for w in status(app)["health"]["warnings"])
    finally:
        app.close()
