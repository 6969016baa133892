"""History that drops instead of deleting (PostgreSQL, revision 0015): the purge of one day of
run history with the history in one table (``DELETE``, revision 0014's schema) and in day
partitions (``DROP``), and the hot tables' size after a simulated week of steady load.

    .venv/bin/python benchmarks/partitions.py [--rows 10000000] [--days 10] [--week-jobs 100000]

Part 1. Two databases, ``bench_part_delete`` (migrated to 0014: one ``scheduler_runs`` table)
and ``bench_part_drop`` (head: day partitions), each loaded with ``--rows`` runs spread evenly
over ``--days`` days (``INSERT ... SELECT generate_series``), each day's runs belonging to that
day's succeeded jobs (one job per run, so the purge selects them as in production; a job every
1,000 of the first three days is a task's last job, kept with its run). Then, on a clock that
puts one more day past the 7 days' retention each time, after a ``CHECKPOINT``:

- day 1, quiet: ``app.purge()`` (what a worker's housekeeping runs: the day's jobs and their
  history): time, WAL bytes (``pg_current_wal_lsn()`` before and after), dead tuples
  (``pg_stat_user_tables.n_dead_tup``; autovacuum was off on the server this ran on, the
  table says);
- day 2, quiet: the history's share alone: the day's jobs deleted first (not measured), then
  what the purge sends for their runs, the ``DELETE`` by job id in chunks of 500 (one table)
  or ``partitions.maintain`` (the ``DROP``, kept runs moved): time, WAL, dead tuples;
- day 3, ``app.purge()`` while a thread claims and completes no-op jobs one at a time on a
  runner of its own, each claim-to-completion timed: p50, p99 and the slowest, before and
  during the purge.

Then revision 0015 is applied to the ``DELETE`` database's remaining history: its time.

Part 2. The hot tables' size after a simulated week: ``--week-jobs`` jobs a day (each with a
run and a decision), written an hour at a time by ``INSERT ... SELECT``, and ``app.purge()``
every simulated hour, with the retention scaled down to 2 days (``purge_succeeded_after_days``
and ``purge_aborted_after_days``; the decision log's is then 2 too), so a week is 3.5
retentions. Four databases: one table each, with no vacuum and with a ``VACUUM`` of the three
tables after each simulated day (what autovacuum would do at best); day partitions, with no
vacuum and with the same ``VACUUM`` (the jobs table is not partitioned: its dead tuples are
the same either way). ``pg_total_relation_size`` of jobs, runs (partitions included) and
decisions at the end, and the runs kept (``count(*)``).

Its own databases, dropped after (``--keep`` keeps them); ``--pg URL`` names the server's
maintenance database.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

from _bench import DEFAULT_PG, checkpoint_pg, drop_pg_database, recreate_pg_database
from sqlalchemy import delete, text

from scheduler import Scheduler
from scheduler._config import WorkerSettings
from scheduler._model.handlers import Registry
from scheduler._store import partitions as _partitions
from scheduler._store.migrate import upgrade
from scheduler._store.tables import runs


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def naive(at: datetime) -> str:
    return at.replace(tzinfo=None).isoformat(sep=" ")


def make_app(url: str, clock: Clock, partitioned: bool, **worker: Any) -> Scheduler:
    settings = WorkerSettings(**worker) if worker else None
    app = Scheduler(url, registry=Registry(), clock=clock, worker=settings)
    if partitioned:
        app.migrate()
    else:
        upgrade(app.store, "0014")
    return app


def exec_sql(app: Scheduler, sql: str, **params: Any) -> None:
    with app.store.begin() as conn:
        conn.execute(text(sql), params)


def create_days(app: Scheduler, first: date, count: int) -> None:
    with app.store.begin() as conn:
        if not _partitions.partitioned(conn):
            return
        for name in _partitions.PARTITIONED:
            for n in range(count):
                conn.execute(text(_partitions.create_sql(name, first + timedelta(days=n))))


_JOBS = (
    "INSERT INTO scheduler_jobs (id, handler, payload, queue, priority, run_at, state, attempts,"
    " max_attempts, task_name, created_at, finished_at, fence)"
    " SELECT g, 'bench', '{}', 'default', 0, t, 'succeeded', 1, 3, 'task-' || (g % 1000), t, t, 1"
    " FROM (SELECT g, CAST(:start AS timestamp) + (g - :first) * CAST(:step AS interval) AS t"
    " FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) g) s"
)
_RUNS = (
    "INSERT INTO scheduler_runs (job_id, attempt, started_at, finished_at, outcome, worker)"
    " SELECT g, 1, t - interval '20 ms', t, 'succeeded', 'bench-worker'"
    " FROM (SELECT g, CAST(:start AS timestamp) + (g - :first) * CAST(:step AS interval) AS t"
    " FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) g) s"
)
_DECISIONS = (
    "INSERT INTO scheduler_decisions (task_name, slot, decided_at, decision, job_id)"
    " SELECT 'task-' || (g % 1000), t, t, 'dispatched', g"
    " FROM (SELECT g, CAST(:start AS timestamp) + (g - :first) * CAST(:step AS interval) AS t"
    " FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) g) s"
)


def load(app: Scheduler, first_id: int, count: int, start: datetime, span: timedelta) -> None:
    """`count` succeeded jobs with ids from `first_id`, each with one run, spread over `span`
    from `start`."""
    params = {
        "first": first_id,
        "last": first_id + count - 1,
        "start": naive(start),
        "step": f"{span.total_seconds() / count} seconds",
    }
    exec_sql(app, _JOBS, **params)
    exec_sql(app, _RUNS, **params)
    exec_sql(app, _SETVAL)


_SETVAL = (
    "SELECT setval(pg_get_serial_sequence('scheduler_jobs', 'id'),"
    " (SELECT max(id) FROM scheduler_jobs))"
)


def history_sizes(app: Scheduler) -> dict[str, Any]:
    with app.store.begin() as conn:
        found = conn.execute(
            text(
                "SELECT CASE WHEN relname LIKE 'scheduler_runs%' THEN 'runs'"
                " WHEN relname LIKE 'scheduler_decisions%' THEN 'decisions'"
                " ELSE 'jobs' END, sum(n_dead_tup), sum(n_live_tup),"
                " sum(pg_total_relation_size(relid))"
                " FROM pg_stat_user_tables"
                " WHERE relname LIKE 'scheduler_runs%' OR relname LIKE 'scheduler_decisions%'"
                " OR relname = 'scheduler_jobs' GROUP BY 1"
            )
        )
        return {name: (int(dead), int(live), int(size)) for name, dead, live, size in found}


def wal_lsn(app: Scheduler) -> str:
    with app.store.begin() as conn:
        return str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())


def wal_bytes(app: Scheduler, since: str) -> int:
    with app.store.begin() as conn:
        found = conn.execute(text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), :s)"), {"s": since})
        return int(found.scalar_one())


@contextlib.contextmanager
def timed_maintenance() -> Iterator[list[float]]:
    """The seconds :func:`partitions.maintain` takes inside ``app.purge()`` (the rest is the
    ``DELETE`` purge of the jobs, and of the history on one table)."""
    spent: list[float] = []
    original = _partitions.maintain

    def maintain(*args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.monotonic() - began)

    _partitions.maintain = maintain  # type: ignore[assignment]
    try:
        yield spent
    finally:
        _partitions.maintain = original  # type: ignore[assignment]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Claimer(threading.Thread):
    """Claims and completes no-op jobs one at a time, each timed, until stopped."""

    def __init__(self, url: str, clock: Clock) -> None:
        super().__init__(daemon=True)
        self.app = Scheduler(url, registry=Registry(), clock=clock)
        self.app.handler("noop")(lambda job: None)
        self.runner = self.app.runner()
        self.times: list[tuple[float, float]] = []  # (when it started, seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            if self.runner.work(1) == 0:
                break
            self.times.append((began, time.monotonic() - began))

    def between(self, start: float, end: float) -> list[float]:
        return [s for at, s in self.times if start <= at + s and at <= end]


def history_share(app: Scheduler, url: str, clock: Clock, partitioned: bool) -> tuple[float, int]:
    """One more day past retention: its jobs deleted first and a ``CHECKPOINT`` (neither
    measured), then what the purge sends for their runs, measured (seconds, WAL bytes): the
    DELETE by job id in chunks of 500 (one table), or the partitions' maintenance (the DROP,
    the kept runs moved)."""
    clock.now += timedelta(days=1)
    before = clock.now - timedelta(days=7)
    with app.store.begin() as conn:
        gone = list(
            conn.execute(
                text(
                    "DELETE FROM scheduler_jobs WHERE state = 'succeeded'"
                    " AND finished_at < :b AND id NOT IN"
                    " (SELECT last_job_id FROM scheduler_rows) RETURNING id"
                ),
                {"b": naive(before)},
            ).scalars()
        )
    checkpoint_pg(url)
    lsn = wal_lsn(app)
    began = time.monotonic()
    if partitioned:
        done = _partitions.maintain(
            app.store,
            now=clock.now,
            decisions_before=before - timedelta(days=30),
            runs_before=before,
        )
        log(f"dropped {done.dropped}, moved {done.moved}, skipped {done.skipped}")
    else:
        with app.store.begin() as conn:
            for start in range(0, len(gone), 500):
                conn.execute(delete(runs).where(runs.c.job_id.in_(gone[start : start + 500])))
    return time.monotonic() - began, wal_bytes(app, lsn)


def purge_one_day(url: str, partitioned: bool, rows: int, days: int) -> dict[str, Any]:
    name = "drop" if partitioned else "delete"
    first_day = datetime.now(UTC).date() - timedelta(days=days + 8)
    clock = Clock(midnight(first_day))
    app = make_app(url, clock, partitioned)
    try:
        create_days(app, first_day, days)
        per_day = rows // days
        began = time.monotonic()
        for day in range(days):
            log(f"{name}: loading day {day + 1}/{days} ({per_day:,} jobs and runs)")
            load(
                app,
                1 + day * per_day,
                per_day,
                midnight(first_day + timedelta(days=day)),
                timedelta(days=1),
            )
        # Every 1,000th job of the four days purged is a task's last job: kept, with its run.
        exec_sql(
            app,
            "INSERT INTO scheduler_rows (name, handler, payload, cron, timezone, concurrent,"
            " enabled, last_job_id, consecutive_failures, version, created_at, updated_at)"
            " SELECT 'kept-' || g, 'bench', '{}', '0 0 1 1 *', 'UTC', false, false, g, 0, 1,"
            " now(), now() FROM generate_series(1, :last, 1000) g",
            last=4 * per_day,
        )
        load_seconds = time.monotonic() - began
        with app.store.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        with app.store.begin() as conn:
            autovacuum = conn.execute(text("SHOW autovacuum")).scalar_one()
        out: dict[str, Any] = {"load s": load_seconds, "server autovacuum": autovacuum}

        # Day 1, quiet: the whole purge (the day's jobs and their history).
        clock.now = midnight(first_day + timedelta(days=8)) + timedelta(minutes=1)
        checkpoint_pg(url)
        dead_before = history_sizes(app)
        lsn = wal_lsn(app)
        began = time.monotonic()
        with timed_maintenance() as maintenance:
            purged = app.purge()
        out["purge s"] = time.monotonic() - began
        out["of which partitions s"] = sum(maintenance)
        out["purge WAL MB"] = wal_bytes(app, lsn) / 2**20
        out["purged jobs"] = purged
        time.sleep(1.5)  # the statistics are flushed at most once a second
        after = history_sizes(app)
        out["runs dead tuples"] = after["runs"][0] - dead_before["runs"][0]
        out["jobs dead tuples"] = after["jobs"][0] - dead_before["jobs"][0]
        log(f"{name}: quiet purge {out['purge s']:.2f} s, {purged:,} jobs")

        # Day 2, quiet: the history's share alone.
        dead_before = history_sizes(app)
        seconds, wal = history_share(app, url, clock, partitioned)
        out["history s"] = seconds
        out["history WAL MB"] = wal / 2**20
        time.sleep(1.5)
        out["history dead tuples"] = history_sizes(app)["runs"][0] - dead_before["runs"][0]
        with app.store.begin() as conn:
            out["runs left"] = int(
                conn.execute(text("SELECT count(*) FROM scheduler_runs")).scalar_one()
            )
        log(f"{name}: the history's share {out['history s']:.2f} s")

        # Days 3 and 4, under claims: the history's share alone, then the whole purge.
        claim_clock = Clock(clock.now)
        exec_sql(
            app,
            "INSERT INTO scheduler_jobs (handler, payload, queue, priority, run_at, state,"
            " attempts, max_attempts, created_at, fence) SELECT 'noop', '{}', 'default', 0,"
            " CAST(:t AS timestamp), 'queued', 0, 3, CAST(:t AS timestamp), 0"
            " FROM generate_series(1, 200000)",
            t=naive(clock.now),
        )
        exec_sql(app, "ANALYZE scheduler_jobs")
        checkpoint_pg(url)
        claimer = Claimer(url, claim_clock)
        claimer.start()
        time.sleep(5)
        spans = []
        for step in ("history", "purge"):
            start = time.monotonic()
            if step == "history":  # the timed part alone, not the jobs' deletion before it
                seconds, _wal = history_share(app, url, clock, partitioned)
                start = time.monotonic() - seconds
            else:
                clock.now += timedelta(days=1)
                app.purge()
            spans.append((step, start, time.monotonic()))
            time.sleep(3)
        claimer.stop.set()
        claimer.join()
        claimer.app.close()
        quiet = [s for at, s in claimer.times if at + s < spans[0][1]]
        out["claims before"] = len(quiet)
        out["claim p50 before ms"] = pct(quiet, 0.5) * 1000
        out["claim p99 before ms"] = pct(quiet, 0.99) * 1000
        for step, start, end in spans:
            during = claimer.between(start, end)
            out[f"{step} under claims s"] = end - start
            out[f"claims during {step}"] = len(during)
            out[f"claim p50 during {step} ms"] = pct(during, 0.5) * 1000
            out[f"claim p99 during {step} ms"] = pct(during, 0.99) * 1000
            out[f"claim max during {step} ms"] = max(during, default=float("nan")) * 1000
            log(f"{name}: {step} under claims {end - start:.2f} s, {len(during)} claims during")
        if not partitioned:  # revision 0015 on this history: every remaining row copied
            with app.store.begin() as conn:
                out["rows migrated"] = int(
                    conn.execute(text("SELECT count(*) FROM scheduler_runs")).scalar_one()
                )
            began = time.monotonic()
            app.migrate()
            out["migrate s"] = time.monotonic() - began
            log(f"{name}: migrated {out['rows migrated']:,} runs in {out['migrate s']:.1f} s")
        else:
            out["rows migrated"] = 0
            out["migrate s"] = 0.0
        return out
    finally:
        app.close()


def week(url: str, mode: str, per_day: int) -> dict[str, Any]:
    partitioned = mode.startswith("drop")
    first_day = datetime.now(UTC).date() - timedelta(days=8)
    clock = Clock(midnight(first_day))
    app = make_app(
        url, clock, partitioned, purge_succeeded_after_days=2, purge_aborted_after_days=2
    )
    try:
        create_days(app, first_day, 9)
        hourly = per_day // 24
        next_id = 1
        for day in range(7):
            for hour in range(24):
                start = midnight(first_day + timedelta(days=day)) + timedelta(hours=hour)
                params = {
                    "first": next_id,
                    "last": next_id + hourly - 1,
                    "start": naive(start),
                    "step": f"{3600 / hourly} seconds",
                }
                exec_sql(app, _JOBS, **params)
                exec_sql(app, _RUNS, **params)
                exec_sql(app, _DECISIONS, **params)
                exec_sql(app, _SETVAL)
                next_id += hourly
                clock.now = start + timedelta(hours=1)
                app.purge()
            if mode.endswith("+vacuum"):
                with app.store.engine.connect() as conn:
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                    conn.execute(text("VACUUM scheduler_jobs, scheduler_runs, scheduler_decisions"))
            log(f"week {mode}: day {day + 1} done")
        time.sleep(1.5)
        sizes = history_sizes(app)
        with app.store.begin() as conn:
            live = int(conn.execute(text("SELECT count(*) FROM scheduler_runs")).scalar_one())
        return {
            "jobs MB": sizes["jobs"][2] / 2**20,
            "runs MB": sizes["runs"][2] / 2**20,
            "decisions MB": sizes["decisions"][2] / 2**20,
            "runs kept": live,
            "runs dead": sizes["runs"][0],
            "decisions dead": sizes["decisions"][0],
        }
    finally:
        app.close()


def table(title: str, results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    keys = list(next(iter(results.values())))
    print(f"\n### {title}\n")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for key in keys:
        cells = []
        for name in names:
            value = results[name][key]
            if isinstance(value, float):
                cells.append(f"{value:,.2f}")
            elif isinstance(value, int):
                cells.append(f"{value:,}")
            else:
                cells.append(str(value))
        print(f"| {key} | " + " | ".join(cells) + " |")


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("scheduler._app").setLevel(logging.DEBUG)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pg", default=DEFAULT_PG)
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--days", type=int, default=10)
    p.add_argument("--week-jobs", type=int, default=100_000)
    p.add_argument("--skip-week", action="store_true")
    p.add_argument("--skip-purge", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the databases")
    args = p.parse_args()
    made: list[str] = []
    try:
        if not args.skip_purge:
            results = {}
            for mode in ("delete", "drop"):
                db = f"bench_part_{mode}"
                url = recreate_pg_database(args.pg, db)
                made.append(db)
                results[mode] = purge_one_day(url, mode == "drop", args.rows, args.days)
                if not args.keep:
                    drop_pg_database(args.pg, db)
            table(f"The purge of one day of {args.rows:,} runs over {args.days} days", results)
        if not args.skip_week:
            results = {}
            for mode in ("delete", "delete+vacuum", "drop", "drop+vacuum"):
                db = "bench_part_week_" + mode.replace("+", "_")
                url = recreate_pg_database(args.pg, db)
                made.append(db)
                results[mode] = week(url, mode, args.week_jobs)
            table(f"A week of {args.week_jobs:,} jobs a day, 2 days' retention", results)
    finally:
        if not args.keep:
            for db in made:
                drop_pg_database(args.pg, db)


if __name__ == "__main__":
    main()
