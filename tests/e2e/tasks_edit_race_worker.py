"""One process of the edit race (run by test_tasks_edit_race.py and
reliability/tasks_edit_race.py): a ticker, or an editor of the application's rows.

Usage: ``python tasks_edit_race_worker.py tick|edit URL OUT INDEX START END [SEED]``

Every process waits for the wall-clock instant START (Unix seconds), so they all begin
together, and stops at END. A ``tick`` process ticks in real time (every 50-150 ms). An ``edit``
process owns the rows ``churn-INDEX-k`` and creates them, changes
their payload or their cron (every second / every other second), removes them and creates them
again. Each row it creates is a new incarnation: its payload names it (``inc``), so a job says
which row it came from. Each removal runs in one transaction with a locking read of the name's
jobs (``connection=``), and the editor writes the ids it saw, ``OUT`` as JSON lines: a job of
that incarnation committed later would be one dispatched after the removal committed.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._model.payload import decode_payload
from scheduler._store.tables import decisions, jobs

ROWS_PER_EDITOR = 3
EVERY_SECOND = "* * * * * *"
EVERY_OTHER = "*/2 * * * * *"


def spec(name: str, inc: str, edit: int, cron: str) -> TaskSpec:
    payload = {"inc": inc, "edit": edit}
    return TaskSpec(name, cron, "race.ok", payload, "UTC", overlap="allow")


def make_app(url: str, index: int) -> Scheduler:
    app = Scheduler(url, registry=Registry(), worker_id=f"edit-race-{index}")

    @app.handler("race.ok", queue="unserved")  # nobody works them: the jobs stay as dispatched
    def ok(job: Any) -> None:
        return None

    return app


def tick(app: Scheduler, until: float) -> dict[str, int]:
    totals: dict[str, int] = {}
    while time.time() < until:
        report = app.tick()
        for outcome, names in report.as_dict().items():
            totals[outcome] = totals.get(outcome, 0) + len(names)
        time.sleep(random.uniform(0.05, 0.15))
    return totals


def edit(app: Scheduler, index: int, until: float, out: Any) -> dict[str, int]:
    live: dict[str, tuple[str, int, str]] = {}  # name -> (incarnation, edit, cron)
    made = 0
    counts = {"created": 0, "payload": 0, "cron": 0, "removed": 0}

    def log(**fields: Any) -> None:
        out.write(json.dumps({"editor": index, **fields}) + "\n")
        out.flush()

    while time.time() < until:
        name = f"churn-{index}-{random.randrange(ROWS_PER_EDITOR)}"
        if name not in live:
            made += 1
            inc = f"{index}.{made}"
            change = app.put_task(spec(name, inc, 0, EVERY_SECOND))
            assert change.action == "created", change
            live[name] = (inc, 0, EVERY_SECOND)
            log(op="create", name=name, inc=inc)
            counts["created"] += 1
        else:
            inc, n, cron = live[name]
            roll = random.random()
            if roll < 0.5:
                app.put_task(spec(name, inc, n + 1, cron))
                live[name] = (inc, n + 1, cron)
                counts["payload"] += 1
            elif roll < 0.8:
                other = EVERY_OTHER if cron == EVERY_SECOND else EVERY_SECOND
                app.put_task(spec(name, inc, n + 1, other))
                live[name] = (inc, n + 1, other)
                log(op="cron", name=name, inc=inc)
                counts["cron"] += 1
            else:
                with app.store.begin() as conn:
                    assert app.remove_task(name, connection=conn)
                    # A locking read sees every job committed before it (MariaDB's plain
                    # read would see the transaction's snapshot).
                    seen = conn.execute(
                        select(jobs.c.id).where(jobs.c.task_name == name).with_for_update(read=True)
                    ).scalars()
                    visible = sorted(seen)
                del live[name]
                log(op="remove", name=name, inc=inc, visible=visible)
                counts["removed"] += 1
        time.sleep(random.uniform(0.02, 0.1))
    return counts


def main(
    role: str, url: str, out_path: str, index: int, start: float, end: float, seed: int
) -> None:
    random.seed(seed * 1000 + index)
    app = make_app(url, index)
    app.check_schema()  # connect before the start line
    time.sleep(max(0.0, start - time.time()))
    with open(out_path, "a") as out:
        totals = tick(app, end) if role == "tick" else edit(app, index, end, out)
    app.close()
    print(json.dumps(totals))


# -- the race, run and checked (by the test and by the soak in reliability/) ---------------
STABLE_ROWS = 4


@dataclass
class Findings:
    """What the race did and what the jobs and decisions tables say about it."""

    reports: dict[str, list[dict[str, int]]] = field(default_factory=dict)
    jobs: int = 0
    incarnations: int = 0
    recreated_names: int = 0
    removals: int = 0
    duplicates: list[tuple[str, str, int]] = field(default_factory=list)
    after_removal: list[tuple[str, int]] = field(default_factory=list)
    stable_expected: int = 0
    stable_dispatched: int = 0
    stable_coalesced: int = 0
    stable_wrong: list[str] = field(default_factory=list)


def _start(role: str, url: str, out: Path, index: int, start: float, end: float, seed: int) -> Any:
    command = [sys.executable, __file__, role, url, str(out), str(index), str(start), str(end)]
    return subprocess.Popen(
        [*command, str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def race(
    url: str, directory: Path, seconds: float, tickers: int, editors: int, seed: int = 0
) -> Findings:
    """Start ``tickers`` and ``editors`` processes for ``seconds`` over :data:`STABLE_ROWS`
    rows that never change (every second) and the editors' rows; then check the tables."""
    app = Scheduler(url, registry=Registry())
    try:
        start = time.time() + 4.0  # the processes' imports and connections first
        end = start + seconds
        out = directory / "edits.jsonl"
        procs = [("tick", i, _start("tick", url, out, i, start, end, seed)) for i in range(tickers)]
        procs += [
            ("edit", i, _start("edit", url, out, i, start, end, seed)) for i in range(editors)
        ]
        time.sleep(max(0.0, start - 1.0 - time.time()))
        stable = [f"stable-{i}" for i in range(STABLE_ROWS)]
        first = {}
        for name in stable:
            app.put_task(spec(name, name, 0, EVERY_SECOND))
            row = app.get_row(name)
            assert row is not None and row.next_run_at is not None
            first[name] = row.next_run_at
        found = Findings()
        for role, _index, proc in procs:
            try:
                stdout, stderr = proc.communicate(timeout=seconds + 60)
            finally:
                if proc.poll() is None:
                    proc.kill()
            if proc.returncode != 0:
                raise AssertionError(f"{role} process failed: {stderr}")
            found.reports.setdefault(role, []).append(json.loads(stdout.strip().splitlines()[-1]))
        _check(app, out, first, found)
        return found
    finally:
        app.close()


def _check(app: Scheduler, out: Path, first: dict[str, datetime], found: Findings) -> None:
    edits = [json.loads(line) for line in out.read_text().splitlines()]
    with app.store.read() as conn:
        dispatched = conn.execute(
            select(jobs.c.id, jobs.c.task_name, jobs.c.slot, jobs.c.payload)
        ).all()
        merged = conn.execute(
            select(decisions.c.task_name, decisions.c.detail).where(
                decisions.c.decision == "coalesced"
            )
        ).all()
    found.jobs = len(dispatched)
    by_inc: dict[str, list[tuple[int, datetime]]] = {}
    for job_id, _name, slot, payload in dispatched:
        inc = decode_payload(payload)["inc"] if isinstance(payload, str) else payload["inc"]
        by_inc.setdefault(inc, []).append((job_id, slot))
    created = [e for e in edits if e["op"] == "create"]
    found.incarnations = len(created) + len(first)
    names = [e["name"] for e in created]
    found.recreated_names = len({n for n in names if names.count(n) > 1})
    # each (row, slot) at most once
    for inc, got in by_inc.items():
        counted = Counter(slot for _id, slot in got)
        found.duplicates += [(inc, s.isoformat(), n) for s, n in counted.items() if n > 1]
    # none after the removal committed: every job of a removed incarnation was visible to the
    # removal's own transaction (a job committed later was not)
    for e in edits:
        if e["op"] != "remove":
            continue
        found.removals += 1
        visible = set(e["visible"])
        found.after_removal += [
            (e["inc"], job_id)
            for job_id, _slot in by_inc.get(e["inc"], [])
            if job_id not in visible
        ]
    # every slot of the unchanged rows exactly once: a job each, or merged into one
    # (``coalesced``, when a tick came more than a second late)
    for name, from_slot in first.items():
        row = app.get_row(name)
        assert row is not None and row.next_run_at is not None
        expected = int((row.next_run_at - from_slot).total_seconds())
        slots = sorted(slot for _id, slot in by_inc.get(name, []))
        coalesced = sum(int(d.split()[0]) for n, d in merged if n == name)
        found.stable_expected += expected
        found.stable_dispatched += len(slots)
        found.stable_coalesced += coalesced
        inside = all(from_slot <= s < row.next_run_at and s.microsecond == 0 for s in slots)
        if len(set(slots)) != len(slots) or not inside or len(slots) + coalesced != expected:
            found.stable_wrong.append(name)


if __name__ == "__main__":
    role_arg, url_arg, out_arg, index_arg, start_arg, end_arg = sys.argv[1:7]
    seed_arg = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    main(role_arg, url_arg, out_arg, int(index_arg), float(start_arg), float(end_arg), seed_arg)
