"""Many scheduler processes tick the same rows at once: each due slot is dispatched once.

Real processes (``tick_race_worker.py``) on one database: four on PostgreSQL, two on SQLite.
They tick the same simulated instants in lock-step (a file barrier), running ``work()`` after
each tick, so every slot of every row is contended by all of them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from scheduler import Scheduler, TaskSpec
from scheduler._model import slots as _slots
from scheduler._model.handlers import Registry
from scheduler._store.tables import decisions, jobs, rows
from scheduler.testing import ManualClock

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "tick_race_worker.py"
BASE = datetime(2030, 1, 1, tzinfo=UTC)
STEPS = 10
GLOBAL_LIMIT = 4  # tick_race_worker.GLOBAL_LIMIT
OK_ROWS = [f"ok-serial-{i}" for i in range(3)] + [f"ok-concurrent-{i}" for i in range(3)]
FAILING = {"fail-2": 2, "fail-3": 3, "fail-global": GLOBAL_LIMIT}


def tasks() -> list[TaskSpec]:
    specs = [
        TaskSpec(
            name,
            "* * * * *",
            "race.ok",
            {"n": i},
            "UTC",
            concurrent=name.startswith("ok-concurrent"),
        )
        for i, name in enumerate(OK_ROWS)
    ]
    specs += [
        TaskSpec(
            name,
            "* * * * *",
            "race.fail",
            {},
            "UTC",
            max_consecutive_failures=None if name == "fail-global" else limit,
        )
        for name, limit in FAILING.items()
    ]
    return specs


def minute(i: int) -> datetime:
    return BASE + timedelta(minutes=i)


def run_racers(url: str, directory: Path, processes: int) -> list[dict[str, int]]:
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                url,
                str(directory),
                str(i),
                str(processes),
                str(STEPS),
                BASE.isoformat(),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    reports = []
    for racer in racers:
        try:
            out, err = racer.communicate(timeout=90)
        finally:
            if racer.poll() is None:
                racer.kill()
        assert racer.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def read_signals(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("signals-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def test_processes_dispatch_each_slot_exactly_once(db_url: str, tmp_path: Path) -> None:
    processes = 2 if db_url.startswith("sqlite") else 4
    app = Scheduler(db_url, registry=Registry(), clock=ManualClock(BASE))
    try:
        app.sync(tasks())
        reports = run_racers(db_url, tmp_path, processes)
        records = read_signals(tmp_path)

        # the tick reports, summed across processes
        total = Counter[str]()
        for report in reports:
            total.update(report)
        assert total["dispatched"] == len(OK_ROWS) * STEPS + len(FAILING)
        assert total["rerun"] == sum(limit - 1 for limit in FAILING.values())
        assert total["disabled"] == len(FAILING)
        assert total["held_back"] == 0  # each job ended before the next instant
        if processes == 4:
            assert total["lost_race"] > 0, "the processes never contended: the race was not run"

        # every slot of every row dispatched exactly once, by exactly one process
        dispatched = [(r["row"], r["slot"]) for r in records if r["signal"] == "dispatched"]
        expected = {(name, minute(i).isoformat()) for name in OK_ROWS for i in range(1, STEPS + 1)}
        expected |= {(name, minute(1).isoformat()) for name in FAILING}
        assert sorted(dispatched) == sorted(expected)  # no duplicates, none missing

        reruns = sorted((r["row"], r["failures"]) for r in records if r["signal"] == "rerun")
        assert reruns == sorted(
            (name, n) for name, limit in FAILING.items() for n in range(1, limit)
        )

        # row_disabled: exactly once per failing row, across all processes, after the commit
        disabled = [r for r in records if r["signal"] == "row_disabled"]
        assert sorted((r["row"], r["failures"]) for r in disabled) == sorted(FAILING.items())
        for r in disabled:
            assert (r["code"], r["seen_enabled"], r["seen_reason"]) == (
                "race_failure",
                False,
                "max_consecutive_failures",
            )
        assert len({r["alert_id"] for r in disabled}) == len(FAILING)

        # the database agrees: one job per slot for healthy rows, one job per failing row
        with app.store.read() as conn:
            per_row = dict(
                conn.execute(
                    select(jobs.c.task_name, func.count()).group_by(jobs.c.task_name)
                ).all()
            )
            states = dict(
                conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all()
            )
            pending_alerts = conn.execute(
                select(func.count()).select_from(rows).where(rows.c.alert_id.is_not(None))
            ).scalar_one()
        assert per_row == {**dict.fromkeys(OK_ROWS, STEPS), **dict.fromkeys(FAILING, 1)}
        assert states == {"succeeded": len(OK_ROWS) * STEPS, "aborted": len(FAILING)}
        assert pending_alerts == 0
        for name in OK_ROWS:
            found = app.get_row(name)
            assert found is not None
            assert (found.enabled, found.next_run_at) == (True, minute(STEPS + 1))
        for name, limit in FAILING.items():
            found = app.get_row(name)
            assert found is not None and found.last_job_id is not None
            assert (found.enabled, found.disabled_reason, found.consecutive_failures) == (
                False,
                "max_consecutive_failures",
                limit,
            )
            history = app.history(found.last_job_id)
            assert [h["outcome"] for h in history] == ["aborted"] * limit
    finally:
        app.close()


SKIP_ROWS = ["skip-0", "skip-1", "skip-jitter"]
JITTER_ROWS = ["jitter-0", "jitter-1", "jitter-2"]
JITTER = 30


def policy_tasks() -> list[TaskSpec]:
    every = "* * * * *"
    specs = [
        TaskSpec(n, every, "race.never", {}, "UTC", overlap="skip", jitter=JITTER * n.endswith("r"))
        for n in SKIP_ROWS
    ]
    specs += [TaskSpec(n, every, "race.ok", {}, "UTC", jitter=JITTER) for n in JITTER_ROWS]
    return specs


def jittered_slots(name: str) -> list[datetime]:
    """The slots a jittered every-minute row dispatches over the racers' ticks, worked out with
    the cron functions (the row was synced at BASE)."""
    every = "* * * * *"
    run_at = _slots.first_run(every, "UTC", name, BASE, JITTER)
    found = []
    for i in range(1, STEPS + 1):
        if run_at <= minute(i):
            found.append(_slots.slot_of(every, "UTC", name, run_at, JITTER))
            run_at = _slots.next_run(every, "UTC", name, minute(i), JITTER)
    return found


def test_processes_skip_and_jitter_each_slot_once(db_url: str, tmp_path: Path) -> None:
    """overlap = "skip" and jitter under racing processes: every slot is dispatched or skipped
    exactly once, its decision logged once, its signal sent once (on MariaDB through the
    one-query dispatch whose swap refuses to wait)."""
    processes = 2 if db_url.startswith("sqlite") else 4
    app = Scheduler(db_url, registry=Registry(), clock=ManualClock(BASE))
    try:
        app.sync(policy_tasks())
        reports = run_racers(db_url, tmp_path, processes)
        records = read_signals(tmp_path)
        total = Counter[str]()
        for report in reports:
            total.update(report)

        assert total["lost_race"] + total["locked"] > 0  # they did race for the rows
        later = [minute(i).isoformat() for i in range(2, STEPS + 1)]
        skipped = sorted((r["row"], r["slot"]) for r in records if r["signal"] == "skipped")
        plain = {(n, s) for n in SKIP_ROWS[:2] for s in later}
        jittered = {("skip-jitter", s.isoformat()) for s in jittered_slots("skip-jitter")[1:]}
        assert skipped == sorted(plain | jittered)  # once each, by one process
        assert total["skipped_overlap"] == len(skipped)
        dispatched = sorted((r["row"], r["slot"]) for r in records if r["signal"] == "dispatched")
        expected = {(n, minute(1).isoformat()) for n in SKIP_ROWS[:2]}
        expected |= {("skip-jitter", jittered_slots("skip-jitter")[0].isoformat())}
        expected |= {(n, s.isoformat()) for n in JITTER_ROWS for s in jittered_slots(n)}
        assert dispatched == sorted(expected)
        assert all(len(jittered_slots(n)) >= STEPS - 1 for n in JITTER_ROWS)

        with app.store.read() as conn:
            logged = conn.execute(
                select(decisions.c.task_name, decisions.c.slot, decisions.c.decision)
            ).all()
            job_slots = conn.execute(select(jobs.c.task_name, jobs.c.slot)).all()
        # the log agrees: one entry per slot and outcome, from the process that won it
        counted = Counter((n, s.isoformat(), d) for n, s, d in logged)
        assert max(counted.values()) == 1
        assert {(n, s) for n, s, d in counted if d == "skipped_overlap"} == set(skipped)
        assert {(n, s) for n, s, d in counted if d == "dispatched"} == set(dispatched)
        # each job carries its nominal slot (a whole minute), the jitter only delays it
        assert sorted((n, s.isoformat()) for n, s in job_slots) == dispatched
        for name in JITTER_ROWS:
            found = app.get_row(name)
            assert found is not None and found.next_run_at is not None
            delay = found.next_run_at - found.next_run_at.replace(second=0, microsecond=0)
            assert timedelta(0) <= delay < timedelta(seconds=JITTER)
    finally:
        app.close()
