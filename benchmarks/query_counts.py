"""SQL statements per queue operation, counted on the Scheduler's own engine.

    python benchmarks/query_counts.py [--pg URL] [--mysql URL]

Counts every statement the driver executes (SQLAlchemy's ``before_cursor_execute``), apart from
BEGIN/COMMIT/ROLLBACK, and the transactions each operation opens (SQLAlchemy's ``begin``, plus
each statement run outside one, in the driver's autocommit). SQLite runs on a temporary
file; PostgreSQL and MariaDB (``SCHEDULER_BENCH_PG`` / ``SCHEDULER_BENCH_MYSQL`` or the flags,
defaulting to the test servers) are measured if reachable, in a database of their own
(``scheduler_bench``, created if missing) so no other data is touched.

``tests/store/test_queue.py`` pins these figures: a change in cost per job fails it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, delete, event, text
from sqlalchemy.engine import make_url

from scheduler import Scheduler, TaskSpec
from scheduler._app import TICK_RECORD_SECONDS
from scheduler._model.handlers import Registry
from scheduler._store.tables import metadata

PG_URL = os.environ.get("SCHEDULER_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("SCHEDULER_BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
BENCH_DB = "scheduler_bench"
_TX = ("BEGIN", "COMMIT", "ROLLBACK")

Counts = dict[str, tuple[int, int]]  # operation -> (statements, transactions)


class _Counter:
    def __init__(self, engine: Engine) -> None:
        self.statements: list[str] = []
        self.transactions = 0
        self.engine = engine

    def on_execute(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.lstrip().upper().startswith(_TX):
            self.statements.append(" ".join(statement.split()))
            if not conn.in_transaction():  # run in the driver's autocommit: its own transaction
                self.transactions += 1

    def on_begin(self, conn: Any) -> None:
        self.transactions += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.statements.clear()
        self.transactions = 0
        event.listen(self.engine, "before_cursor_execute", self.on_execute)
        event.listen(self.engine, "begin", self.on_begin)
        try:
            yield
        finally:
            event.remove(self.engine, "before_cursor_execute", self.on_execute)
            event.remove(self.engine, "begin", self.on_begin)


def measure(url: str, verbose: bool = False) -> Counts:
    """Run each operation once on a migrated, empty database at ``url`` and count."""
    now = [datetime(2030, 1, 7, 12, 0, tzinfo=UTC)]
    app = Scheduler(url, registry=Registry(), clock=lambda: now[0], worker_id="bench")

    @app.handler("bench.ok", retry_safe=True)
    def ok(job: Any) -> None:
        pass

    @app.handler("bench.fail", retry_safe=True, max_attempts=5)
    def fail(job: Any) -> None:
        raise ValueError("fails on purpose")

    counter = _Counter(app.store.engine)
    results: Counts = {}

    def count(name: str, operation: Callable[[], Any]) -> Any:
        with counter.counting():
            value = operation()
        results[name] = (len(counter.statements), counter.transactions)
        if verbose:
            for statement in counter.statements:
                print(f"    {name}: {statement[:110]}")
        return value

    try:
        app.check_schema()  # connects and checks once; not part of any operation
        runner = app.runner()
        count("enqueue", lambda: app.enqueue("bench.ok"))
        count("enqueue with dedupe key", lambda: app.enqueue("bench.ok", dedupe_key="k"))
        [job] = count("claim", lambda: runner.claim(1))
        count("complete (success)", lambda: runner.run(job))
        [job] = runner.claim(1)
        app.enqueue("bench.fail")
        count("claim + complete, dedupe job", lambda: runner.run(job))
        [job] = runner.claim(1)
        count("fail (retry later)", lambda: runner.run(job))
        count("work(), nothing ready", app.work)
        # A tick is kept on record for `status` at most once per TICK_RECORD_SECONDS of the
        # clock, per Scheduler: the process's first tick registers the record, the ticks
        # within that time write nothing more, the first one past it updates the record.
        count("tick, idle, first of the process", app.tick)
        count("tick, idle", app.tick)
        now[0] += timedelta(seconds=TICK_RECORD_SECONDS)
        count(f"tick, idle, {TICK_RECORD_SECONDS:g} s later", app.tick)
        app.sync(
            [
                TaskSpec(
                    name="bench-row",
                    cron="0 3 * * *",
                    handler="bench.ok",
                    payload={},
                    timezone="UTC",
                )
            ]
        )
        app.trigger("bench-row")
        count("tick, one row dispatched", app.tick)
        count("work(), one job", app.work)
    finally:
        app.close()
    del results["claim + complete, dedupe job"]  # same as complete; ran to empty the queue
    return results


@contextmanager
def _server_db(url: str) -> Iterator[str | None]:
    """A migrated, empty ``scheduler_bench`` database on the server at ``url``, or None."""
    base = make_url(url)
    try:
        admin = create_engine(
            base, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        with admin.connect() as conn:
            if base.get_backend_name() == "postgresql":
                exists = conn.execute(
                    text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": BENCH_DB}
                ).first()
                if not exists:
                    conn.execute(text(f"CREATE DATABASE {BENCH_DB}"))
            else:
                conn.execute(text(f"CREATE DATABASE IF NOT EXISTS {BENCH_DB}"))
        admin.dispose()
    except Exception as exc:  # any driver error: the server is not here
        print(
            f"  ({base.get_backend_name()} at {base.host}:{base.port} skipped: "
            f"{type(exc).__name__})"
        )
        yield None
        return
    bench = base.set(database=BENCH_DB).render_as_string(hide_password=False)
    _prepare(bench)
    yield bench


def _prepare(url: str) -> None:
    app = Scheduler(url, registry=Registry())
    try:
        app.migrate()
        with app.store.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(delete(table))
    finally:
        app.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=PG_URL)
    parser.add_argument("--mysql", default=MYSQL_URL)
    parser.add_argument("-v", "--verbose", action="store_true", help="print each statement")
    args = parser.parse_args(argv)
    logging.getLogger("scheduler").setLevel(logging.ERROR)  # the failing job logs on purpose

    columns: dict[str, Counts] = {}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        _prepare(url)
        columns["sqlite"] = measure(url, args.verbose)
    for label, server in (("postgresql", args.pg), ("mariadb", args.mysql)):
        with _server_db(server) as url:
            if url is not None:
                columns[label] = measure(url, args.verbose)

    operations = list(next(iter(columns.values())))
    width = max(len(op) for op in operations)
    print("statements (transactions) per operation, BEGIN/COMMIT excluded")
    print(f"{'operation':<{width}}  " + "  ".join(f"{name:>12}" for name in columns))
    for op in operations:
        cells = "  ".join(
            f"{f'{columns[name][op][0]} ({columns[name][op][1]})':>12}" for name in columns
        )
        print(f"{op:<{width}}  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
