"""One clock (SPEC §13): decisions on the database server's clock.

Real servers throughout; hosts whose clocks are off are real processes under Debian's
``faketime`` (it moves the process's wall clock and its steady counters alike).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers.server_clock import finish, read_jsonl, record_inserts, server_now, start_worker
from sqlalchemy import func, select

from scheduler import Scheduler, TaskSpec
from scheduler._config import parse_config
from scheduler._errors import ConfigError
from scheduler._model.handlers import Registry
from scheduler._model.time import utcnow
from scheduler._store import Store
from scheduler._store.clock import CLOCK_ENV, DatabaseClock, choose
from scheduler._store.status import health as _health
from scheduler._store.tables import jobs, runs
from scheduler._worker.worker import Worker
from scheduler.testing import ManualClock


@pytest.fixture(params=["postgresql", "mariadb"])
def server_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    from conftest import make_url

    return make_url(request.param, tmp_path, sqlite_template)


# Skipped on a developer's machine without Debian's faketime; with CI=true it must run
# (.ci/run installs it), so a missing tool fails the run instead of skipping.
needs_faketime = pytest.mark.skipif(
    shutil.which("faketime") is None and os.environ.get("CI", "").lower() not in ("1", "true"),
    reason="faketime is not installed (apt-get install faketime)",
)


# -- choosing the clock ----------------------------------------------------------------------
def test_the_default_is_the_database_clock_on_servers_and_local_on_sqlite(
    server_url: str, tmp_path: Path, sqlite_template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CLOCK_ENV, raising=False)
    app = Scheduler(server_url, registry=Registry())
    try:
        assert app.clock_mode == "database" and isinstance(app.clock, DatabaseClock)
        offset = app.clock_offset()
        assert offset is not None and abs(offset) < 0.5  # the server runs on this host
    finally:
        app.close()
    lite = tmp_path / "c.db"
    shutil.copy(sqlite_template, lite)
    for mode in (None, "database", "local"):
        app = Scheduler(f"sqlite:///{lite}", registry=Registry(), clock=mode)
        assert (app.clock_mode, app.clock, app.clock_offset()) == ("local", utcnow, None)
        app.close()


def test_local_injected_env_and_bad_values(
    server_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = Store(server_url)
    try:
        monkeypatch.delenv(CLOCK_ENV, raising=False)
        manual = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
        injected = choose(store, manual, "database")
        assert (injected.mode, injected.clock, injected.meter) == ("local", manual, None)
        local = choose(store, "local", "database")
        assert (local.mode, local.clock) == ("local", utcnow)
        assert local.meter is not None  # the offset is still measured, for status
        assert choose(store, None, "local").mode == "local"
        monkeypatch.setenv(CLOCK_ENV, "local")
        assert choose(store, None, "database").mode == "local"  # the env wins over the key
        assert choose(store, "database", "local").mode == "database"  # code wins over the env
        monkeypatch.setenv(CLOCK_ENV, "server")
        with pytest.raises(ConfigError, match=r"^SCHEDULER_CLOCK: expected 'database' or 'local'"):
            choose(store, None, "database")
    finally:
        store.dispose()
    with pytest.raises(ConfigError) as bad:
        parse_config({"scheduler": {"clock": "utc"}}, str(tmp_path / "app.toml"))
    assert str(bad.value) == (
        f"{tmp_path / 'app.toml'}: [scheduler]: key 'clock': expected 'database' or 'local',"
        " got 'utc'"
    )
    config = parse_config({"scheduler": {"clock": "local"}}, "app.toml")
    assert config.scheduler.clock == "local"


def test_the_database_clock_is_the_servers_time(server_url: str) -> None:
    store = Store(server_url)
    clock = DatabaseClock(store)
    try:
        for _ in range(3):
            before = server_now(server_url)
            ours = clock()
            after = server_now(server_url)
            # The reading's error: at most half its round trip (plus the counter's drift).
            slack = timedelta(seconds=clock.reading().round_trip / 2 + 0.002)
            assert before - slack <= ours <= after + slack
    finally:
        store.dispose()


@needs_faketime
def test_a_host_five_minutes_ahead_reads_the_databases_time(server_url: str) -> None:
    """The process's wall clock is 5 minutes ahead; its scheduler's clock is not."""
    import subprocess
    import sys

    script = (
        "import sys, json; from scheduler._store import Store;"
        " from scheduler._store.clock import DatabaseClock;"
        " from datetime import datetime, UTC;"
        " c = DatabaseClock(Store(sys.argv[1]));"
        " print(json.dumps([c().isoformat(), datetime.now(UTC).isoformat(), c.offset()]))"
    )
    before = server_now(server_url)
    done = subprocess.run(
        ["faketime", "-f", "+5m", sys.executable, "-c", script, server_url],
        env={**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    after = server_now(server_url)
    ours, wall, offset = __import__("json").loads(done.stdout)
    assert before <= datetime.fromisoformat(ours) <= after
    assert datetime.fromisoformat(wall) > after + timedelta(minutes=4)  # faketime did its part
    assert offset == pytest.approx(-300, abs=1)


# -- status -----------------------------------------------------------------------------------
def test_status_warns_about_a_host_clock_more_than_two_seconds_off(server_url: str) -> None:
    app = Scheduler(server_url, registry=Registry())
    try:
        host = socket.gethostname()
        now = app.clock()
        _health.touch(app.store, "w-ahead", now, None, clock_offset=-5.25)  # host 5.25 s ahead
        warnings = app.status()["health"]["warnings"]
        clock_warnings = [w for w in warnings if "clock" in w]
        assert clock_warnings == [
            f"host {host}'s clock is 5.2s ahead of the database's (more than 2s; measured by"
            ' w-ahead): fix its time sync (NTP); with clock = "database" the scheduler decides'
            " on the database's clock meanwhile"
        ]
        _health.touch(app.store, "w-ahead", app.clock(), None, clock_offset=1.5)
        assert not [w for w in app.status()["health"]["warnings"] if "clock" in w]
        _health.touch(app.store, "w-ahead", app.clock(), None, clock_offset=3.0)
        [behind] = [w for w in app.status()["health"]["warnings"] if "clock" in w]
        assert "3.0s behind the database's" in behind
        workers = app.status()["health"]["workers"]
        assert [w["clock_offset"] for w in workers if w["id"] == "w-ahead"] == [3.0]
    finally:
        app.close()


def test_a_worker_records_its_hosts_offset(server_url: str) -> None:
    app = Scheduler(server_url, registry=Registry(), worker_id="me", concurrency=0)
    try:
        worker = Worker(app)
        worker._touch(force=True)
        [me] = [w for w in app.status()["health"]["workers"] if w["id"] == "me"]
        assert me["clock_offset"] is not None and abs(me["clock_offset"]) < 0.5
    finally:
        app.close()


# -- two hosts, clocks 10 minutes apart -------------------------------------------------------
TASKS = 8
RUN_SECONDS = 14.0


JOBS = 16


def _sync_tasks(url: str) -> None:
    """The tasks, and jobs ready now (by the database's clock) for both hosts to claim: a
    host that misreads the other's leases takes them over."""
    app = Scheduler(url, registry=Registry(), clock="database")
    try:
        specs = [TaskSpec(f"t{n}", "* * * * * */2", "clk.job", {}, "UTC") for n in range(TASKS)]
        app.sync(specs)
        for _ in range(JOBS):
            app.enqueue("clk.job")
    finally:
        app.close()


def _two_hosts(url: str, tmp_path: Path, *, ahead_clock: str) -> dict[str, Any]:
    """Two worker processes on `url`, one 5 minutes behind, one 5 minutes ahead (its clock
    mode `ahead_clock`); what they did, judged on the database's clock."""
    _sync_tasks(url)
    out = tmp_path / "out"
    out.mkdir()
    with record_inserts(url) as inserts:
        started = server_now(url)
        # The host behind starts first and claims the ready jobs: the one ahead, when it
        # starts, looks for expired leases before it claims (a misread lease is taken over).
        procs = [start_worker(url, out, "behind", RUN_SECONDS, shift="-5m")]
        time.sleep(1.5)
        procs.append(start_worker(url, out, "ahead", RUN_SECONDS, shift="+5m", clock=ahead_clock))
        results = [finish(proc) for proc in procs]
        inserted = inserts["read"]()
    dispatches = read_jsonl(out / "dispatched.jsonl")
    store = Store(url)
    try:
        with store.read() as conn:
            takeovers = conn.execute(
                select(func.count()).select_from(runs).where(runs.c.outcome == "lost")
            ).scalar_one()
            states = Counter(
                {
                    s: n
                    for s, n in conn.execute(
                        select(jobs.c.state, func.count()).group_by(jobs.c.state)
                    )
                }
            )
            abandoned = conn.execute(
                select(func.count()).select_from(runs).where(runs.c.outcome == "abandoned")
            ).scalar_one()
    finally:
        store.dispose()
    early = [d for d in dispatches if inserted[d["job_id"]] < datetime.fromisoformat(d["slot"])]
    slots = Counter((d["row"], d["slot"]) for d in dispatches)
    return {
        "results": results,
        "dispatches": dispatches,
        "inserted": inserted,
        "early": early,
        "doubled": [key for key, n in slots.items() if n > 1],
        "takeovers": takeovers,
        "abandoned": abandoned,
        "states": states,
        "started": started,
        "lease_lost": sum(r["stderr"].count("lease lost before it finished") for r in results),
    }


@pytest.mark.slow
@needs_faketime
def test_two_hosts_ten_minutes_apart_agree_on_the_databases_clock(
    server_url: str, tmp_path: Path
) -> None:
    seen = _two_hosts(server_url, tmp_path, ahead_clock="-")
    assert {r["worker"]: r["mode"] for r in seen["results"]} == {
        "behind": "database",
        "ahead": "database",
    }
    offsets = {r["worker"]: r["offset"] for r in seen["results"]}
    assert offsets["behind"] == pytest.approx(300, abs=1)
    assert offsets["ahead"] == pytest.approx(-300, abs=1)
    assert len(seen["dispatches"]) >= TASKS * 3  # the schedule ran
    # Both ticked all along. Which of them dispatches a slot is a race that the one whose tick
    # comes first on the grid usually wins; the one ahead, were it on its own clock, would
    # dispatch every slot five minutes early, first.
    assert all(r["ticks"] >= RUN_SECONDS for r in seen["results"]), seen["results"]
    assert seen["early"] == []  # 0 slots fired before their time by the database's clock
    assert seen["doubled"] == []  # each slot once
    # Every job inserted meanwhile is one the tick announced (the enqueued ones came before).
    assert set(seen["inserted"]) == {d["job_id"] for d in seen["dispatches"]}
    assert seen["takeovers"] == 0 and seen["abandoned"] == 0  # 0 false takeovers
    assert seen["lease_lost"] == 0
    assert seen["states"]["aborted"] == 0


@pytest.mark.slow
@pytest.mark.direct
@needs_faketime
def test_the_same_hosts_on_their_own_clocks_fire_early_and_take_over(
    pg_url: str, tmp_path: Path
) -> None:
    """The control: the host 5 minutes ahead on its local clock fires slots early and takes
    over the other's healthy jobs (what the test above would see without the database's
    clock)."""
    seen = _two_hosts(pg_url, tmp_path, ahead_clock="local")
    assert seen["early"] != []
    assert seen["takeovers"] + seen["abandoned"] > 0
