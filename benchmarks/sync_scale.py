"""Sync at scale: N tasks synced into an empty table, then re-synced unchanged, through
``app.sync(list of TaskSpec)`` and through ``scheduler sync`` on a generated TOML file; beside
APScheduler 3.11 adding (and re-adding) the same N jobs.

    benchmarks/.venv/bin/python benchmarks/sync_scale.py [--tasks 100000] [--reps 3]

Prints one Markdown table of medians over ``--reps`` runs per case: wall seconds, CPU seconds
of the process (for ``scheduler sync``, of the child process), tasks per second, SQL
statements, and the target beside each figure. The tasks are "one per customer": names
``customer-0000001``..., payload ``{customer = i, plan = "..."}``, crons cycling through
``*/15 * * * *``, ``0 3 * * *``, ``H * * * *`` and ``H H * * *``, zones through UTC,
Europe/Berlin and America/New_York. Each engine gets its own database: a SQLite file (WAL), a
PostgreSQL schema (``--pg-schema`` in the ``--pg`` database, through ``search_path``) and a
MariaDB database (``--mysql``); each is created at the start and dropped at the end.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any
from urllib.parse import quote

import _bench
from _bench import Counter, fmt, median, progress
from sqlalchemy import create_engine, delete, event, text
from sqlalchemy.engine import make_url

from scheduler import Scheduler, TaskSpec, load_config
from scheduler._model.handlers import Registry
from scheduler._store.tables import metadata

CRONS = ("*/15 * * * *", "0 3 * * *", "H * * * *", "H H * * *")
ZONES = ("UTC", "Europe/Berlin", "America/New_York")
PLANS = ("free", "team", "enterprise")
DEFAULT_MYSQL = os.environ.get("SCHEDULER_BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")
# The targets (seconds for 100,000 tasks), per engine and case; None: no target.
TARGETS: dict[tuple[str, str], float] = {
    ("SQLite", "new"): 3.0,
    ("PostgreSQL", "new"): 6.0,
    ("SQLite", "unchanged"): 1.5,
    ("PostgreSQL", "unchanged"): 1.5,
}


def specs(n: int) -> list[TaskSpec]:
    return [
        TaskSpec(
            name=f"customer-{i:07d}",
            cron=CRONS[i % len(CRONS)],
            handler="billing.invoice",
            payload={"customer": i, "plan": PLANS[i % len(PLANS)]},
            timezone=ZONES[i % len(ZONES)],
        )
        for i in range(n)
    ]


def write_toml(path: Path, url: str, tasks: list[TaskSpec]) -> None:
    lines = [f'[database]\nurl = "{url}"\n']
    for t in tasks:
        lines.append(
            f'[[tasks]]\nname = "{t.name}"\ncron = "{t.cron}"\nhandler = "{t.handler}"\n'
            f'timezone = "{t.timezone}"\n'
            f'payload = {{ customer = {t.payload["customer"]}, plan = "{t.payload["plan"]}" }}\n'
        )
    path.write_text("\n".join(lines), encoding="utf-8")


# -- databases ------------------------------------------------------------------------------
@dataclass
class Database:
    label: str
    url: str
    aps_url: str
    drop: Callable[[], None] = lambda: None


def sqlite_db(scratch: Path) -> Database:
    return Database("SQLite", f"sqlite:///{scratch / 'sync.db'}", f"sqlite:///{scratch / 'aps.db'}")


def _admin(server: str, statements: list[str]) -> None:
    engine = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def pg_db(server: str, schema: str) -> Database:
    ours, aps = schema, f"{schema}_aps"
    _admin(server, [f"DROP SCHEMA IF EXISTS {s} CASCADE; CREATE SCHEMA {s}" for s in (ours, aps)])

    def url(s: str) -> str:
        base = make_url(server).render_as_string(hide_password=False)
        return f"{base}{'&' if '?' in base else '?'}options={quote(f'-csearch_path={s}')}"

    def drop() -> None:
        _admin(server, [f"DROP SCHEMA IF EXISTS {s} CASCADE" for s in (ours, aps)])

    return Database("PostgreSQL", url(ours), url(aps), drop)


def mysql_db(server: str, database: str) -> Database:
    ours, aps = database, f"{database}_aps"
    _admin(
        server,
        [s for d in (ours, aps) for s in (f"DROP DATABASE IF EXISTS {d}", f"CREATE DATABASE {d}")],
    )

    def url(d: str) -> str:
        return make_url(server).set(database=d).render_as_string(hide_password=False)

    def drop() -> None:
        _admin(server, [f"DROP DATABASE IF EXISTS {d}" for d in (ours, aps)])

    return Database("MariaDB", url(ours), url(aps), drop)


def empty_tables(app: Scheduler) -> None:
    with app.store.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(delete(table))
    if app.store.caps.dialect == "postgresql":
        with app.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE scheduler_rows"))


# -- the cases --------------------------------------------------------------------------------
@dataclass
class Cell:
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    statements: list[int] = field(default_factory=list)


def api_sync(
    app: Scheduler, counter: Counter, tasks: list[TaskSpec], expect: str
) -> tuple[float, float, int]:
    counter.reset()
    began, cpu = time.perf_counter(), time.process_time()
    plan = app.sync(tasks)
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    if len(getattr(plan, expect)) != len(tasks):
        raise RuntimeError(f"sync: {len(getattr(plan, expect))} of {len(tasks)} {expect}")
    return seconds, cpu, counter.reset().statements


def cli_sync(path: Path) -> tuple[float, float]:
    """``scheduler --config path sync`` in a fresh process, as a user runs it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "scheduler", "--config", str(path), "sync"],
        check=True,
        stdout=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k != "SCHEDULER_DATABASE_URL"},
    )
    seconds = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def load_only(path: Path) -> tuple[float, float]:
    """Reading and checking the TOML file alone (``load_config``), in this process."""
    began, cpu = time.perf_counter(), time.process_time()
    load_config(path)
    return time.perf_counter() - began, time.process_time() - cpu


class Aps:
    """APScheduler 3.11 over its SQLAlchemyJobStore: ``add_job`` once per task, as its users
    declare jobs (each is one INSERT and its own transaction); a re-add is
    ``add_job(..., replace_existing=True)``, its way to make the store match the code."""

    def __init__(self, url: str) -> None:
        from apscheduler.executors.base import BaseExecutor
        from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
        from apscheduler.schedulers.base import BaseScheduler

        class Noop(BaseExecutor):  # type: ignore[misc]
            def _do_submit_job(self, job: Any, run_times: Any) -> None:
                pass

        class HandDriven(BaseScheduler):  # type: ignore[misc]
            def wakeup(self) -> None:
                pass

            def shutdown(self, wait: bool = True) -> None:
                super().shutdown(wait)

        self.engine = create_engine(url)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_wal)
        self.store = SQLAlchemyJobStore(engine=self.engine)
        self.sched = HandDriven(
            timezone=UTC, jobstores={"default": self.store}, executors={"default": Noop()}
        )
        self.sched.start(paused=True)
        self.counter = Counter(self.engine)

    def add(self, tasks: list[TaskSpec], replace: bool) -> tuple[float, float, int]:
        from apscheduler.triggers.cron import CronTrigger

        self.counter.reset()
        began, cpu = time.perf_counter(), time.process_time()
        for t in tasks:
            cron = t.cron.replace("H H", "7 3").replace("H ", "7 ")  # APScheduler has no H
            self.sched.add_job(
                _bench.noop,
                CronTrigger.from_crontab(cron, timezone=t.timezone),
                id=t.name,
                kwargs=t.payload,
                replace_existing=replace,
            )
        return (
            time.perf_counter() - began,
            time.process_time() - cpu,
            self.counter.reset().statements,
        )

    def empty(self) -> None:
        self.sched.remove_all_jobs()

    def close(self) -> None:
        self.sched.shutdown(wait=False)
        self.engine.dispose()


def _sqlite_wal(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def run_engine(
    db: Database, n: int, reps: int, aps_n: int, aps_reps: int, scratch: Path, cli: bool = True
) -> dict[str, Cell]:
    cells: dict[str, Cell] = {}
    tasks = specs(n)
    app = Scheduler(db.url, registry=Registry())
    app.migrate()
    app.check_schema()
    counter = Counter(app.store.engine)
    toml = scratch / f"sync-{db.label}.toml"
    write_toml(toml, db.url, tasks)
    progress(f"{db.label}: {toml.stat().st_size / 1e6:.1f} MB of TOML for {n:,} tasks")
    for rep in range(reps):
        progress(f"{db.label}: rep {rep + 1}/{reps}")
        empty_tables(app)
        for case, expect in (("new", "insert"), ("unchanged", "unchanged")):
            seconds, cpu, statements = api_sync(app, counter, tasks, expect)
            cell = cells.setdefault(f"api {case}", Cell())
            cell.seconds.append(seconds)
            cell.cpu.append(cpu)
            cell.statements.append(statements)
        if not cli:
            continue
        empty_tables(app)
        for case in ("new", "unchanged"):
            seconds, cpu = cli_sync(toml)
            cell = cells.setdefault(f"cli {case}", Cell())
            cell.seconds.append(seconds)
            cell.cpu.append(cpu)
        left = len(app.rows(limit=None))
        if left != n:
            raise RuntimeError(f"{db.label}: scheduler sync left {left} rows, not {n}")
        seconds, cpu = load_only(toml)
        cell = cells.setdefault("load_config", Cell())
        cell.seconds.append(seconds)
        cell.cpu.append(cpu)
    app.close()
    aps = Aps(db.aps_url)
    for rep in range(aps_reps):
        progress(f"{db.label}: APScheduler rep {rep + 1}/{aps_reps}")
        aps.empty()
        for case, replace in (("new", False), ("unchanged", True)):
            seconds, cpu, statements = aps.add(tasks[:aps_n], replace)
            cell = cells.setdefault(f"aps {case}", Cell())
            cell.seconds.append(seconds)
            cell.cpu.append(cpu)
            cell.statements.append(statements)
    aps.close()
    return cells


LABELS = {
    "api": "`app.sync(tasks)`",
    "cli": "`scheduler sync` (new process, TOML)",
    "aps": "APScheduler 3.11 `add_job` each",
}


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=3)
    p.add_argument("--tasks", type=int, default=100_000, help="tasks per sync (default 100000)")
    p.add_argument("--aps-reps", type=int, default=1, help="APScheduler repetitions (default 1)")
    p.add_argument(
        "--aps-tasks",
        type=int,
        default=0,
        help="jobs APScheduler adds (default: --tasks; fewer to save time: its figures are per"
        " job, and the tasks/s and ratio columns compare rates)",
    )
    p.add_argument("--pg-schema", default="bench_sync_scale", help="PostgreSQL schema to use")
    p.add_argument(
        "--mysql",
        default=DEFAULT_MYSQL,
        help="MariaDB/MySQL server URL (its database is only used to connect)",
    )
    p.add_argument("--mysql-database", default="bench_sync_scale", help="MariaDB database to use")
    p.add_argument("--no-mysql", action="store_true", help="skip MariaDB")
    p.add_argument("--no-cli", action="store_true", help="skip the `scheduler sync` cases")
    args = p.parse_args()
    scratch = _bench.scratch_dir()
    load_before = _bench.load()
    dbs: list[Database] = []
    if not args.no_sqlite:
        dbs.append(sqlite_db(scratch))
    if not args.no_pg:
        dbs.append(pg_db(args.pg, args.pg_schema))
    if not args.no_mysql:
        dbs.append(mysql_db(args.mysql, args.mysql_database))
    n = args.tasks
    aps_n = min(args.aps_tasks or n, n)
    scale = n / 100_000
    rows: list[list[Any]] = []
    try:
        for db in dbs:
            cells = run_engine(db, n, args.reps, aps_n, args.aps_reps, scratch, not args.no_cli)
            # APScheduler's time for n jobs, from its rate when it added fewer
            aps = {
                case: median(cells[f"aps {case}"].seconds) * n / aps_n
                for case in ("new", "unchanged")
            }
            for key in (
                "api new",
                "api unchanged",
                "cli new",
                "cli unchanged",
                "aps new",
                "aps unchanged",
            ):
                system, case = key.split()
                if key not in cells:
                    continue  # --no-cli
                cell = cells[key]
                seconds = median(cell.seconds)
                count = aps_n if system == "aps" else n
                target = None if system == "aps" else TARGETS.get((db.label, case))
                goal = "-"
                if target is not None:
                    met = "met" if seconds <= target * scale else "NOT met"
                    goal = f"<= {fmt(target * scale)} s: {met}"
                rows.append(
                    [
                        db.label,
                        LABELS[system],
                        "new" if case == "new" else "re-sync, unchanged",
                        f"{count:,}",
                        fmt(seconds),
                        fmt(median(cell.cpu)),
                        fmt(count / seconds),
                        fmt(median(cell.statements)) if cell.statements else "-",
                        "-" if system == "aps" else _bench.ratio(aps[case], seconds),
                        goal,
                    ]
                )
            load = cells.get("load_config")
            if load is None:  # --no-cli
                continue
            rows.append(
                [
                    db.label,
                    "of which `load_config` (read + check the TOML)",
                    "-",
                    f"{n:,}",
                    fmt(median(load.seconds)),
                    fmt(median(load.cpu)),
                    fmt(n / median(load.seconds)),
                    "0",
                    "-",
                    "-",
                ]
            )
    finally:
        for db in dbs:
            db.drop()
    _bench.print_table(
        f"Sync of {n:,} tasks, medians of {args.reps} runs (APScheduler: {args.aps_reps})"
        f" ({_bench.machine()}; load average {load_before} before, {_bench.load()} after)",
        [
            "db",
            "how",
            "case",
            "tasks",
            "s",
            "CPU s",
            "tasks/s",
            "SQL",
            "APScheduler / ours",
            "target",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
