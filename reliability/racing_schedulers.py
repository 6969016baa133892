"""Racing schedulers: many worker processes tick one PostgreSQL database at once.

``--processes`` (8) real ``scheduler worker`` processes, each ticking every 0.25 s and running
jobs on 8 threads, share ``--rows`` (200) tasks on second-level crons (``* * * * * *`` and
``* * * * * */2``) for ``--seconds`` (60): fast handlers, slow ones (0.5-2 s), ones that
always fail (disabled after 2 or 3 failures) and flaky ones (disabled after 4 failures in a
row). Every process records the signals it sent; the figures are computed from those records
and the database afterwards. See README.md for the exact definitions.

    python reliability/racing_schedulers.py [--seconds 60] [--processes 8] [--url URL]
"""

from __future__ import annotations

import collections
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from scheduler._model.cron import next_after

TIMEZONES = ("UTC", "Europe/Berlin", "Asia/Kolkata", "America/New_York")


def make_tasks(count: int) -> list[dict[str, Any]]:
    """The row mix: 65% fast, 15% slow, 10% always failing, 10% flaky."""
    tasks = []
    for i in range(count):
        share = i % 20
        task: dict[str, Any] = {
            "name": f"race-{i:03d}",
            "cron": "* * * * * *" if i % 2 == 0 else "* * * * * */2",
            "timezone": TIMEZONES[i % len(TIMEZONES)],
        }
        if share < 13:
            task["handler"] = "rel.fast"
        elif share < 16:
            task["handler"] = "rel.slow"
            task["payload"] = {"min": 0.5, "max": 2.0}
        elif share < 18:
            task["handler"] = "rel.fail"
            task["max_consecutive_failures"] = 2 + i % 2
        else:
            task["handler"] = "rel.flaky"
            task["payload"] = {"p": 0.4}
            task["max_consecutive_failures"] = 4
        tasks.append(task)
    return tasks


@dataclass
class Ev:
    t: float
    kind: str  # dispatch, rerun, disabled
    job: int | None
    slot: float | None = None
    failures: int | None = None
    now: float | None = None  # the tick's own clock, where the database has it


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def run(
    url: str,
    *,
    processes: int = 8,
    seconds: float = 60.0,
    rows: int = 200,
    concurrency: int = 8,
    tick_interval: float = 0.25,
    budget: float = 5.0,
    prepare: bool = True,
    out: Path | None = None,
    verbose: bool = True,
) -> tuple[list[c.Figure], list[str]]:
    """Run the race; return the figures and notes."""
    c.check_loopback(url)
    if prepare:
        c.prepare_database(url)
    out = out or c.workdir("racing")
    tasks = make_tasks(rows)
    config = c.write_config(
        out / "race.toml",
        url,
        scheduler={
            "max_consecutive_failures": 3,
            "tick_interval": tick_interval,
            "backoff_base_seconds": 0.5,
            "backoff_max_seconds": 2.0,
        },
        worker={"concurrency": concurrency, "lease_seconds": 30, "shutdown_grace_seconds": 5},
        tasks=tasks,
    )
    t_before = time.time()
    synced = c.cli(config, "sync", url=url, out=out)
    if synced.returncode != 0:
        raise SystemExit(f"scheduler sync failed: {synced.stderr.strip()}")
    t_sync = time.time()
    if verbose:
        print(f"{rows} rows synced; {processes} worker processes for {seconds:g}s", flush=True)
    workers = [c.Worker(config, url, out, f"w{i}") for i in range(processes)]
    try:
        c.wait_for(lambda: len(ready_times(out)) >= processes, timeout=60)
        time.sleep(seconds)
        t_end = time.time()
    finally:
        codes = c.stop_all(workers, grace=30)
    return analyse(url, out, tasks, workers, codes, (t_before, t_sync, t_end), budget)


def ready_times(out: Path) -> list[float]:
    return [r["t"] for r in c.read_jsonl(out / "events") if r["e"] == "ready"]


def analyse(
    url: str,
    out: Path,
    tasks: list[dict[str, Any]],
    workers: list[c.Worker],
    codes: dict[str, int],
    times: tuple[float, float, float],
    budget: float,
) -> tuple[list[c.Figure], list[str]]:
    """``times``: before and after the sync, and the end of the measured run."""
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry
    from scheduler._store.tables import jobs, rows

    t_before, t_sync, t_end = times
    records = list(c.read_jsonl(out / "events"))
    ready = [r["t"] for r in records if r["e"] == "ready"]
    # Service starts when every process is up (imports done) plus one tick interval.
    t0 = max(ready, default=t_sync) + 1.0

    app = Scheduler(url, registry=Registry())
    try:
        with app.store.read() as conn:
            db_rows = {r.name: r for r in conn.execute(select(rows))}
            db_jobs = {j.id: j for j in conn.execute(select(jobs))}
    finally:
        app.close()
    created = {j.id: j.created_at.timestamp() for j in db_jobs.values()}
    spec = {t["name"]: t for t in tasks}

    per_row: dict[str, list[Ev]] = collections.defaultdict(list)
    terminal: dict[int, list[float]] = collections.defaultdict(list)
    for r in records:
        if r["e"] == "dispatch":
            per_row[r["row"]].append(
                Ev(r["t"], "dispatch", r["job"], slot=r["slot"], now=created.get(r["job"]))
            )
        elif r["e"] == "rerun":
            per_row[r["row"]].append(Ev(r["t"], "rerun", r["job"], failures=r["failures"]))
        elif r["e"] == "disabled":
            per_row[r["row"]].append(Ev(r["t"], "disabled", None, now=r["disabled_at"]))
        elif r["e"] in ("succeeded", "aborted"):
            # The finishing worker's clock, read before its commit: earlier than any tick
            # that could have seen the job finished.
            terminal[r["job"]].append(r["finished_at"])
    for times in terminal.values():
        times.sort()

    # -- doubled ------------------------------------------------------------------------------
    slot_keys = collections.Counter(
        (name, e.slot) for name, evs in per_row.items() for e in evs if e.kind == "dispatch"
    )
    job_keys = collections.Counter(
        e.job for evs in per_row.values() for e in evs if e.kind == "dispatch"
    )
    rerun_keys = collections.Counter(
        (name, e.job, e.failures) for name, evs in per_row.items() for e in evs if e.kind == "rerun"
    )
    doubled = sum(n - 1 for counter in (slot_keys, job_keys, rerun_keys) for n in counter.values())
    jobs_per_row = collections.Counter(j.task_name for j in db_jobs.values())
    unsignalled = sum(
        max(0, jobs_per_row[name] - sum(1 for e in per_row[name] if e.kind == "dispatch"))
        for name in spec
    )

    # -- lost beyond coalescing, latency, order -----------------------------------------------
    latencies: list[float] = []
    lost: list[str] = []
    in_flight_dispatch = 0
    after_disable = 0
    chain_breaks = 0
    early = 0
    slots_due = 0
    for name, task in spec.items():
        evs = sorted(per_row[name], key=lambda e: e.t)
        cron, tz = task["cron"], task["timezone"]
        disabled_t = next((e.t for e in evs if e.kind == "disabled"), t_end)
        # Slots that fell due while the service ran and the row was enabled.
        s = next_after(cron, tz, _dt(t0), name)
        while s.timestamp() <= min(t_end, disabled_t):
            slots_due += 1
            s = next_after(cron, tz, s, name)

        first = {next_after(cron, tz, _dt(t), name).timestamp() for t in (t_before, t_sync)}
        expected_slot = first.pop() if len(first) == 1 else None
        eligible = max(min(first, default=expected_slot or t0), t0)
        instances: collections.Counter[int] = collections.Counter()
        prev: Ev | None = None
        for ev in [*evs, None]:
            if prev is not None:
                if prev.kind == "disabled":
                    after_disable += ev is not None
                    break
                # Each dispatch or rerun of a job is one instance that ends in exactly one
                # succeeded/aborted signal: instance k of a job ends with its k-th terminal.
                assert prev.job is not None
                k = instances[prev.job]
                instances[prev.job] += 1
                ends = terminal.get(prev.job, [])
                done = ends[k] if k < len(ends) else None
                if ev is not None and (done is None or done > ev.t):
                    in_flight_dispatch += 1  # the next event came while the job was running
                basis = prev.now if prev.now is not None else prev.t
                slot_after = next_after(cron, tz, _dt(basis), name).timestamp()
                # Still running at the end: nothing was due after it.
                eligible = float("inf") if done is None else max(done, slot_after, t0)
                expected_slot = slot_after if prev.now is not None else None
            if ev is None:
                if eligible <= t_end - budget:
                    lost.append(
                        f"{name}: due and idle from {_dt(eligible):%H:%M:%S.%f}, never dispatched"
                    )
                break
            if ev.kind == "dispatch" and ev.slot is not None:
                if ev.now is not None and ev.slot > ev.now + 1e-6:
                    early += 1
                if expected_slot is not None and abs(ev.slot - expected_slot) > 1e-3:
                    chain_breaks += 1
            if eligible != float("inf"):
                gap = ev.t - eligible
                latencies.append(max(gap, 0.0))
                if gap > budget:
                    lost.append(
                        f"{name}: due and idle from {_dt(eligible):%H:%M:%S.%f}, "
                        f"next {ev.kind} {gap:.2f}s later"
                    )
            prev = ev

    # Counted over the measured window, as the slots are.
    measured = [e for evs in per_row.values() for e in evs if t0 <= e.t <= t_end]
    dispatches = sum(1 for e in measured if e.kind == "dispatch")
    reruns = sum(1 for e in measured if e.kind == "rerun")
    disabled_events = collections.Counter(
        name for name, evs in per_row.items() for e in evs if e.kind == "disabled"
    )
    disabled_db = {n for n, r in db_rows.items() if r.disabled_reason == "max_consecutive_failures"}
    never_signalled = len(disabled_db - set(disabled_events)) + sum(
        1 for r in db_rows.values() if r.alert_id is not None
    )
    logs = [w.output() for w in workers]
    outcome_counts = collections.Counter(j.state for j in db_jobs.values())

    figures = [
        c.Figure("processes", len(workers)),
        c.Figure("rows", len(spec)),
        c.Figure("seconds measured", round(t_end - t0, 1)),
        c.Figure("slots due", slots_due),
        c.Figure("dispatched (fresh jobs)", dispatches),
        c.Figure("rerun in place", reruns),
        c.Figure("coalesced or held back", slots_due - dispatches - reruns),
        c.Figure("jobs succeeded", outcome_counts["succeeded"]),
        c.Figure("rows disabled", len(disabled_db)),
        c.Figure("pickup latency p50 (s)", c.percentile(latencies, 0.5)),
        c.Figure("pickup latency p99 (s)", c.percentile(latencies, 0.99)),
        c.Figure("pickup latency max (s)", max(latencies, default=0.0)),
        c.Figure("doubled", doubled, True),
        c.Figure("jobs created without a dispatch signal", unsignalled, True),
        c.Figure("lost beyond coalescing", len(lost), True),
        c.Figure("dispatched while the last job ran", in_flight_dispatch, True),
        c.Figure("dispatched before its slot", early, True),
        c.Figure("slot chain breaks", chain_breaks, True),
        c.Figure("dispatched after a disable", after_disable, True),
        c.Figure(
            "disables signalled more than once", sum(n - 1 for n in disabled_events.values()), True
        ),
        c.Figure("disables never signalled", never_signalled, True),
        c.Figure("workers exited non-zero", sum(1 for v in codes.values() if v != 0), True),
        c.Figure("tracebacks in worker logs", c.tracebacks(logs), True),
    ]
    notes = [f"pickup budget {budget:g}s", *lost[:10]]
    return figures, notes


def main() -> int:
    p = c.parser(__doc__, seconds=60.0, url=c.DEFAULT_PG)
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8, help="job threads per process")
    p.add_argument(
        "--budget",
        type=float,
        default=5.0,
        help="seconds an idle due row may wait for its dispatch",
    )
    args = p.parse_args()
    if args.url:
        c.check_loopback(args.url)  # before anything is created
    out = c.workdir("racing")
    result = run(
        args.url,
        processes=args.processes,
        seconds=args.seconds,
        rows=args.rows,
        concurrency=args.concurrency,
        budget=args.budget,
        out=out,
    )
    return c.finish("racing_schedulers", result, out, args.keep)


if __name__ == "__main__":
    sys.exit(main())
