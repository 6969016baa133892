"""The ``config/`` folder people copy to deploy: the production TOML loads, the systemd units
agree with it, the Prometheus rules pass ``promtool check rules`` and their unit tests, and
the Grafana dashboard is well formed. (That every metric name they use exists in a real
worker's scrape is checked in test_metrics.py, which runs one.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from conftest import IN_CI
from helpers.config_metrics import CONFIG, config_metric_names

from scheduler._config import load_config


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed (Debian: apt-get install prometheus)"
        if IN_CI:
            pytest.fail(f"{message}; CI requires it", pytrace=False)
        pytest.skip(message)
    return found


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", "alerts.yml"],
        cwd=CONFIG / "prometheus",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout + done.stderr


def test_promtool_unit_tests_fire_and_do_not_fire_each_alert() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", "alerts_test.yml"],
        cwd=CONFIG / "prometheus",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tests = (CONFIG / "prometheus" / "alerts_test.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)", (CONFIG / "prometheus" / "alerts.yml").read_text())
    assert len(alerts) == 7
    for alert in alerts:  # each alert is tested firing and not firing
        blocks = re.split(r"\n\s+- eval_time:", tests)
        mine = [b for b in blocks if f"alertname: {alert}\n" in b]
        assert any("exp_alerts: []" in b for b in mine), f"{alert}: no test where it stays quiet"
        assert any("exp_labels:" in b for b in mine), f"{alert}: no test where it fires"


def test_promtool_checks_the_scrape_config() -> None:
    done = subprocess.run(
        [promtool(), "check", "config", "prometheus.yml"],
        cwd=CONFIG / "prometheus",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_production_toml_loads_with_our_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    monkeypatch.delenv("SCHEDULER_METRICS_PORT", raising=False)
    config = load_config(CONFIG / "production.toml")
    assert config.database_url.startswith("postgresql+psycopg://")
    assert config.metrics.port == 9464
    assert config.worker.concurrency > 1
    assert [task.name for task in config.tasks] == ["nightly-report"]


def unit(name: str) -> dict[str, list[str]]:
    """The [Service] section of a unit: each key's values, in order (keys may repeat)."""
    section, found = "", {}
    values: dict[str, list[str]] = {}
    for line in (CONFIG / "systemd" / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            found[section] = True
            continue
        key, _, value = line.partition("=")
        if section == "Service":
            values.setdefault(key, []).append(value)
    assert {"Unit", "Service", "Install"} <= set(found), name
    return values


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("scheduler-worker.service", "scheduler worker"),
        ("scheduler-worker@.service", "scheduler worker"),
        ("scheduler-dashboard.service", "scheduler dashboard"),
    ],
)
def test_systemd_units(name: str, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service = unit(name)
    (exec_start,) = service["ExecStart"]
    assert exec_start.startswith(f"/srv/myapp/.venv/bin/{command}")
    assert "SCHEDULER_CONFIG=/srv/myapp/app.toml" in service["Environment"]
    assert service["User"] == ["myapp"] and service["Restart"] == ["on-failure"]
    if "worker" in name:
        # systemd must wait longer than the worker's grace before it sends SIGKILL.
        monkeypatch.delenv("SCHEDULER_METRICS_PORT", raising=False)
        grace = load_config(CONFIG / "production.toml").worker.shutdown_grace_seconds
        assert float(service["TimeoutStopSec"][0]) > grace
        assert service["KillSignal"] == ["SIGTERM"] and service["KillMode"] == ["mixed"]


def test_template_unit_gives_each_instance_its_port(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (CONFIG / "systemd" / "scheduler-worker@.service").read_text()
    assert "Environment=SCHEDULER_METRICS_PORT=946%i" in text
    monkeypatch.setenv("SCHEDULER_METRICS_PORT", "946%i".replace("%i", "2"))
    assert load_config(CONFIG / "production.toml").metrics.port == 9462


def test_grafana_dashboard_is_well_formed() -> None:
    dashboard = json.loads((CONFIG / "grafana" / "scheduler.json").read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert graphs and all(p["targets"] and p["gridPos"] for p in graphs)
    assert all(t["expr"].strip() for p in graphs for t in p["targets"])


def test_rules_and_dashboard_use_the_spec_names() -> None:
    names = config_metric_names()
    bases = {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}
    for spec in (
        "scheduler_jobs_total",
        "scheduler_job_duration_seconds",
        "scheduler_job_queue_wait_seconds",
        "scheduler_dispatch_lateness_seconds",
        "scheduler_tick_duration_seconds",
        "scheduler_tick_decisions_total",
        "scheduler_jobs_by_state",
        "scheduler_tasks",
        "scheduler_task_last_success_timestamp_seconds",
        "scheduler_task_consecutive_failures",
        "scheduler_worker_up",
    ):
        assert spec in bases, f"{spec} is in neither the rules nor the dashboard"
