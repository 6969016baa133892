"""10,000 jobs at once: ``app.enqueue_many`` beside 10,000 ``app.enqueue()`` calls and beside the
least a hand-written bulk load of the same rows costs, on SQLite, PostgreSQL and MariaDB.

Cases, each run ``--reps`` times on an emptied jobs table (median wall time and client CPU):

- ``loop``: ``app.enqueue(handler, payload)`` N times (each its own transaction and commit);
- ``enqueue_many``: one ``app.enqueue_many(items)`` call (every item checked, one transaction,
  one statement per chunk, the ids returned in order);
- ``raw COPY`` (PostgreSQL): psycopg's ``cursor.copy`` of the same rows (the fastest way to load
  rows; no ids come back), one transaction;
- ``raw multi-row INSERT``: ``INSERT ... VALUES (...), (...), ...`` of 1,000 rows per statement
  on the driver's cursor, one transaction, no ids back (the issue's baseline);
- ``raw executemany``: the driver's ``executemany`` of one ``INSERT`` of the same rows (psycopg
  pipelines it; PyMySQL rewrites it into multi-row ``INSERT``s; sqlite3 loops in C), one
  transaction, no ids back;
- ``raw Core insert``: SQLAlchemy Core ``conn.execute(insert(jobs), rows)``, one transaction.

The raw rows are the same column values ``enqueue_many`` writes (payload JSON text, UTC
timestamps), built before the clock starts: the raw cases do no checking at all.

    python benchmarks/enqueue_many.py [--jobs 10000] [--reps 3] [--mysql URL] [--no-pg]

PostgreSQL: database ``bench_enqueue_many`` (+ ``$SCHEDULER_BENCH_SUFFIX``), created and dropped
here; MariaDB: database ``bench_enqueue_many`` on ``--mysql``'s server, likewise; SQLite: a file
in a temporary folder.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bench
from sqlalchemy import create_engine, delete, insert, text
from sqlalchemy.engine import make_url

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.bulk import COLUMNS
from scheduler._store.tables import jobs

HANDLER = "bench.noop"
MULTIROW = 1_000  # rows per statement of the raw multi-row INSERT (enqueue_many's on MariaDB)


def measure(run: Callable[[], Any], reset: Callable[[], None], reps: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(reps):
        reset()
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def rows_for(count: int) -> list[tuple[Any, ...]]:
    now = datetime.now(UTC).replace(tzinfo=None)
    values = {
        "handler": HANDLER,
        "queue": "default",
        "priority": 0,
        "run_at": now,
        "state": "queued",
        "attempts": 0,
        "max_attempts": 3,
        "dedupe_key": None,
        "task_name": None,
        "created_at": now,
        "traceparent": None,
        "tenant": None,
    }
    return [
        tuple(
            json.dumps({"n": n}, separators=(",", ":")) if c == "payload" else values[c]
            for c in COLUMNS
        )
        for n in range(count)
    ]


def cases(url: str, count: int, reps: int) -> list[tuple[str, float, float]]:
    app = Scheduler(url, registry=Registry())
    app.migrate()
    app.handler(HANDLER)(_bench.noop)
    engine = app.store.engine
    backend = engine.dialect.name

    def reset() -> None:
        with engine.begin() as conn:
            conn.execute(delete(jobs))

    items = [{"handler": HANDLER, "payload": {"n": n}} for n in range(count)]
    rows = rows_for(count)
    aware = {"run_at": rows[0][COLUMNS.index("run_at")].replace(tzinfo=UTC)}
    aware["created_at"] = aware["run_at"]
    dicts = [{**dict(zip(COLUMNS, row, strict=True)), **aware} for row in rows]  # Core's type
    found: list[tuple[str, float, float]] = []

    def loop() -> None:
        for item in items:
            app.enqueue(item["handler"], item["payload"])

    def many() -> None:
        ids = app.enqueue_many(items)
        assert len(ids) == count

    def core() -> None:
        with engine.begin() as conn:
            conn.execute(insert(jobs), dicts)

    marks = ", ".join(["?" if backend == "sqlite" else "%s"] * len(COLUMNS))
    single = f"INSERT INTO scheduler_jobs ({', '.join(COLUMNS)}) VALUES ({marks})"
    if backend == "sqlite":  # as SQLAlchemy stores them on SQLite
        at = COLUMNS.index("run_at"), COLUMNS.index("created_at")
        stored = [
            tuple(v.isoformat(" ", "microseconds") if i in at else v for i, v in enumerate(row))
            for row in rows
        ]
    else:
        stored = rows

    def executemany() -> None:
        with engine.begin() as conn:
            cursor = conn.connection.cursor()
            cursor.executemany(single, stored)

    def multirow() -> None:
        with engine.begin() as conn:
            cursor = conn.connection.cursor()
            for start in range(0, len(stored), MULTIROW):
                part = stored[start : start + MULTIROW]
                values = ", ".join([f"({marks})"] * len(part))
                sql = f"INSERT INTO scheduler_jobs ({', '.join(COLUMNS)}) VALUES {values}"
                cursor.execute(sql, [value for row in part for value in row])

    def copy() -> None:
        with engine.begin() as conn:
            cursor: Any = conn.connection.cursor()
            with cursor.copy(f"COPY scheduler_jobs ({', '.join(COLUMNS)}) FROM STDIN") as out:
                for row in rows:
                    out.write_row(row)

    plan = [("loop: app.enqueue() x N", loop), ("enqueue_many", many)]
    if backend == "postgresql":
        plan.append(("raw COPY (psycopg)", copy))
    plan += [
        (f"raw multi-row INSERT ({MULTIROW:,} rows per statement)", multirow),
        ("raw executemany (driver)", executemany),
        ("raw Core insert(jobs), rows", core),
    ]
    for name, run in plan:
        print(f"{backend}: {name} ...", file=sys.stderr)
        wall, cpu = measure(run, reset, reps)
        found.append((name, wall, cpu))
    reset()
    app.close()
    return found


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=3)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument(
        "--mysql",
        default=os.environ.get("SCHEDULER_BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test"),
        help="MariaDB/MySQL URL of a server whose bench_enqueue_many database is made here",
    )
    p.add_argument("--no-mysql", action="store_true")
    args = p.parse_args()
    load_before = os.getloadavg()
    results: list[tuple[str, list[tuple[str, float, float]]]] = []
    with tempfile.TemporaryDirectory() as folder:
        if not args.no_sqlite:
            url = f"sqlite:///{Path(folder) / 'bench.db'}"
            results.append(("SQLite", cases(url, args.jobs, args.reps)))
    if not args.no_pg:
        url = _bench.recreate_pg_database(args.pg, "bench_enqueue_many")
        try:
            results.append(("PostgreSQL", cases(url, args.jobs, args.reps)))
        finally:
            admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                name = make_url(url).database
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
    if not args.no_mysql:
        database = "bench_enqueue_many" + _bench.SUFFIX
        server = make_url(args.mysql)
        admin = create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {database}"))
            conn.execute(text(f"CREATE DATABASE {database}"))
        try:
            url = server.set(database=database).render_as_string(hide_password=False)
            results.append(("MariaDB", cases(url, args.jobs, args.reps)))
        finally:
            with admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS {database}"))
            admin.dispose()
    load_after = os.getloadavg()
    print(
        f"enqueue_many: {args.jobs:,} jobs, median of {args.reps} (load average"
        f" {load_before[0]:.1f} before, {load_after[0]:.1f} after)\n"
    )
    print("| db | case | median s | jobs/s | client CPU s | vs enqueue_many |")
    print("|---|---|---|---|---|---|")
    for db, found in results:
        many = next(wall for name, wall, _cpu in found if name == "enqueue_many")
        for name, wall, cpu in found:
            ratio = "" if name == "enqueue_many" else f"{wall / many:.2f}x its time"
            print(f"| {db} | {name} | {wall:.3f} | {args.jobs / wall:,.0f} | {cpu:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
