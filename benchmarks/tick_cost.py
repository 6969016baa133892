"""Tick cost: one tick over R scheduler rows of which D are due, ours beside a raw loop and
APScheduler 3.11.

    benchmarks/.venv/bin/python benchmarks/tick_cost.py [--max-rows 100000] [--reps 3]

Prints one Markdown table of medians over ``--reps`` ticks per case: the time and SQL statements
of one tick, and the cost per dispatched row ((t(D) - t(0)) / D) beside a raw compare-and-swap +
INSERT loop and APScheduler's ``_process_jobs`` over its SQLAlchemyJobStore holding the same R
cron jobs. Each system has its own database. See benchmarks/README.md for the method.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _bench
from _bench import Counter, fmt, median, progress
from croniter import croniter
from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    bindparam,
    create_engine,
    delete,
    event,
    insert,
    or_,
    select,
    text,
    update,
)

from scheduler import Scheduler
from scheduler._store import make_engine
from scheduler._store.tables import jobs as our_jobs
from scheduler._store.tables import rows as our_rows

HANDLER = "bench.noop"
CRON = "0 0 * * *"  # daily at midnight: a dispatched row is not due again during the run
CHUNK = 10_000
BATCH = 100  # rows per due query: ours' default batch_size, and the raw loop's
SMALL_D, SMALL_REPS = 10, 25  # cases this small take ms: more repetitions cost little


def _names(n: int) -> list[str]:
    return [f"task-{i:07d}" for i in range(n)]


def due_ids(r: int, d: int) -> list[int]:
    """D row ids spread evenly over 1..R (ids are assigned in insertion order)."""
    if d == 0:
        return []
    step = r // d
    return [1 + i * step for i in range(d)]


# -- ours ---------------------------------------------------------------------------------------
class Ours:
    label = "ours"

    def __init__(self, url: str) -> None:
        self.url = url
        self.app = Scheduler(url)
        self.app.migrate()
        self.app.handler(HANDLER, retry_safe=True)(_bench.noop)
        self.app.check_schema()
        self.counter = Counter(self.app.store.engine)

    def load(self, r: int, future: datetime) -> None:
        with self.app.store.begin() as conn:
            names = _names(r)
            for start in range(0, r, CHUNK):
                conn.execute(
                    insert(our_rows),
                    [
                        {
                            "name": name,
                            "handler": HANDLER,
                            "payload": "{}",
                            "cron": CRON,
                            "timezone": "UTC",
                            "concurrent": False,
                            "enabled": True,
                            "next_run_at": future,
                            "consecutive_failures": 0,
                            "version": 1,
                            "created_at": future,
                            "updated_at": future,
                        }
                        for name in names[start : start + CHUNK]
                    ],
                )
        _analyze(self.app.store.engine, ("scheduler_rows", "scheduler_jobs"))

    def make_due(self, ids: list[int], due: datetime) -> None:
        with self.app.store.begin() as conn:
            conn.execute(delete(our_jobs))
            for start in range(0, len(ids), 500):
                conn.execute(
                    update(our_rows)
                    .where(our_rows.c.id.in_(ids[start : start + 500]))
                    .values(next_run_at=due, last_job_id=None)
                )

    def tick(self) -> tuple[int, int]:
        self.counter.reset()
        report = self.app.tick()
        return len(report.dispatched), self.counter.reset().statements

    def close(self) -> None:
        self.app.close()


# -- raw: the least a correct loop does per due row --------------------------------------------
raw_md = MetaData()
raw_rows = Table(
    "scheduler_rows",
    raw_md,
    Column("id", Integer, primary_key=True),
    Column("cron", String(200)),
    Column("handler", String(200)),
    Column("payload", Text),
    Column("enabled", Boolean),
    Column("concurrent", Boolean),
    Column("next_run_at", DateTime),
    Column("last_job_id", Integer),
    Column("version", Integer),
    Column("updated_at", DateTime),
)
raw_jobs = Table(
    "scheduler_jobs",
    raw_md,
    Column("id", Integer, primary_key=True),
    Column("handler", String(200)),
    Column("payload", Text),
    Column("queue", String(100)),
    Column("priority", Integer),
    Column("run_at", DateTime),
    Column("state", String(16)),
    Column("attempts", Integer),
    Column("max_attempts", Integer),
    Column("task_name", String(200)),
    Column("created_at", DateTime),
)


class Raw(Ours):
    """Same schema (our migration is the DDL, nothing else of ours runs): a keyset loop over
    due rows joined to their last job's state, then per row one transaction with an INSERT of
    the job and a compare-and-swap UPDATE on the version; next run from croniter in UTC."""

    label = "raw"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.app.store.dispose()
        self.engine = make_engine(url) if url.startswith("sqlite") else create_engine(url)
        self.counter = Counter(self.engine)
        r, j = raw_rows.c, raw_jobs.c
        self.due = (
            select(
                r.id,
                r.cron,
                r.handler,
                r.payload,
                r.concurrent,
                r.next_run_at,
                r.version,
                j.state,
            )
            .select_from(raw_rows.outerjoin(raw_jobs, j.id == r.last_job_id))
            .where(r.enabled == True, r.next_run_at <= bindparam("p_now"))  # noqa: E712
            .order_by(r.next_run_at, r.id)
            .limit(BATCH)
        )
        self.after = self.due.where(
            or_(
                r.next_run_at > bindparam("p_at"),
                and_(r.next_run_at == bindparam("p_at"), r.id > bindparam("p_id")),
            )
        )
        self.insert_job = insert(raw_jobs)
        self.swap = (
            update(raw_rows)
            .where(r.id == bindparam("p_id"), r.version == bindparam("p_version"))
            .values(
                version=r.version + 1,
                last_job_id=bindparam("p_job"),
                next_run_at=bindparam("p_next"),
                updated_at=bindparam("p_now"),
            )
        )

    def tick(self) -> tuple[int, int]:
        self.counter.reset()
        now = datetime.now(UTC).replace(tzinfo=None)
        dispatched = 0
        with self.engine.connect() as conn:
            params: dict[str, Any] = {"p_now": now}
            stmt = self.due
            while True:
                with conn.begin():
                    batch = conn.execute(stmt, params).all()
                for row in batch:
                    if row.state in ("queued", "claimed") and not row.concurrent:
                        continue
                    nxt = croniter(row.cron, now).get_next(datetime)
                    with conn.begin():
                        job_id = conn.execute(
                            self.insert_job,
                            {
                                "handler": row.handler,
                                "payload": row.payload,
                                "queue": "default",
                                "priority": 0,
                                "run_at": now,
                                "state": "queued",
                                "attempts": 0,
                                "max_attempts": 3,
                                "task_name": None,
                                "created_at": now,
                            },
                        ).inserted_primary_key[0]
                        won = conn.execute(
                            self.swap,
                            {
                                "p_id": row.id,
                                "p_version": row.version,
                                "p_job": job_id,
                                "p_next": nxt,
                                "p_now": now,
                            },
                        ).rowcount
                        if won != 1:
                            conn.rollback()
                            continue
                    dispatched += 1
                if len(batch) < BATCH:
                    break
                stmt = self.after
                params = {"p_now": now, "p_at": batch[-1].next_run_at, "p_id": batch[-1].id}
        return dispatched, self.counter.reset().statements

    def close(self) -> None:
        self.engine.dispose()


# -- APScheduler 3.11 ----------------------------------------------------------------------------
class Aps:
    """A scheduler whose ``_process_jobs`` we call by hand (no thread, wakeup does nothing),
    with a no-op executor: what is timed is APScheduler's own due-job handling."""

    label = "APScheduler"

    def __init__(self, url: str) -> None:
        from apscheduler.executors.base import BaseExecutor
        from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
        from apscheduler.schedulers.base import BaseScheduler

        class NoopExecutor(BaseExecutor):  # type: ignore[misc]
            submitted = 0

            def _do_submit_job(self, job: Any, run_times: Any) -> None:
                NoopExecutor.submitted += 1

        class HandDriven(BaseScheduler):  # type: ignore[misc]
            def wakeup(self) -> None:
                pass

            def shutdown(self, wait: bool = True) -> None:
                super().shutdown(wait)

        self.executor_cls = NoopExecutor
        self.engine = create_engine(url)
        if url.startswith("sqlite"):
            # The same journal settings as ours; APScheduler needs no BEGIN IMMEDIATE.
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self.store = SQLAlchemyJobStore(engine=self.engine)
        self.executor = NoopExecutor()
        self.sched = HandDriven(
            timezone=UTC,
            jobstores={"default": self.store},
            executors={"default": self.executor},
            job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 1},
        )
        self.sched.start()
        self.counter = Counter(self.engine)
        self.template: dict[str, Any] = {}

    def _state(self, name: str, when: datetime) -> bytes:
        state = dict(self.template, id=name, next_run_time=when)
        return pickle.dumps(state, pickle.HIGHEST_PROTOCOL)

    def load(self, r: int, future: datetime) -> None:
        from apscheduler.job import Job
        from apscheduler.triggers.cron import CronTrigger

        job = Job(
            self.sched,
            id="template",
            func=_bench.noop,
            trigger=CronTrigger.from_crontab(CRON, timezone=UTC),
            executor="default",
            args=(),
            kwargs={},
            name="noop",
            misfire_grace_time=None,
            coalesce=True,
            max_instances=1,
            next_run_time=future,
        )
        self.template = job.__getstate__()
        table = self.store.jobs_t
        names = _names(r)
        with self.engine.begin() as conn:
            for start in range(0, r, CHUNK):
                conn.execute(
                    insert(table),
                    [
                        {
                            "id": name,
                            "next_run_time": future.timestamp(),
                            "job_state": self._state(name, future),
                        }
                        for name in names[start : start + CHUNK]
                    ],
                )
        _analyze(self.engine, ("apscheduler_jobs",))

    def make_due(self, ids: list[int], due: datetime) -> None:
        table = self.store.jobs_t
        names = _names(max(ids, default=0) + 1)
        if not ids:
            return
        with self.engine.begin() as conn:
            conn.execute(
                update(table)
                .where(table.c.id == bindparam("p_id"))
                .values(next_run_time=bindparam("p_ts"), job_state=bindparam("p_state")),
                [
                    {
                        "p_id": names[i - 1],
                        "p_ts": due.timestamp(),
                        "p_state": self._state(names[i - 1], due),
                    }
                    for i in ids
                ],
            )

    def tick(self) -> tuple[int, int]:
        self.executor._instances.clear()
        self.executor_cls.submitted = 0
        self.counter.reset()
        self.sched._process_jobs()
        return self.executor_cls.submitted, self.counter.reset().statements

    def close(self) -> None:
        self.sched.shutdown(wait=False)
        self.engine.dispose()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _analyze(engine: Engine, tables: tuple[str, ...]) -> None:
    with engine.connect() as conn:
        for table in tables:
            conn.execute(text(f"ANALYZE {table}"))
        conn.commit()


# -- the run ---------------------------------------------------------------------------------
@dataclass
class Cell:
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    statements: list[int] = field(default_factory=list)


def databases(args: Any, scratch: Path, r: int) -> list[tuple[str, dict[str, str]]]:
    found = []
    if not args.no_sqlite:
        found.append(
            (
                "SQLite",
                {
                    s: f"sqlite:///{scratch / f'tick-{s}-{r}.db'}"
                    for s in ("ours", "raw", "APScheduler")
                },
            )
        )
    if not args.no_pg:
        found.append(
            (
                "PostgreSQL",
                {
                    s: _bench.recreate_pg_database(args.pg, f"bench_tick_{s.lower()}")
                    for s in ("ours", "raw", "APScheduler")
                },
            )
        )
    return found


SYSTEMS: dict[str, Callable[[str], Any]] = {"ours": Ours, "raw": Raw, "APScheduler": Aps}


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=5)
    p.add_argument(
        "--max-rows",
        type=int,
        default=100_000,
        help="largest R of 1000, 100000, 1000000 to run (default 100000)",
    )
    p.add_argument("--due", default="0,10,1000", help="D values, comma-separated")
    p.add_argument(
        "--small-reps",
        type=int,
        default=SMALL_REPS,
        help=f"repetitions of the cases with D <= {SMALL_D} (default {SMALL_REPS}): they take"
        " milliseconds, and the cost per row at D = 10 is a difference of two of them",
    )
    args = p.parse_args()
    sizes = [r for r in (1000, 100_000, 1_000_000) if r <= args.max_rows]
    dues = [int(d) for d in args.due.split(",")]
    scratch = _bench.scratch_dir()
    load_before = _bench.load()
    cells: dict[tuple[str, int, int, str], Cell] = {}
    dbs: list[str] = []
    for r in sizes:
        for db, urls in databases(args, scratch, r):
            if db not in dbs:
                dbs.append(db)
            impls = {}
            for system, url in urls.items():
                progress(f"{db}: loading {r:,} rows for {system}")
                impls[system] = SYSTEMS[system](url)
                impls[system].load(r, datetime.now(UTC) + timedelta(days=2))
                impls[system].tick()  # warm-up: connections, statement caches, schema check
            if db == "PostgreSQL":
                _bench.checkpoint_pg(args.pg)
            for d in (d for d in dues if d <= r):
                ids = due_ids(r, d)
                progress(f"{db}: R={r:,} D={d}")
                # Systems take turns within each repetition, so a burst of load elsewhere on
                # the machine does not land on one system's figures only.
                for _ in range(args.reps if d > SMALL_D else max(args.reps, args.small_reps)):
                    for system, impl in impls.items():
                        cell = cells.setdefault((db, r, d, system), Cell())
                        impl.make_due(ids, datetime.now(UTC) - timedelta(minutes=1))
                        began, cpu = time.perf_counter(), time.process_time()
                        dispatched, statements = impl.tick()
                        cell.seconds.append(time.perf_counter() - began)
                        cell.cpu.append(time.process_time() - cpu)
                        cell.statements.append(statements)
                        if dispatched != d:
                            raise RuntimeError(f"{system} {db} R={r}: {dispatched} of {d} due")
            for impl in impls.values():
                impl.close()
        if not args.no_pg:
            for system in SYSTEMS:
                _bench.drop_pg_database(args.pg, f"bench_tick_{system.lower()}")

    def ms(db: str, r: int, d: int, system: str) -> float:
        cell = cells.get((db, r, d, system))
        return median(cell.seconds) * 1000 if cell else float("nan")

    def cpu_ms(db: str, r: int, d: int, system: str) -> str:
        cell = cells.get((db, r, d, system))
        return fmt(median(cell.cpu) * 1000) if cell else "-"

    def stmts(db: str, r: int, d: int, system: str) -> str:
        cell = cells.get((db, r, d, system))
        return fmt(median(cell.statements)) if cell else "-"

    def per_row(db: str, r: int, d: int, system: str) -> float:
        return (ms(db, r, d, system) - ms(db, r, 0, system)) / d if d else float("nan")

    table = []
    for db in dbs:
        for r in sizes:
            for d in dues:
                if (db, r, d, "ours") not in cells:
                    continue
                ours_row, raw_row, aps_row = (per_row(db, r, d, s) for s in SYSTEMS)
                growth = ms(db, r, d, "ours") / ms(db, sizes[0], d, "ours")
                table.append(
                    [
                        db,
                        f"{r:,}",
                        d,
                        fmt(ms(db, r, d, "ours")),
                        cpu_ms(db, r, d, "ours"),
                        stmts(db, r, d, "ours"),
                        fmt(ms(db, r, d, "raw")),
                        cpu_ms(db, r, d, "raw"),
                        stmts(db, r, d, "raw"),
                        fmt(ms(db, r, d, "APScheduler")),
                        cpu_ms(db, r, d, "APScheduler"),
                        stmts(db, r, d, "APScheduler"),
                        fmt(ours_row),
                        fmt(raw_row),
                        fmt(aps_row),
                        _bench.ratio(ours_row, raw_row) + (" (<=1.5x)" if d else ""),
                        _bench.ratio(aps_row, ours_row) + (" (>=3x)" if d else ""),
                        f"{growth:.2f}x" + (" (<=1.5x)" if d == 0 and r != sizes[0] else ""),
                    ]
                )
    _bench.print_table(
        f"Tick cost: one tick over R rows with D due, median of {args.reps} (D <= {SMALL_D}:"
        f" {max(args.reps, args.small_reps)}) ({_bench.machine()};"
        f" load average {load_before} before, {_bench.load()} after)",
        [
            "db",
            "R",
            "D",
            "ours ms",
            "ours CPU ms",
            "ours SQL",
            "raw ms",
            "raw CPU ms",
            "raw SQL",
            "APS ms",
            "APS CPU ms",
            "APS SQL",
            "ours ms/due row",
            "raw ms/due row",
            "APS ms/due row",
            "ours/raw per row",
            "APS/ours per row",
            f"ours vs R={sizes[0]:,}",
        ],
        table,
    )


if __name__ == "__main__":
    main()
