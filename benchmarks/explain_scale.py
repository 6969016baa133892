"""``explain`` at scale: 10,000 tasks, 1,000,000 jobs (with a run each) and 1,000,000 decision
entries, on SQLite and PostgreSQL.

    .venv/bin/python benchmarks/explain_scale.py [--tasks 10000] [--jobs 1000000] [--calls 200]

The data set is made with bulk ``INSERT ... SELECT`` statements on the server (a recursive CTE
on SQLite, ``generate_series`` on PostgreSQL), not through the API: each task gets
jobs/tasks jobs, each job one run, and each task as many decisions. Then ``app.explain(name)``
runs for ``--calls`` random task names; the table shows the median and 95th percentile wall
time, the client CPU per call and the SQL statements per call. SQLite lives in a temporary
folder; PostgreSQL in its own database ``bench_explain`` (plus ``SCHEDULER_BENCH_SUFFIX``;
``--pg URL`` names the server's maintenance database), created and dropped by the script.
With ``--purge S``, the decision log's purge of its entries older than the first S seconds of
the data set (an entry a second) follows: its time and statements (revision 0006: the range
is found by bisection on the primary key, there is no index on the entries' time).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, event, text

from scheduler import Scheduler

T0 = "2030-01-01 00:00:00"


def _fill(app: Scheduler, tasks: int, jobs: int) -> None:
    per = max(jobs // tasks, 1)
    pg = app.store.engine.dialect.name == "postgresql"
    series = (
        "generate_series(1, {n}) AS s(x)"
        if pg
        else "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n})"
        " SELECT x FROM c) AS s"
    )
    name = "'task-' || s.x"
    modulo = "%%" if pg else "%"  # psycopg reads a lone % as a placeholder
    task_of = f"'task-' || ((s.x - 1) {modulo} {tasks} + 1)"
    false, true = ("false", "true") if pg else ("0", "1")
    ts = f"TIMESTAMP '{T0}'" if pg else f"'{T0}'"
    later = (
        f"{ts} + (s.x || ' seconds')::interval"
        if pg
        else f"datetime({ts}, '+' || s.x || ' seconds')"
    )
    statements = [
        f"INSERT INTO scheduler_rows (name, handler, payload, cron, timezone, concurrent, enabled,"
        f" next_run_at, last_job_id, consecutive_failures, version, created_at, updated_at,"
        f" overlap, catchup_window, jitter)"
        f" SELECT {name}, 'bench.noop', '{{}}', '*/5 * * * *', 'Europe/Berlin', {false},"
        f" {true}, {ts}, NULL, 0, 1, {ts}, {ts}, 'hold', 0, 0"
        f" FROM {series.format(n=tasks)}",
        f"INSERT INTO scheduler_jobs (handler, payload, queue, priority, run_at, state, attempts,"
        f" max_attempts, task_name, created_at, finished_at, slot)"
        f" SELECT 'bench.noop', '{{}}', 'default', 0, {later}, 'succeeded', 1, 3, {task_of},"
        f" {later}, {later}, {later} FROM {series.format(n=per * tasks)}",
        f"INSERT INTO scheduler_runs (job_id, attempt, started_at, finished_at, outcome, worker,"
        f" slot) SELECT s.x, 1, {later}, {later}, 'succeeded', 'bench:1', {later}"
        f" FROM {series.format(n=per * tasks)}",
        f"INSERT INTO scheduler_decisions (task_name, slot, decided_at, decision, job_id)"
        f" SELECT {task_of}, {later}, {later}, 'dispatched', s.x"
        f" FROM {series.format(n=per * tasks)}",
        # each row points at its newest job
        "UPDATE scheduler_rows SET last_job_id = (SELECT max(id) FROM scheduler_jobs"
        " WHERE scheduler_jobs.task_name = scheduler_rows.name)",
    ]
    with app.store.begin() as conn:
        for sql in statements:
            conn.exec_driver_sql(sql)
    with app.store.engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE")
        conn.commit()


def _measure(app: Scheduler, tasks: int, calls: int) -> tuple[float, float, float, float]:
    names = [f"task-{random.randint(1, tasks)}" for _ in range(calls)]
    app.explain(names[0])  # the schema check and the statement caches, once
    counted: list[str] = []
    event.listen(app.store.engine, "before_cursor_execute", lambda *a: counted.append(a[2]))
    walls, cpus = [], []
    for name in names:
        cpu, wall = time.process_time(), time.perf_counter()
        data = app.explain(name)
        walls.append((time.perf_counter() - wall) * 1e3)
        cpus.append((time.process_time() - cpu) * 1e3)
        assert len(data["runs"]) == 10 and len(data["decisions"]) == 20, name
    walls.sort()
    return (
        statistics.median(walls),
        walls[int(len(walls) * 0.95) - 1],
        statistics.median(cpus),
        len(counted) / calls,
    )


def _purge(app: Scheduler, seconds: int) -> tuple[float, int, int]:
    """The decision log's purge of the entries older than T0 + `seconds` (one per second of
    the data set): (milliseconds, statements, entries deleted), in one transaction."""
    from scheduler._store import decisions

    counted: list[str] = []

    def count(*args: object) -> None:
        counted.append(str(args[2]))

    cut = datetime.fromisoformat(T0).replace(tzinfo=UTC) + timedelta(seconds=seconds)
    event.listen(app.store.engine, "before_cursor_execute", count)
    try:
        began = time.perf_counter()
        with app.store.begin() as conn:
            deleted = decisions.purge(conn, before=cut)
        elapsed = (time.perf_counter() - began) * 1e3
    finally:
        event.remove(app.store.engine, "before_cursor_execute", count)
    return elapsed, len(counted), deleted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument(
        "--purge",
        type=int,
        default=0,
        metavar="S",
        help="then purge the decisions older than the first S seconds of the data set (one"
        " entry a second), and print its time and statements",
    )
    args = parser.parse_args()
    random.seed(13)
    results = []
    purges = []
    database = "bench_explain" + os.environ.get("SCHEDULER_BENCH_SUFFIX", "")
    with tempfile.TemporaryDirectory() as folder:
        targets = []
        if not args.no_sqlite:
            targets.append(("SQLite", f"sqlite:///{Path(folder) / 'explain.db'}", None))
        if not args.no_pg:
            admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {database}"))
                conn.execute(text(f"CREATE DATABASE {database}"))
            url = args.pg.rsplit("/", 1)[0] + f"/{database}"
            targets.append(("PostgreSQL", url, admin))
        for label, url, admin in targets:
            app = Scheduler(url, clock=lambda: datetime(2030, 1, 2, tzinfo=UTC))
            try:
                app.migrate()
                began = time.perf_counter()
                _fill(app, args.tasks, args.jobs)
                print(f"{label}: loaded in {time.perf_counter() - began:.0f} s", file=sys.stderr)
                results.append((label, *_measure(app, args.tasks, args.calls)))
                if args.purge:
                    purges.append((label, *_purge(app, args.purge)))
            finally:
                app.close()
                if admin is not None:
                    with admin.connect() as conn:
                        conn.execute(text(f"DROP DATABASE IF EXISTS {database}"))
                    admin.dispose()
    print(
        f"explain at {args.tasks:,} tasks / {args.jobs:,} jobs (a run and a decision each),"
        f" {args.calls} calls\n"
    )
    print("| engine | median | p95 | client CPU | statements per call |")
    print("|---|---|---|---|---|")
    for label, median, p95, cpu, statements in results:
        print(f"| {label} | {median:.1f} ms | {p95:.1f} ms | {cpu:.1f} ms | {statements:g} |")
    if purges:
        print(f"\nthe decision log's purge of its first {args.purge:,} entries\n")
        print("| engine | time | statements | deleted |")
        print("|---|---|---|---|")
        for label, ms, statements, deleted in purges:
            print(f"| {label} | {ms:.0f} ms | {statements} | {deleted:,} |")


if __name__ == "__main__":
    main()
