"""The database gauges of ``/metrics`` at scale: 10,000 tasks and 1,000,000 jobs.

    .venv/bin/python benchmarks/metrics_scale.py [--tasks 10000] [--jobs 1000000] [--reads 9]

The data set is ``explain_scale.py``'s (bulk ``INSERT ... SELECT`` on the server; every job
succeeded, each task jobs/tasks of them). Then the gauges' read (``DatabaseCollector``, one
statement, taken by every worker with metrics on once per ``[metrics] cache_seconds`` while it
is scraped) runs ``--reads`` times: the table shows its median and slowest wall time and its
statements. SQLite lives in a temporary folder; PostgreSQL in its own database
``bench_metrics`` (plus ``SCHEDULER_BENCH_SUFFIX``), created and dropped by the script. Run it
with another checkout on ``PYTHONPATH`` for an A/B.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from explain_scale import _fill
from sqlalchemy import create_engine, event, text

from scheduler import Scheduler
from scheduler.metrics import DatabaseCollector


def _measure(url: str, tasks: int, jobs: int, reads: int) -> tuple[float, float, float, int]:
    app = Scheduler(url)
    try:
        app.migrate()
        began = time.perf_counter()
        _fill(app, tasks, jobs)
        filled = time.perf_counter() - began
        collector = DatabaseCollector(app, cache_seconds=0)
        statements: list[str] = []
        event.listen(app.store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        took = []
        for _ in range(reads):
            began = time.perf_counter()
            collector._refresh()
            took.append((time.perf_counter() - began) * 1000)
        per_read = sum(1 for s in statements if not s.startswith(("BEGIN", "COMMIT"))) // reads
        return filled, statistics.median(took), max(took), per_read
    finally:
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=9)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'metrics.db'}"
        rows.append(("SQLite", *_measure(url, args.tasks, args.jobs, args.reads)))
    if not args.no_pg:
        name = "bench_metrics" + os.environ.get("SCHEDULER_BENCH_SUFFIX", "")
        admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
            conn.execute(text(f"CREATE DATABASE {name}"))
        try:
            url = admin.url.set(database=name).render_as_string(hide_password=False)
            rows.append(("PostgreSQL", *_measure(url, args.tasks, args.jobs, args.reads)))
        finally:
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
            admin.dispose()
    print(f"{args.tasks:,} tasks, {args.jobs:,} jobs, {args.reads} reads of the gauges")
    print(f"{'engine':<11} {'fill s':>7} {'median ms':>10} {'slowest ms':>11} {'statements':>11}")
    for engine, filled, median, slowest, statements in rows:
        print(f"{engine:<11} {filled:>7.1f} {median:>10.1f} {slowest:>11.1f} {statements:>11}")


if __name__ == "__main__":
    main()
