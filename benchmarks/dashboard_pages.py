"""Server time of each dashboard page, and SQL statements per live refresh, at scale.

    .venv/bin/python benchmarks/dashboard_pages.py [--tasks 10000] [--jobs 1000000] [--reps 40]
        [--only "Workers & health"]

Builds 10,000 tasks and 1,000,000 jobs (each job with one run in the history: 97 % succeeded,
2 % aborted, 1 % queued; every task points at its newest job) with set-based SQL, on a SQLite
file and in a PostgreSQL database of its own (``bench_dash_issue14``). Then each page is
requested ``--reps`` times straight through the ASGI interface in this process (as uvicorn
calls it, without a client's or the network's time), as its live refresh asks for it; the
table shows p50 and p95 of the request's time and the statements it sent.

Workers & health takes the counts of the finished states (succeeded, aborted) in the background,
at most once per ``FinishedCounts.interval()``, and no request waits on them: its last line,
"(background) finished counts", is that one statement timed on its own.

The task-filtered reads (run strips, a task's runs, the Jobs page by task) use the index
``ix_scheduler_jobs_task (task_name, id)`` that revision 0005 ships.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import _bench
from sqlalchemy import event, text

from scheduler import Scheduler
from scheduler._config import DashboardSettings
from scheduler._model.handlers import Registry
from scheduler._store.status import health as _health
from scheduler.dashboard import create_app

T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
PG_DATABASE = "bench_dash_issue14"


def populate(app: Scheduler, tasks: int, jobs: int) -> None:
    dialect = app.store.engine.dialect.name
    if dialect == "sqlite":
        seq = "WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < {n}) "
        ts = "datetime('2030-01-01', '+' || ({x}) || ' seconds')"
        name = "'task-' || substr('00000' || ({x}), -5, 5)"
        src = "FROM seq"
    else:
        seq = ""
        ts = "(TIMESTAMP '2030-01-01' + ({x}) * INTERVAL '1 second')"
        name = "'task-' || lpad(({x})::text, 5, '0')"
        src = "FROM generate_series(1, {n}) AS seq(n)"
    state = (
        "CASE WHEN n % 100 = 0 THEN 'queued' WHEN n % 50 = 1 THEN 'aborted' ELSE 'succeeded' END"
    )
    with app.store.begin() as conn:
        conn.execute(
            text(
                seq.format(n=tasks)
                + "INSERT INTO scheduler_rows (name, handler, payload, cron, timezone, concurrent,"
                " enabled, next_run_at, last_job_id, consecutive_failures, version, created_at,"
                " updated_at, disabled_reason) SELECT "
                + name.format(x="n")
                + ", 'h' || (n % 20), '{}', '*/5 * * * *',"
                " CASE WHEN n % 3 = 0 THEN 'Europe/Berlin' ELSE 'UTC' END, false, n % 10 <> 0, "
                + ts.format(x=f"{jobs} + n")
                + f", {jobs - tasks} + n, CASE WHEN n % 7 = 0 THEN 2 ELSE 0 END, 1, "
                + ts.format(x="0")
                + ", "
                + ts.format(x="0")
                + ", CASE WHEN n % 10 = 0 THEN 'manual' END "
                + src.format(n=tasks)
            )
        )
        # Job n belongs to task (n - 1) % tasks + 1: each task's newest job is the highest id.
        conn.execute(
            text(
                seq.format(n=jobs)
                + "INSERT INTO scheduler_jobs (id, handler, payload, queue, priority, run_at,"
                " state, attempts, max_attempts, task_name, created_at, finished_at,"
                " last_error_code)"
                " SELECT n, 'h' || (((n - 1) % "
                + str(tasks)
                + " + 1) % 20), '{}', CASE WHEN n % 4 = 0 THEN 'reports' ELSE 'default' END, 0, "
                + ts.format(x="n")
                + f", {state}, 1, 3, "
                + name.format(x=f"(n - 1) % {tasks} + 1")
                + ", "
                + ts.format(x="n")
                + ", CASE WHEN n % 100 = 0 THEN NULL ELSE "
                + ts.format(x="n + 1")
                + " END, CASE WHEN n % 50 = 1 THEN 'upstream_timeout' END "
                + src.format(n=jobs)
            )
        )
        conn.execute(
            text(
                "INSERT INTO scheduler_runs (job_id, attempt, started_at, finished_at, outcome,"
                " error_code, worker) SELECT id, 1, run_at, finished_at, CASE state WHEN"
                " 'aborted' THEN 'aborted' ELSE 'succeeded' END, last_error_code, 'bench:1'"
                " FROM scheduler_jobs WHERE finished_at IS NOT NULL"
            )
        )
    if dialect == "postgresql":
        with app.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(
                text(f"SELECT setval(pg_get_serial_sequence('scheduler_jobs', 'id'), {jobs})")
            )
            c.execute(text("VACUUM ANALYZE"))
    else:
        with app.store.begin() as conn:
            conn.execute(text("ANALYZE"))


def engines(args: Any, sqlite_file: str, pg_database: str) -> list[tuple[str, str]]:
    """(label, URL) of each engine the arguments ask for: a SQLite file in a fresh scratch
    folder, a PostgreSQL database of its own (created empty; the caller drops it)."""
    found = []
    if not args.no_sqlite:
        found.append(("SQLite", f"sqlite:///{_bench.scratch_dir()}/{sqlite_file}"))
    if not args.no_pg:
        found.append(("PostgreSQL", _bench.recreate_pg_database(args.pg, pg_database)))
    return found


def loaded(label: str, url: str, tasks: int, jobs: int) -> Scheduler:
    """A migrated app on ``url`` with :func:`populate`'s data, its clock at ``T0``."""
    app = Scheduler(url, registry=Registry(), clock=lambda: T0)
    app.migrate()
    _bench.progress(f"{label}: loading {tasks:,} tasks, {jobs:,} jobs")
    start = time.perf_counter()
    populate(app, tasks, jobs)
    _bench.progress(f"  loaded in {time.perf_counter() - start:.0f} s")
    return app


def pages(tasks: int, jobs: int) -> dict[str, str]:
    mid = f"task-{tasks // 2:05d}"
    return {
        "Tasks": "/tasks",
        "Tasks, name filter": "/tasks?name=task-0424",
        "Tasks, failing": "/tasks?state=failing",
        "Tasks, deep page": f"/tasks?after=task-{tasks - 30:05d}",
        "Task": f"/tasks/{mid}",
        "Jobs": "/jobs",
        "Jobs, aborted": "/jobs?state=aborted",
        "Jobs, one task": f"/jobs?task={mid}",
        "Jobs, one handler": "/jobs?handler=h7",
        "Jobs, queue, deep": f"/jobs?queue=reports&before={jobs // 2}",
        "Job": f"/jobs/{jobs - 7}",
        "Workers & health": "/health",
    }


async def _get(asgi: Any, path: str) -> tuple[int, float]:
    """One GET straight through the ASGI interface, as uvicorn would call it: (status, ms)."""
    route, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "server": ("127.0.0.1", 8787),
        "client": ("127.0.0.1", 5000),
        "headers": [(b"host", b"127.0.0.1"), (b"x-dashboard-live", b"1")],
    }
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    start = time.perf_counter()
    await asgi(scope, receive, send)
    return status, (time.perf_counter() - start) * 1000


def measure(
    app: Scheduler, reps: int, tasks: int, jobs: int, only: list[str] | None = None
) -> list[tuple[str, float, float, int]]:
    asgi = create_app(app, DashboardSettings())
    gc.collect()
    gc.freeze()  # as `scheduler dashboard` does before it serves (scheduler/cli.py)
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(app.store.engine, "before_cursor_execute", count)
    rows = []
    loop = asyncio.new_event_loop()
    for label, path in pages(tasks, jobs).items():
        if only and label not in only:
            continue
        for _ in range(3):  # warm caches and the connection pool
            assert loop.run_until_complete(_get(asgi, path))[0] == 200
        # Workers & health's first view started the background count of the finished states:
        # let it end, so that it does not share the CPU with the requests measured (it is
        # measured on its own below).
        asgi.state.dashboard.finished.wait()
        times = []
        for _ in range(reps):
            statements.clear()
            asgi.state.dashboard._status = None  # health's shared cache: measure its cost
            status, ms = loop.run_until_complete(_get(asgi, path))
            assert status == 200, (path, status)
            times.append(ms)
        p95 = statistics.quantiles(times, n=20)[-1]
        rows.append((label, statistics.median(times), p95, len(statements)))
        print(f"  {label}: p95 {p95:.1f} ms", file=sys.stderr)
    loop.close()
    # The finished states' counts, which Workers & health takes in the background at most once
    # per FinishedCounts.interval() (no page request waits on them): one statement each.
    times = []
    for _ in range(reps):
        statements.clear()
        start = time.perf_counter()
        with app.store.read() as conn:
            _health.finished_counts(conn)
        times.append((time.perf_counter() - start) * 1000)
    label = "(background) finished counts"
    p95 = statistics.quantiles(times, n=20)[-1]
    rows.append((label, statistics.median(times), p95, len(statements)))
    print(f"  {label}: p95 {p95:.1f} ms", file=sys.stderr)
    event.remove(app.store.engine, "before_cursor_execute", count)
    return rows


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=40)
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument(
        "--only", action="append", metavar="PAGE", help='only this page (repeatable): "Job"'
    )
    args = p.parse_args()
    results: dict[str, list[tuple[str, float, float, int]]] = {}
    for label, url in engines(args, "dashboard.db", PG_DATABASE):
        app = loaded(label, url, args.tasks, args.jobs)
        results[label] = measure(app, args.reps, args.tasks, args.jobs, args.only)
        app.close()
        if label == "PostgreSQL":
            _bench.drop_pg_database(args.pg, PG_DATABASE)
    names = list(results)
    print(
        f"\n{args.tasks:,} tasks, {args.jobs:,} jobs;"
        f" {args.reps} live refreshes per page; time in ms, statements per refresh\n"
    )
    header = "| page | " + " | ".join(f"{n} p50 | {n} p95 | {n} SQL" for n in names) + " |"
    print(header)
    print("|" + "---|" * (1 + 3 * len(names)))
    for i, (label, *_rest) in enumerate(next(iter(results.values()))):
        cells = []
        for n in names:
            _l, p50, p95, sql = results[n][i]
            cells.append(f"{p50:.1f} | {p95:.1f} | {sql}")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
