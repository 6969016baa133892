"""Faults, for real: death after a committed disable, racing ticks, kill -9, SQLite contention.

The alert tests kill a process inside its ``row_disabled`` receiver (``os._exit``: the disable
is committed, the receivers never finished) and check that the outbox still delivers the alert,
once, with the ``alert_id`` stored with the disable. The others are the short versions of the
scripts in ``reliability/`` (the long runs live there), asserting their must-be-0 figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from scheduler import Scheduler, TaskSpec, signals
from scheduler._model.handlers import Registry
from scheduler._store.tables import rows
from scheduler.testing import ManualClock, capture_signals

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reliability"))

import connection_cuts  # noqa: E402
import crash_loop  # noqa: E402
import queue_race  # noqa: E402
import racing_schedulers  # noqa: E402
import sqlite_contention  # noqa: E402

ROW = "doomed"


# -- alert durability --------------------------------------------------------------------------
class Boom(RuntimeError):
    code = "boom"


def doomed_app(url: str, clock: ManualClock) -> Scheduler:
    registry = Registry()

    @registry.handler("doomed.fail", retry_safe=True, max_attempts=1)
    def fail(job: Any) -> None:
        raise Boom("always")

    return Scheduler(url, registry=registry, clock=clock)


def one_failure_behind(url: str, start: datetime) -> ManualClock:
    """A row whose next tick disables it: limit 1, its job aborted. Returns the clock."""
    clock = ManualClock(start)
    app = doomed_app(url, clock)
    try:
        app.sync([TaskSpec(ROW, "* * * * *", "doomed.fail", {}, "UTC", max_consecutive_failures=1)])
        clock.advance(minutes=2)
        assert app.tick().dispatched == [ROW]
        assert app.work() == 1
        row = app.get_row(ROW)
        assert row is not None and row.last_job_state == "aborted"
    finally:
        app.close()
    clock.advance(minutes=2)
    return clock


DIE_IN_RECEIVER = textwrap.dedent(
    """
    import os, sys
    from datetime import datetime
    from scheduler import Scheduler, signals
    from scheduler._model.handlers import Registry

    def die(sender, **kw):
        sys.stdout.write("receiver reached: " + kw["alert_id"] + "\\n")
        sys.stdout.flush()
        os._exit(1)  # the disable is committed; the process dies before the receivers finish

    signals.row_disabled.connect(die)
    app = Scheduler(sys.argv[1], registry=Registry())
    app.tick(now=datetime.fromisoformat(sys.argv[2]))
    sys.exit(0)  # not reached
    """
)


def die_while_alerting(url: str, now: datetime) -> str:
    """Tick in a process that dies inside its row_disabled receiver; return the alert_id."""
    done = subprocess.run(
        [sys.executable, "-c", DIE_IN_RECEIVER, url, now.isoformat()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout.strip().removeprefix("receiver reached: ")


def stored_alert(url: str) -> tuple[str | None, bool]:
    app = Scheduler(url, registry=Registry())
    try:
        with app.store.read() as conn:
            found = conn.execute(
                select(rows.c.alert_id, rows.c.enabled).where(rows.c.name == ROW)
            ).one()
        return found.alert_id, bool(found.enabled)
    finally:
        app.close()


def test_an_alert_survives_death_after_the_commit(db_url_sp: str) -> None:
    clock = one_failure_behind(db_url_sp, datetime(2030, 1, 1, tzinfo=UTC))
    seen_by_the_dead = die_while_alerting(db_url_sp, clock.now)
    alert_id, enabled = stored_alert(db_url_sp)
    assert not enabled  # the disable was committed before the receiver ran
    assert alert_id is not None and alert_id == seen_by_the_dead

    app = Scheduler(db_url_sp, registry=Registry(), clock=clock)
    try:
        with capture_signals(signals.row_disabled) as records:
            clock.advance(seconds=10)  # too fresh: its own process may still be delivering
            assert app.deliver_pending_alerts(older_than=30) == 0
            clock.advance(seconds=30)
            assert app.deliver_pending_alerts(older_than=30) == 1
            assert app.deliver_pending_alerts(older_than=30) == 0  # delivered: not again
            clock.advance(hours=1)
            assert app.deliver_pending_alerts(older_than=0) == 0
    finally:
        app.close()
    assert len(records) == 1
    _, sender, kw = records[0]
    assert sender == ROW
    assert kw["alert_id"] == alert_id  # the same stable id the dead process had
    assert (kw["row"], kw["consecutive_failures"], kw["last_error_code"]) == (ROW, 1, "boom")
    assert stored_alert(db_url_sp) == (None, False)


def test_a_normal_disable_alerts_exactly_once(db_url_sp: str) -> None:
    clock = one_failure_behind(db_url_sp, datetime(2030, 1, 1, tzinfo=UTC))
    app = doomed_app(db_url_sp, clock)
    try:
        with capture_signals(signals.row_disabled) as records:
            assert app.tick().disabled == [ROW]
            clock.advance(hours=1)
            assert app.deliver_pending_alerts(older_than=0) == 0
            assert app.tick().disabled == []
    finally:
        app.close()
    assert len(records) == 1 and records[0].kwargs["alert_id"]
    assert stored_alert(db_url_sp) == (None, False)


ALERT_SINK = textwrap.dedent(
    """
    import json, os
    from scheduler import signals

    @signals.row_disabled.connect
    def sink(sender, **kw):
        with open(os.environ["ALERT_SINK"], "a") as f:
            f.write(json.dumps({"row": kw["row"], "alert_id": kw["alert_id"]}) + "\\n")
    """
)


def test_the_worker_delivers_an_orphaned_alert_at_start_up(db_url_sp: str, tmp_path: Path) -> None:
    # In real time this time: the disable happened minutes ago, its process died.
    clock = one_failure_behind(db_url_sp, datetime.now(UTC) - timedelta(minutes=10))
    alert_id = die_while_alerting(db_url_sp, clock.now)
    (tmp_path / "alert_sink.py").write_text(ALERT_SINK)
    config = tmp_path / "app.toml"
    config.write_text('[worker]\nimports = ["alert_sink"]\nconcurrency = 1\n')
    sink = tmp_path / "alerts.jsonl"
    env = {**os.environ, "SCHEDULER_DATABASE_URL": db_url_sp, "ALERT_SINK": str(sink)}

    def worker_once() -> None:
        done = subprocess.run(
            [sys.executable, "-m", "scheduler.cli", "--config", str(config), "worker", "--once"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr, done.stderr

    worker_once()
    delivered = [json.loads(line) for line in sink.read_text().splitlines()]
    assert delivered == [{"row": ROW, "alert_id": alert_id}]
    worker_once()  # a second worker run finds nothing left to deliver
    assert len(sink.read_text().splitlines()) == 1


def test_an_undelivered_alert_is_redelivered_with_the_same_id(db_url_sp: str) -> None:
    """At-least-once: a sweep that dies in the receivers leaves the alert for the next one."""
    clock = one_failure_behind(db_url_sp, datetime(2030, 1, 1, tzinfo=UTC))
    alert_id = die_while_alerting(db_url_sp, clock.now)
    # A second death, this time in the sweep's own receivers, must not lose the alert either.
    app = Scheduler(db_url_sp, registry=Registry())
    try:
        with app.store.begin() as conn:  # make it old enough for a real-time sweep
            conn.execute(
                update(rows)
                .where(rows.c.name == ROW)
                .values(disabled_at=datetime.now(UTC) - timedelta(minutes=5))
            )
    finally:
        app.close()
    sweep = textwrap.dedent(
        """
        import os, sys
        from scheduler import Scheduler, signals
        from scheduler._model.handlers import Registry

        def die(sender, **kw):
            os._exit(1)

        signals.row_disabled.connect(die)
        Scheduler(sys.argv[1], registry=Registry()).deliver_pending_alerts()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", sweep, db_url_sp], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert stored_alert(db_url_sp) == (alert_id, False)
    app = Scheduler(db_url_sp, registry=Registry())
    try:
        with capture_signals(signals.row_disabled) as records:
            assert app.deliver_pending_alerts() == 1
            assert app.deliver_pending_alerts() == 0
    finally:
        app.close()
    assert [r.kwargs["alert_id"] for r in records] == [alert_id]


# -- the short versions of reliability/ ---------------------------------------------------------
def must_be_zero(figures: list[Any], notes: list[str]) -> None:
    failed = {f.name: f.value for f in figures if f.must_be_zero and f.value != 0}
    assert not failed, (failed, notes)


@pytest.fixture(params=["postgresql", "mariadb"])
def server_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A migrated, empty database on PostgreSQL and on MariaDB."""
    from conftest import make_url

    return make_url(request.param, tmp_path, sqlite_template)


def test_two_processes_race_their_ticks(server_url: str, tmp_path: Path) -> None:
    figures, notes = racing_schedulers.run(
        server_url,
        processes=2,
        seconds=4,
        rows=24,
        concurrency=4,
        prepare=False,
        out=tmp_path,
        verbose=False,
    )
    must_be_zero(figures, notes)
    values = {f.name: f.value for f in figures}
    assert values["dispatched (fresh jobs)"] > 24  # the rows really ran, more than once
    assert values["rows disabled"] >= 1  # an always-failing one


@pytest.mark.parametrize(
    "backend",
    [
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.slow),
        pytest.param("mariadb", marks=pytest.mark.slow),
    ],
)
def test_one_kill_9_round(backend: str, tmp_path: Path, sqlite_template: Path) -> None:
    if backend == "sqlite":
        url, prepare = f"sqlite:///{tmp_path / 'crash.db'}", True
    else:
        from conftest import make_url

        url, prepare = make_url(backend, tmp_path, sqlite_template), False
    figures, notes = crash_loop.run(
        url, rounds=1, seed=7, prepare=prepare, out=tmp_path, verbose=False
    )
    must_be_zero(figures, notes)
    values = {f.name: f.value for f in figures}
    assert values["kills (kill -9)"] == 1
    assert values["kills while a handler ran"] == 1


def test_three_processes_race_work_on_mariadb(tmp_path: Path, sqlite_template: Path) -> None:
    """Issue 18: three processes call work() on one job set; no deadlock reaches them."""
    from conftest import make_url

    url = make_url("mariadb", tmp_path, sqlite_template)
    figures, notes = queue_race.run(
        url, runs=2, processes=3, jobs=60, prepare=False, out=tmp_path, verbose=False
    )
    must_be_zero(figures, notes)


def test_a_few_seconds_of_sqlite_contention(tmp_path: Path) -> None:
    figures, notes = sqlite_contention.run(
        f"sqlite:///{tmp_path / 'busy.db'}", seconds=3, workers=4, rows=20, out=tmp_path
    )
    must_be_zero(figures, notes)
    values = {f.name: f.value for f in figures}
    assert values["jobs succeeded"] > 0


@pytest.mark.slow
def test_connections_cut_for_20_seconds(pg_url: str, tmp_path: Path) -> None:
    """The short run of reliability/connection_cuts.py: the worker's backends
    terminated at random moments for 20 s; every must-be-0 figure is 0, the worker runs on."""
    figures, notes = connection_cuts.run(
        pg_url, seconds=20, every=(0.1, 1.0), rate=10, seed=17, prepare=False, out=tmp_path
    )
    must_be_zero(figures, notes)
    values = {f.name: f.value for f in figures}
    if os.environ.get("SCHEDULER_DATABASE_POOLER") != "transaction":
        assert values["backends terminated"] >= 10  # the cuts happened
        assert values["cuts inside a statement"] >= 3
    else:  # through PgBouncer a server connection bears the worker's application_name only
        # while it serves one of its transactions: fewer backends are found to cut
        assert values["backends terminated"] >= 1
    assert values["task dispatches announced"] > 200  # and the schedule ran meanwhile
    assert values["jobs succeeded"] > 100
    assert "worker still running: yes" in notes
