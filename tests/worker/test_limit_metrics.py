"""The limits' gauges: ``scheduler_limit_in_use{limit}`` and ``scheduler_limit_waiting{limit}``
read from the database on every engine, in text ``promtool check metrics`` accepts."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler import Limit, Scheduler
from scheduler._model.handlers import Registry
from scheduler.metrics import Metrics


@pytest.fixture
def app(db_url: str) -> Iterator[Scheduler]:
    found = Scheduler(
        db_url,
        registry=Registry(),
        limits=[
            Limit("crm-api", handlers=["crm.sync"], concurrency=2, per="tenant"),
            Limit("mail", handlers=["mail.send"], rate="10/1m"),
        ],
    )

    @found.handler("crm.sync")
    def sync(job: Any) -> None:
        pass

    @found.handler("mail.send")
    def send(job: Any) -> None:
        pass

    yield found
    found.close()


def samples(metrics: Metrics) -> tuple[str, dict[tuple[str, str], float]]:
    text = generate_latest(metrics.registry).decode()
    found = {
        (sample.name, sample.labels.get("limit", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("scheduler_limit_")
    }
    return text, found


def test_limit_gauges_count_running_and_waiting(app: Scheduler) -> None:
    for tenant in ("a", "a", "a", "b"):
        app.enqueue("crm.sync", {}, tenant=tenant)
    metrics = Metrics(app, cache_seconds=0)
    try:
        _, found = samples(metrics)
        assert found == {
            ("scheduler_limit_in_use", "crm-api"): 0,
            ("scheduler_limit_in_use", "mail"): 0,
            ("scheduler_limit_waiting", "crm-api"): 4,
            ("scheduler_limit_waiting", "mail"): 0,
        }
        assert len(app.runner().claim(10)) == 3  # two of tenant a, one of b
        text, found = samples(metrics)
        assert found[("scheduler_limit_in_use", "crm-api")] == 3
        assert found[("scheduler_limit_waiting", "crm-api")] == 1
        promtool = shutil.which("promtool")
        if promtool is not None:
            checked = subprocess.run(
                [promtool, "check", "metrics"], input=text, capture_output=True, text=True
            )
            lines = [line for line in checked.stderr.splitlines() if "scheduler_limit" in line]
            assert lines == [], checked.stderr
    finally:
        metrics.close()


def test_no_limit_gauges_without_limits(db_url: str) -> None:
    app = Scheduler(db_url, registry=Registry())
    metrics = Metrics(app, cache_seconds=0)
    try:
        assert samples(metrics)[1] == {}
    finally:
        metrics.close()
        app.close()
