"""Recovery probes (``recovery = "probe"``): a row the failure limit disabled heals itself.

Under freezegun, as users test: the failure limit disables the row (``row_disabled``), a probe
runs after each interval (its job rerun in place), a failed probe schedules the next, and the
first success re-enables the row and sends ``row_recovered`` once, durably through the outbox.
Also with two processes ticking at the same instant: still one recovery, one alert.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from sqlalchemy import select

from scheduler import ConfigError, Scheduler, TaskSpec, signals
from scheduler._config import load_config
from scheduler._model.handlers import Registry
from scheduler._store.tables import decisions, jobs, rows
from scheduler.testing import capture_signals

T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
ROW = "flaky"


class Outage:
    """The handler fails while ``down`` is true."""

    down = True


def probing_app(url: str, intervals: tuple[float, ...] = (900, 3600)) -> Scheduler:
    app = Scheduler(url, clock="local", registry=Registry())

    @app.handler("call", retry_safe=False)
    def call(job: Any) -> None:
        if Outage.down:
            raise RuntimeError("service down")

    app.sync(
        [
            TaskSpec(
                ROW,
                "*/5 * * * *",
                "call",
                max_consecutive_failures=2,
                recovery="probe",
                probe_intervals=intervals,
            )
        ]
    )
    return app


def row_of(app: Scheduler) -> Any:
    with app.store.read() as conn:
        return conn.execute(select(rows).where(rows.c.name == ROW)).one()


def logged(app: Scheduler, *kinds: str) -> list[tuple[str, str | None]]:
    with app.store.read() as conn:
        stmt = (
            select(decisions.c.decision, decisions.c.detail)
            .where(decisions.c.task_name == ROW, decisions.c.decision.in_(kinds))
            .order_by(decisions.c.id)
        )
        return [(d, detail) for d, detail in conn.execute(stmt)]


def job_count(app: Scheduler) -> int:
    with app.store.read() as conn:
        return len(conn.execute(select(jobs.c.id).where(jobs.c.task_name == ROW)).all())


@pytest.fixture
def frozen() -> Iterator[Any]:
    with freeze_time(T0) as frozen:
        yield frozen


def disable_by_failures(app: Scheduler, frozen: Any) -> None:
    """Two failed runs (a dispatch, a rerun): the third slot reaches the limit."""
    Outage.down = True
    for _ in range(2):
        frozen.move_to(row_of(app).next_run_at)
        app.tick()
        app.work()
    frozen.move_to(row_of(app).next_run_at)
    assert app.tick().disabled == [ROW]


def test_a_failed_probe_schedules_the_next_and_a_success_recovers_once(
    db_url: str, frozen: Any
) -> None:
    app = probing_app(db_url)
    try:
        with capture_signals(signals.row_disabled, signals.row_recovered) as records:
            disable_by_failures(app, frozen)
            disabled_at = datetime.now(UTC)
            row = row_of(app)
            assert not row.enabled and row.probe_at == disabled_at + timedelta(seconds=900)
            assert app.status()["rows"][0]["disabled_reason"] == "max_consecutive_failures"
            state = app.explain(ROW)["state"]
            assert state.startswith("disabled, probing: next probe at")

            frozen.tick(timedelta(seconds=899))  # not yet
            app.tick()
            assert app.work() == 0 and row_of(app).probes == 0

            frozen.tick(timedelta(seconds=1))  # the first probe: the job rerun in place
            app.tick()
            assert row_of(app).probes == 1 and job_count(app) == 1
            assert app.work() == 1  # still down: the probe fails
            app.tick()
            row = row_of(app)
            assert not row.enabled and row.probe_at == datetime.now(UTC) + timedelta(hours=1)

            frozen.tick(timedelta(minutes=59))
            app.tick()
            assert app.work() == 0  # the second probe is not due yet

            Outage.down = False
            frozen.tick(timedelta(minutes=1))
            app.tick()
            assert app.work() == 1  # the second probe succeeds
            assert app.tick().recovered == []  # a tick reads the running probe 5 s on
            frozen.tick(timedelta(seconds=5))
            report = app.tick()
            assert report.recovered == [ROW]
            row = row_of(app)
            assert row.enabled and row.consecutive_failures == 0 and row.probe_at is None
            assert row.next_run_at > datetime.now(UTC) and row.recovery_alert is None
            assert row.probes == 0 and job_count(app) == 1  # every probe ran the same job

            frozen.tick(timedelta(hours=5))  # later ticks: it runs again, no second alert
            app.tick()
            app.work()
            assert app.tick().recovered == []
            assert app.deliver_pending_alerts(older_than=0) == 0
    finally:
        app.close()
    sent = [(signal, kw) for signal, _sender, kw in records]
    assert [s for s, _ in sent] == ["row-disabled", "row-recovered"]
    kw = sent[1][1]
    assert kw["row"] == ROW and kw["probes"] == 2 and kw["alert_id"]
    assert kw["disabled_seconds"] == 900 + 3600 + 5
    assert [d for d, _ in logged(app, "probed", "recovered")] == ["probed", "probed", "recovered"]


def test_a_manual_disable_stops_probing_and_enable_clears_it(db_url: str, frozen: Any) -> None:
    app = probing_app(db_url)
    try:
        disable_by_failures(app, frozen)
        assert row_of(app).probe_at is not None
        app.disable(ROW, reason="maintenance")
        assert row_of(app).probe_at is None
        frozen.tick(timedelta(hours=2))
        app.tick()
        assert app.work() == 0 and logged(app, "probed") == []

        app.enable(ROW)
        row = row_of(app)
        assert row.enabled and row.probe_at is None and row.probes == 0
    finally:
        app.close()


RECOVERED_ONCE = textwrap.dedent(
    """
    import sys
    from datetime import datetime
    from freezegun import freeze_time
    from scheduler import Scheduler, signals
    from scheduler._model.handlers import Registry

    def seen(sender, **kw):
        print("recovered", kw["alert_id"], flush=True)

    signals.row_recovered.connect(seen)
    with freeze_time(datetime.fromisoformat(sys.argv[2])):
        app = Scheduler(sys.argv[1], clock="local", registry=Registry())
        sys.stdin.readline()  # start together
        print("report", app.tick().recovered, flush=True)
        app.close()
    """
)


def test_two_processes_ticking_at_once_recover_the_row_once(db_url: str, frozen: Any) -> None:
    app = probing_app(db_url, intervals=(60,))
    try:
        disable_by_failures(app, frozen)
        frozen.tick(timedelta(seconds=60))
        app.tick()
        Outage.down = False
        assert app.work() == 1  # the probe succeeded; no tick has seen it yet
        now = datetime.now(UTC) + timedelta(seconds=1)
        ticks = [
            subprocess.Popen(
                [sys.executable, "-c", RECOVERED_ONCE, db_url, now.isoformat()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        for process in ticks:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outputs = [process.communicate(timeout=120) for process in ticks]
        for process, (_out, err) in zip(ticks, outputs, strict=True):
            assert process.returncode == 0, err
        lines = [line for out, _err in outputs for line in out.splitlines()]
        assert len([line for line in lines if line.startswith("recovered ")]) == 1
        reports = sorted(line for line in lines if line.startswith("report"))
        assert reports == sorted(["report []", f"report [{ROW!r}]"])  # one of them recovered it
        assert row_of(app).enabled and row_of(app).recovery_alert is None
        assert [d for d, _ in logged(app, "recovered")] == ["recovered"]
    finally:
        app.close()


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ('recovery = "sometimes"', "key 'recovery': expected one of 'manual', 'probe'"),
        ("probe_intervals = []", "key 'probe_intervals': expected a non-empty list"),
        ("probe_intervals = [900, -5]", "key 'probe_intervals': item 1: expected a positive"),
        ('probe_intervals = ["1h"]', "key 'probe_intervals': item 0: expected a positive"),
        ("probe_intervals = 900", "key 'probe_intervals': expected a non-empty list"),
    ],
)
def test_bad_recovery_keys_fail_with_one_line_naming_file_task_and_key(
    db_url: str, tmp_path: Any, keys: str, message: str
) -> None:
    app = Scheduler(db_url, registry=Registry())
    path = tmp_path / "app.toml"
    path.write_text(f'[[tasks]]\nname = "sync"\ncron = "* * * * *"\nhandler = "h"\n{keys}\n')
    try:
        with pytest.raises(ConfigError) as raised:
            app.sync(load_config(str(path)).tasks)
        text = str(raised.value)
        assert "\n" not in text and str(path) in text and "task 'sync'" in text
        assert message in text
        with app.store.read() as conn:
            assert conn.execute(select(rows.c.id)).all() == []  # nothing written
        with pytest.raises(ConfigError, match="task 'py': key 'probe_intervals'"):
            app.sync([TaskSpec("py", "* * * * *", "h", probe_intervals=(0,))])
        with pytest.raises(ConfigError, match="task 'py': key 'recovery'"):
            app.sync([TaskSpec("py", "* * * * *", "h", recovery="auto")])
    finally:
        app.close()


DIE_IN_RECEIVER = textwrap.dedent(
    """
    import os
    import sys
    from datetime import datetime
    from freezegun import freeze_time
    from scheduler import Scheduler, signals
    from scheduler._model.handlers import Registry

    def die(sender, **kw):
        print(kw["alert_id"], flush=True)
        os._exit(1)  # the recovery is committed; the receivers never finish

    signals.row_recovered.connect(die)
    with freeze_time(datetime.fromisoformat(sys.argv[2])):
        app = Scheduler(sys.argv[1], clock="local", registry=Registry())
        app.tick()
    """
)


def test_a_recovery_alert_survives_death_after_the_commit(db_url: str, frozen: Any) -> None:
    app = probing_app(db_url, intervals=(60,))
    try:
        disable_by_failures(app, frozen)
        frozen.tick(timedelta(seconds=60))
        app.tick()
        Outage.down = False
        assert app.work() == 1
        now = datetime.now(UTC) + timedelta(seconds=1)
        done = subprocess.run(
            [sys.executable, "-c", DIE_IN_RECEIVER, db_url, now.isoformat()],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done.stderr
        seen_by_the_dead = done.stdout.strip()
        assert row_of(app).enabled and row_of(app).recovery_alert is not None
        with capture_signals(signals.row_recovered) as records:
            frozen.tick(timedelta(minutes=2))
            assert app.deliver_pending_alerts(older_than=30) == 1
            assert app.deliver_pending_alerts(older_than=0) == 0  # delivered: not again
    finally:
        app.close()
    assert [r.kwargs["alert_id"] for r in records] == [seen_by_the_dead]
    assert records[0].kwargs["probes"] == 1 and records[0].kwargs["disabled_seconds"] == 61


def test_put_task_takes_recovery_and_probe_intervals(db_url: str) -> None:
    app = Scheduler(db_url, registry=Registry())
    try:
        spec = TaskSpec("api", "0 * * * *", "h", recovery="probe", probe_intervals=(30, 120.5))
        app.put_task(spec)
        with app.store.read() as conn:
            found = conn.execute(
                select(rows.c.recovery, rows.c.probe_intervals).where(rows.c.name == "api")
            ).one()
        assert tuple(found) == ("probe", "[30,120.5]")
        assert app.put_task(spec).action == "unchanged"  # stored as given: nothing to write
        assert app.rows()[0].recovery == "probe"
    finally:
        app.close()


def test_status_explain_and_the_dashboard_show_the_next_probe(db_url: str, frozen: Any) -> None:
    from helpers.dashboard_client import client

    app = probing_app(db_url)
    try:
        disable_by_failures(app, frozen)
        probe_at = datetime.now(UTC) + timedelta(seconds=900)
        shown = f"{probe_at:%Y-%m-%d %H:%M:%S}"
        [status] = app.status()["rows"]
        assert status["probe_at"].startswith(probe_at.isoformat()[:19])
        explained = app.explain(ROW)
        assert explained["state"].startswith("disabled, probing: next probe at"), explained
        assert shown in explained["state"] or shown[11:] in explained["state"]
        assert explained["policies"]["recovery"] == "probe"
        c = client(app)
        listing = c.get("/tasks").text
        assert "disabled, probing: next probe at" in listing
        page = c.get(f"/tasks/{ROW}").text
        assert "disabled, probing: next probe at" in page
    finally:
        app.close()
