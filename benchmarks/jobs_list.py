"""``scheduler jobs`` at scale: the time of ``app.jobs(...)`` per filter, and its plan.

    .venv/bin/python benchmarks/jobs_list.py [--tasks 10000] [--jobs 1000000] [--reps 200]

Builds 10,000 tasks and 1,000,000 jobs with set-based SQL (``dashboard_pages.populate``: each
task has 100 jobs, 97 % succeeded, 2 % aborted, 1 % queued) on a SQLite file and in a
PostgreSQL database of its own (``bench_jobs_list_13b``, dropped at the end), then calls
``app.jobs(...)`` ``--reps`` times per case, as ``scheduler jobs`` does (one read transaction,
one statement, the rows turned into ``Job`` views). The table shows p50 and p95 of the wall
time, the client CPU per call (``time.process_time``, stable on a busy machine), statements
per call, and the first line of the statement's plan.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _bench
from dashboard_pages import engines, loaded
from sqlalchemy import event, text

from scheduler import Scheduler
from scheduler._store.jobs import list_statement

PG_DATABASE = "bench_jobs_list_13b"


def cases(tasks: int) -> dict[str, dict[str, Any]]:
    mid = f"task-{tasks // 2:05d}"
    failing = f"task-{tasks // 2 + 1:05d}"  # populate() gives it aborted jobs
    return {
        "jobs --task NAME --limit 50": {"task": mid},
        "jobs --task NAME --state aborted": {"task": failing, "state": "aborted"},
        "jobs (newest 50)": {},
        "jobs --state queued": {"state": "queued"},
        "jobs --handler H": {"handler": "h7"},
        "jobs --queue reports": {"queue": "reports"},
    }


def plan(app: Scheduler, filters: dict[str, Any]) -> str:
    statement = list_statement(limit=50, **filters)
    sql = str(statement.compile(app.store.engine, compile_kwargs={"literal_binds": True}))
    sqlite = app.store.engine.dialect.name == "sqlite"
    with app.store.read() as conn:
        found = [
            str(r[-1])
            for r in conn.execute(text(("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + sql))
        ]
    if sqlite:
        return "; ".join(found)
    # The plan's nodes, without costs: "Limit > Index Scan Backward using ix_... on ..."
    nodes = [line.strip().lstrip("-> ").split("  (")[0] for line in found if "(cost" in line]
    return " > ".join(nodes)


def measure(app: Scheduler, reps: int, filters: dict[str, Any]) -> tuple[float, float, float, int]:
    statements = 0

    def count(*_args: Any) -> None:
        nonlocal statements
        statements += 1

    call: Callable[[], Any] = lambda: app.jobs(**filters)  # noqa: E731
    for _ in range(5):  # warm the pool and the caches
        call()
    wall: list[float] = []
    event.listen(app.store.engine, "before_cursor_execute", count)
    cpu_start = time.process_time()
    try:
        for _ in range(reps):
            start = time.perf_counter()
            found = call()
            wall.append((time.perf_counter() - start) * 1000)
    finally:
        event.remove(app.store.engine, "before_cursor_execute", count)
    cpu = (time.process_time() - cpu_start) * 1000 / reps
    assert len(found) == 50, (filters, len(found))
    p95 = statistics.quantiles(wall, n=20)[-1]
    return statistics.median(wall), p95, cpu, statements // reps


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=200)
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--jobs", type=int, default=1_000_000)
    args = p.parse_args()
    rows: list[list[str]] = []
    try:
        for label, url in engines(args, "jobs_list.db", PG_DATABASE):
            app = loaded(label, url, args.tasks, args.jobs)
            for name, filters in cases(args.tasks).items():
                p50, p95, cpu, statements = measure(app, args.reps, filters)
                rows.append(
                    [
                        label,
                        f"`{name}`",
                        _bench.fmt(p50),
                        _bench.fmt(p95),
                        _bench.fmt(cpu),
                        str(statements),
                        plan(app, filters),
                    ]
                )
            app.close()
    finally:
        if not args.no_pg:
            _bench.drop_pg_database(args.pg, PG_DATABASE)
    _bench.print_table(
        f"`app.jobs(...)` at {args.tasks:,} tasks and {args.jobs:,} jobs, {args.reps} calls per"
        f" case (load {_bench.load()}, {_bench.source_version()})",
        ["engine", "case", "p50 ms", "p95 ms", "CPU ms/call", "SQL/call", "plan"],
        rows,
    )
    print(_bench.machine(), file=sys.stderr)


if __name__ == "__main__":
    main()
