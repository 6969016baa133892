"""Queue throughput: enqueue and drain N no-op jobs, ours beside a raw loop and procrastinate.

    benchmarks/.venv/bin/python benchmarks/queue_throughput.py [--jobs 20000] [--reps 3]

Prints one Markdown table of medians over ``--reps`` repetitions. Each system works in its own
database (SQLite files in a temporary folder; PostgreSQL databases ``bench_scheduler``,
``bench_raw`` and ``bench_procrastinate``, created and dropped here), emptied before every run.
See benchmarks/README.md for what each row measures.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _bench
from _bench import Counter, Counts, fmt, median, progress
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    create_engine,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url

from scheduler import Scheduler
from scheduler._store import make_engine
from scheduler._store.jobs import new_job_values
from scheduler._store.tables import jobs as our_jobs
from scheduler._worker.worker import Worker

HANDLER = "bench.noop"
LEASE = timedelta(seconds=60)
CHUNK = 5000

# -- the raw baseline's table: the same columns and indexes as scheduler_jobs, plain types ------
raw_md = MetaData()
_Id = BigInteger().with_variant(Integer(), "sqlite")
raw_jobs = Table(
    "raw_jobs",
    raw_md,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("handler", String(200), nullable=False),
    Column("payload", Text, nullable=False),
    Column("queue", String(100), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("run_at", DateTime, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("lease_owner", String(200)),
    Column("lease_expires_at", DateTime),
    Column("started_at", DateTime),
    Column("last_error_code", String(200)),
    Column("dedupe_key", String(200), unique=True),
    Column("task_name", String(200)),
    Column("created_at", DateTime, nullable=False),
    Column("finished_at", DateTime),
    Index("ix_raw_jobs_ready", "state", "queue", "priority", "run_at", "id"),
    Index("ix_raw_jobs_lease", "state", "lease_expires_at"),
    Index("ix_raw_jobs_finished", "state", "finished_at"),
)


def _naive_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def raw_engine(url: str) -> Engine:
    """SQLite: our connection settings (WAL, synchronous=NORMAL, BEGIN IMMEDIATE), which are
    correctness requirements, not framework. PostgreSQL: a plain engine, no pre-ping."""
    return make_engine(url) if url.startswith("sqlite") else create_engine(url)


def raw_values(n: int, now: datetime) -> list[dict[str, Any]]:
    return [
        {
            "handler": HANDLER,
            "payload": "{}",
            "queue": "default",
            "priority": 0,
            "run_at": now,
            "state": "queued",
            "attempts": 0,
            "max_attempts": 3,
            "created_at": now,
        }
        for _ in range(n)
    ]


# -- ours ------------------------------------------------------------------------------------
def _ours_app(url: str) -> Scheduler:
    app = Scheduler(url)
    app.handler(HANDLER, retry_safe=True)(_bench.noop)
    app.check_schema()
    with app.store.read():
        pass  # open the first connection before the clock starts
    return app


def ours_drain(app: Scheduler, batch: int, mode: str) -> int:
    assert mode in OURS_MODES, mode
    """``work``: ``Scheduler.work()``. ``run``: a Runner loop, claim(limit=batch) then run()
    each job (one finishing transaction per job). ``record``: claim(limit=batch), execute()
    each, then record() the batch's outcomes in one transaction. Returns the jobs handled."""
    if mode == "work":
        return app.work()
    if mode == "worker":  # the real worker loop: threads, prefetch, group commit
        return Worker(app, concurrency=batch).run(once=True).handled
    runner = app.runner()
    handled = 0
    while True:
        claimed = runner.claim(limit=batch)
        if not claimed:
            return handled
        if mode == "record":
            runner.record([runner.execute(job) for job in claimed])
        else:
            for job in claimed:
                runner.run(job)
        handled += len(claimed)


def ours_drain_setup(url: str, batch: int, mode: str) -> Callable[[], tuple[int, Counts]]:
    app = _ours_app(url)
    counter = Counter(app.store.engine)

    def go() -> tuple[int, Counts]:
        counter.reset()
        return ours_drain(app, batch, mode), counter.reset()

    return go


def ours_enqueue(url: str, n: int) -> tuple[float, Counts]:
    app = _ours_app(url)
    counter = Counter(app.store.engine)
    began, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        app.enqueue(HANDLER, {})
    elapsed = time.perf_counter() - began
    counts = counter.reset()
    counts.cpu = time.process_time() - cpu
    app.close()
    return elapsed, counts


def ours_fill(url: str, n: int) -> None:
    engine = make_engine(url)
    now = datetime.now(UTC) - timedelta(seconds=1)
    with engine.begin() as conn:
        for start in range(0, n, CHUNK):
            conn.execute(
                insert(our_jobs),
                [
                    new_job_values(handler=HANDLER, payload="{}", now=now)
                    for _ in range(min(CHUNK, n - start))
                ],
            )
    _analyze(engine, "scheduler_jobs")
    engine.dispose()


def ours_done(url: str) -> int:
    engine = make_engine(url)
    with engine.connect() as conn:
        done = conn.execute(
            select(func.count()).select_from(our_jobs).where(our_jobs.c.state == "succeeded")
        ).scalar_one()
    engine.dispose()
    return int(done)


# -- raw SQLAlchemy Core loops -------------------------------------------------------------------
def raw_drain_setup(url: str, batch: int, _mode: str = "") -> Callable[[], tuple[int, Counts]]:
    """``batch == 0``: portable claim one by one (SELECT the first ready id, then a conditional
    UPDATE whose rowcount decides); else one ``UPDATE ... WHERE id IN (SELECT ... LIMIT batch
    [FOR UPDATE SKIP LOCKED]) RETURNING``. Each job is completed in its own transaction by an
    UPDATE guarded by state, owner and lease, exactly like ours."""
    engine = raw_engine(url)
    counter = Counter(engine)
    conn = engine.connect()
    conn.execute(select(1)).all()
    conn.rollback()
    owner = f"raw-{id(conn)}"
    pg = engine.dialect.name == "postgresql"
    j = raw_jobs.c

    # Every statement is built once, with bound parameters: the least Python a loop can do.
    p_now, p_until, p_id = bindparam("p_now"), bindparam("p_until"), bindparam("p_id")
    ready = (
        select(j.id)
        .where(j.state == "queued", j.run_at <= p_now, j.queue == "default")
        .order_by(j.priority, j.run_at, j.id)
    )
    first = ready.with_only_columns(j.id, j.handler, j.payload).limit(1)
    claim_values = {
        "state": "claimed",
        "lease_owner": owner,
        "lease_expires_at": p_until,
        "started_at": p_now,
        "attempts": j.attempts + 1,
    }
    claim_one = update(raw_jobs).where(j.id == p_id, j.state == "queued").values(**claim_values)
    pick = ready.limit(batch or 1)
    if pg:
        pick = pick.with_for_update(skip_locked=True)
    claim_batch = (
        update(raw_jobs)
        .where(j.id.in_(pick.scalar_subquery()), j.state == "queued")
        .values(**claim_values)
        .returning(j.id, j.handler, j.payload)
    )
    finish = (
        update(raw_jobs)
        .where(
            j.id == p_id,
            j.state == "claimed",
            j.lease_owner == owner,
            j.lease_expires_at > p_now,
        )
        .values(state="succeeded", finished_at=p_now, lease_owner=None, lease_expires_at=None)
    )

    def complete(job_id: int) -> None:
        with conn.begin():
            done = conn.execute(finish, {"p_id": job_id, "p_now": _naive_now()})
            assert done.rowcount == 1

    def portable() -> int:
        handled = 0
        while True:
            now = _naive_now()
            with conn.begin():
                found = conn.execute(first, {"p_now": now}).first()
                if found is None:
                    break
                won = conn.execute(
                    claim_one, {"p_id": found.id, "p_now": now, "p_until": now + LEASE}
                ).rowcount
            if won != 1:
                continue  # another process got it first
            _bench.noop(json.loads(found.payload))
            complete(found.id)
            handled += 1
        return handled

    def batched() -> int:
        handled = 0
        while True:
            now = _naive_now()
            with conn.begin():
                claimed = conn.execute(claim_batch, {"p_now": now, "p_until": now + LEASE}).all()
            if not claimed:
                break
            assert len(claimed) <= batch, f"a claim of {batch} took {len(claimed)}"
            for found in claimed:
                _bench.noop(json.loads(found.payload))
                complete(found.id)
            handled += len(claimed)
        return handled

    def go() -> tuple[int, Counts]:
        counter.reset()
        handled = portable() if batch == 0 else batched()
        return handled, counter.reset()

    return go


def raw_enqueue(url: str, n: int) -> tuple[float, Counts]:
    engine = raw_engine(url)
    counter = Counter(engine)
    conn = engine.connect()
    conn.rollback()
    stmt = insert(raw_jobs)
    began, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        now = _naive_now()
        with conn.begin():
            conn.execute(stmt, raw_values(1, now)[0])
    elapsed = time.perf_counter() - began
    counts = counter.reset()
    counts.cpu = time.process_time() - cpu
    conn.close()
    engine.dispose()
    return elapsed, counts


#: A partial index in the claim's order, which scheduler_jobs does not have (MariaDB has no
#: partial indexes): shows what it would buy the raw loop.
READY_INDEX = (
    "CREATE INDEX ix_raw_jobs_ordered ON raw_jobs (queue, priority, run_at, id)"
    " WHERE state = 'queued'"
)


def raw_prepare(url: str, ready_index: bool = False) -> None:
    engine = raw_engine(url)
    raw_md.drop_all(engine)
    raw_md.create_all(engine)
    if ready_index:
        with engine.begin() as conn:
            conn.execute(text(READY_INDEX))
    engine.dispose()


def raw_fill(url: str, n: int) -> None:
    engine = raw_engine(url)
    now = _naive_now() - timedelta(seconds=1)
    with engine.begin() as conn:
        for start in range(0, n, CHUNK):
            conn.execute(insert(raw_jobs), raw_values(min(CHUNK, n - start), now))
    _analyze(engine, "raw_jobs")
    engine.dispose()


def raw_done(url: str) -> int:
    engine = raw_engine(url)
    with engine.connect() as conn:
        done = conn.execute(
            select(func.count()).select_from(raw_jobs).where(raw_jobs.c.state == "succeeded")
        ).scalar_one()
    engine.dispose()
    return int(done)


def _analyze(engine: Engine, table: str) -> None:
    with engine.connect() as conn:
        mysql = conn.dialect.name in ("mysql", "mariadb")
        conn.execute(text(f"ANALYZE {'TABLE ' if mysql else ''}{table}"))
        conn.commit()


# -- procrastinate ---------------------------------------------------------------------------------
async def _procrastinate_noop() -> None:
    """procrastinate's no-op task: async, its fastest path (a sync task goes to a thread)."""


def _procrastinate_app(conninfo: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    app.task(name=HANDLER)(_procrastinate_noop)
    return app


def _conninfo(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def procrastinate_drain_setup(
    url: str, _batch: int, _mode: str = ""
) -> Callable[[], tuple[int, Counts]]:
    """One worker per process, concurrency 1, ``wait=False``: it stops when the queue is empty."""
    app = _procrastinate_app(_conninfo(url))
    loop = asyncio.new_event_loop()
    loop.run_until_complete(app.open_async())

    def go() -> tuple[int, Counts]:
        loop.run_until_complete(
            app.run_worker_async(
                wait=False, concurrency=1, install_signal_handlers=False, listen_notify=False
            )
        )
        loop.run_until_complete(app.close_async())
        return 0, Counts()  # counted in the database afterwards

    return go


def procrastinate_enqueue(url: str, n: int) -> tuple[float, Counts]:
    app = _procrastinate_app(_conninfo(url))
    app.open()
    task = app.tasks[HANDLER]
    task.defer()  # first call opens the pool
    began, cpu = time.perf_counter(), time.process_time()
    for _ in range(n - 1):
        task.defer()
    scale = n / max(n - 1, 1)
    elapsed = (time.perf_counter() - began) * scale
    counts = Counts(cpu=(time.process_time() - cpu) * scale)
    app.close()
    return elapsed, counts


def procrastinate_prepare(url: str) -> None:
    app = _procrastinate_app(_conninfo(url))
    app.open()
    app.schema_manager.apply_schema()
    app.close()


def procrastinate_reset(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers,"
                " procrastinate_periodic_defers RESTART IDENTITY CASCADE"
            )
        )
    engine.dispose()


def procrastinate_fill(url: str, n: int) -> None:
    app = _procrastinate_app(_conninfo(url))
    app.open()
    task = app.tasks[HANDLER]
    for start in range(0, n, CHUNK):
        task.batch_defer(*({} for _ in range(min(CHUNK, n - start))))
    app.close()
    engine = create_engine(url)
    _analyze(engine, "procrastinate_jobs")
    engine.dispose()


def procrastinate_done(url: str) -> int:
    engine = create_engine(url)
    with engine.connect() as conn:
        done = conn.execute(
            text("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
        ).scalar_one()
    engine.dispose()
    return int(done)


# -- the run ---------------------------------------------------------------------------------------
@dataclass
class System:
    """One queue implementation on one database."""

    reset: Callable[[], None]
    fill: Callable[[int], None]
    done: Callable[[], int]
    drain_setup: Callable[..., Callable[[], tuple[int, Counts]]]
    url: str
    enqueue: Callable[[str, int], tuple[float, Counts]] | None = None


@dataclass
class Case:
    db: str
    op: str
    name: str
    procs: int
    batch: int | None
    system: str
    mode: str = ""
    seconds: list[float] = field(default_factory=list)
    counts: list[Counts] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str, int, int | None]:
        return (self.db, self.op, self.name, self.procs, self.batch)


def systems(args: Any, scratch: Path) -> dict[tuple[str, str], System]:
    found: dict[tuple[str, str], System] = {}
    if not args.no_sqlite:
        template = scratch / "template.db"
        app = Scheduler(f"sqlite:///{template}")
        app.migrate()
        app.close()
        ours_url = f"sqlite:///{scratch / 'ours.db'}"
        raw_url = f"sqlite:///{scratch / 'raw.db'}"

        def reset_ours_sqlite() -> None:
            for suffix in ("", "-wal", "-shm"):
                (scratch / f"ours.db{suffix}").unlink(missing_ok=True)
            shutil.copy(template, scratch / "ours.db")

        def reset_raw_sqlite() -> None:
            for suffix in ("", "-wal", "-shm"):
                (scratch / f"raw.db{suffix}").unlink(missing_ok=True)
            raw_prepare(raw_url, args.raw_ready_index)

        found["SQLite", "ours"] = System(
            reset_ours_sqlite,
            lambda n: ours_fill(ours_url, n),
            lambda: ours_done(ours_url),
            ours_drain_setup,
            ours_url,
            ours_enqueue,
        )
        found["SQLite", "raw"] = System(
            reset_raw_sqlite,
            lambda n: raw_fill(raw_url, n),
            lambda: raw_done(raw_url),
            raw_drain_setup,
            raw_url,
            raw_enqueue,
        )
    if not args.no_pg:
        ours_pg = _bench.recreate_pg_database(args.pg, "bench_scheduler" + args.db_suffix)
        Scheduler(ours_pg).migrate()
        raw_pg = _bench.recreate_pg_database(args.pg, "bench_raw" + args.db_suffix)
        raw_prepare(raw_pg, args.raw_ready_index)
        proc_pg = _bench.recreate_pg_database(args.pg, "bench_procrastinate" + args.db_suffix)
        if not args.ours_only:
            procrastinate_prepare(proc_pg)

        def truncate(url: str, tables: str) -> Callable[[], None]:
            def reset() -> None:
                engine = create_engine(url)
                with engine.begin() as conn:
                    conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY"))
                engine.dispose()

            return reset

        found["PostgreSQL", "ours"] = System(
            truncate(ours_pg, "scheduler_jobs, scheduler_runs"),
            lambda n: ours_fill(ours_pg, n),
            lambda: ours_done(ours_pg),
            ours_drain_setup,
            ours_pg,
            ours_enqueue,
        )
        found["PostgreSQL", "raw"] = System(
            truncate(raw_pg, "raw_jobs"),
            lambda n: raw_fill(raw_pg, n),
            lambda: raw_done(raw_pg),
            raw_drain_setup,
            raw_pg,
            raw_enqueue,
        )
        found["PostgreSQL", "procrastinate"] = System(
            lambda: procrastinate_reset(proc_pg),
            lambda n: procrastinate_fill(proc_pg, n),
            lambda: procrastinate_done(proc_pg),
            procrastinate_drain_setup,
            proc_pg,
            procrastinate_enqueue,
        )
    if args.mariadb:
        ours_maria = recreate_mariadb_database(args.mariadb)
        Scheduler(ours_maria).migrate()

        def truncate_maria() -> None:
            engine = create_engine(ours_maria)
            with engine.begin() as conn:
                conn.execute(text("TRUNCATE TABLE scheduler_runs"))
                conn.execute(text("TRUNCATE TABLE scheduler_jobs"))
            engine.dispose()

        found["MariaDB", "ours"] = System(
            truncate_maria,
            lambda n: ours_fill(ours_maria, n),
            lambda: ours_done(ours_maria),
            ours_drain_setup,
            ours_maria,
            ours_enqueue,
        )
    if args.ours_only:
        found = {key: value for key, value in found.items() if key[1] == "ours"}
    return found


def recreate_mariadb_database(url: str) -> str:
    """Drop and create the database ``url`` names (on a loopback server only); return ``url``."""
    parsed = make_url(url)
    if parsed.host not in ("127.0.0.1", "localhost", "::1") or not parsed.database:
        raise SystemExit(f"--mariadb: a database on a loopback server, not {url}")
    admin = create_engine(parsed.set(database="mysql"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{parsed.database}`"))
            conn.execute(text(f"CREATE DATABASE `{parsed.database}`"))
    finally:
        admin.dispose()
    return url


ENQUEUE_NAMES = {
    "ours": "ours: Scheduler.enqueue",
    "raw": "raw: INSERT, one per transaction",
    "procrastinate": "procrastinate: task.defer",
}


OURS_MODES = {
    "work": "ours: Scheduler.work()",
    "worker": "ours: worker, {b} threads",
    "run": "ours: Runner claim({b}) + run() each",
    "record": "ours: Runner claim({b}) + record(batch)",
}


def drain_name(system: str, db: str, batch: int, mode: str = "") -> str:
    if system == "ours":
        return OURS_MODES[mode].format(b=batch)
    if system == "procrastinate":
        return "procrastinate: run_worker"
    if batch == 0:
        return "raw: portable claim 1-by-1"
    how = "SKIP LOCKED" if db == "PostgreSQL" else "UPDATE..RETURNING"
    return f"raw: {how} batch {batch}"


def plan(found: dict[tuple[str, str], System], batches: list[int], modes: list[str]) -> list[Case]:
    cases: list[Case] = []
    for (db, system), _ in found.items():
        cases.append(Case(db, "enqueue", ENQUEUE_NAMES[system], 1, None, system))
    for db, procs_list in (("SQLite", (1,)), ("PostgreSQL", (1, 4)), ("MariaDB", (1, 4))):
        for procs in procs_list:
            if (db, "ours") in found:
                name = drain_name("ours", db, 0, "work")
                cases.append(Case(db, "drain", name, procs, 0, "ours", "work"))
                for b in batches:
                    for mode in modes:
                        name = drain_name("ours", db, b, mode)
                        cases.append(Case(db, "drain", name, procs, b, "ours", mode))
            if (db, "raw") in found:
                cases.append(Case(db, "drain", drain_name("raw", db, 0), procs, 0, "raw"))
                for b in sorted({1, 10, 100, *batches}):
                    cases.append(Case(db, "drain", drain_name("raw", db, b), procs, b, "raw"))
            if (db, "procrastinate") in found:
                name = drain_name("procrastinate", db, 1)
                cases.append(Case(db, "drain", name, procs, 1, "procrastinate"))
    return cases


def run_case(case: Case, sys_: System, n: int) -> None:
    sys_.reset()
    if case.op == "enqueue":
        assert sys_.enqueue is not None
        seconds, counts = sys_.enqueue(sys_.url, n)
    else:
        sys_.fill(n)
        seconds, handled, counts = _bench.run_processes(
            sys_.drain_setup, case.procs, (sys_.url, case.batch, case.mode)
        )
        done = sys_.done()
        if done != n:
            raise RuntimeError(
                f"{case.name} x{case.procs}: {done} of {n} jobs succeeded"
                f" ({handled} handled); the workers' stderr above may say why"
            )
    case.seconds.append(seconds)
    case.counts.append(counts)


def comparisons(case: Case, by_key: dict[tuple[Any, ...], Case]) -> str:
    """The ratios the targets in benchmarks/README.md are about (throughput: >1 is faster)."""

    def rate(c: Case | None) -> float:
        return float("nan") if c is None or not c.seconds else 1 / median(c.seconds)

    def vs(other_name: str, batch: int | None, label: str, target: str = "") -> str | None:
        other = by_key.get((case.db, case.op, other_name, case.procs, batch))
        if other is None or other is case:
            return None
        shown = _bench.ratio(rate(case), rate(other))
        return f"{shown} {label}" + (f" (target {target})" if target else "")

    parts: list[str | None] = []
    if case.system != "ours":
        return ""
    if case.op == "enqueue":
        parts.append(vs(ENQUEUE_NAMES["raw"], None, "raw"))
        parts.append(vs(ENQUEUE_NAMES["procrastinate"], None, "procrastinate"))
    elif case.db == "SQLite":
        target = ">=0.75x" if case.batch == 0 else ""
        parts.append(vs(drain_name("raw", case.db, 0), 0, "raw portable", target))
        if case.batch:
            parts.append(vs(drain_name("raw", case.db, case.batch), case.batch, "raw same batch"))
    else:
        b = case.batch or 1
        parts.append(
            vs(
                drain_name("raw", case.db, b),
                b,
                f"raw SKIP LOCKED b{b}",
                ">=0.5x" if case.procs == 4 else "",
            )
        )
        parts.append(
            vs(
                drain_name("procrastinate", case.db, 1),
                1,
                "procrastinate",
                ">=8x" if case.procs == 4 else "",
            )
        )
    return "; ".join(p for p in parts if p)


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2000, help="jobs per run (default 2000)")
    p.add_argument(
        "--batches",
        default="10",
        help="claim sizes of ours' Runner-batched rows, comma-separated (default 10);"
        " the raw loop always runs batches 1, 10, 100 and these",
    )
    p.add_argument(
        "--raw-ready-index",
        action="store_true",
        help="also give the raw table a partial index in the claim's order",
    )
    p.add_argument(
        "--mariadb",
        default=None,
        help="also measure ours on MariaDB/MySQL: the URL of a loopback database, dropped and"
        " created here (e.g. mysql+pymysql://root@127.0.0.1:3306/bench_scheduler)",
    )
    p.add_argument(
        "--db-suffix",
        default="",
        help="appended to the PostgreSQL databases' names (bench_scheduler...), so that two runs"
        " on one server do not drop each other's",
    )
    p.add_argument(
        "--ours-only",
        action="store_true",
        help="measure only ours (no raw loop, no procrastinate): a short run across engines",
    )
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    scratch = _bench.scratch_dir()
    found = systems(args, scratch)
    modes = ["worker", "record"]
    cases = plan(found, batches, modes)
    load_before = _bench.load()
    for rep in range(args.reps):
        for case in cases:
            progress(f"rep {rep + 1}/{args.reps}: {case.db} {case.op} {case.name} x{case.procs}")
            run_case(case, found[case.db, case.system], args.jobs)
    by_key = {c.key: c for c in cases}
    rows = []
    for case in cases:
        seconds = median(case.seconds)
        stmts, txns, checkouts, _ = case.counts[-1].per(args.jobs)
        cpu = median([c.per(args.jobs)[3] for c in case.counts])
        counted = case.system != "procrastinate"
        rows.append(
            [
                case.db,
                case.op,
                case.name,
                case.procs,
                fmt(seconds),
                fmt(args.jobs / seconds),
                fmt(cpu),
                fmt(stmts) if counted else "-",
                fmt(txns) if counted else "-",
                fmt(checkouts) if counted else "-",
                comparisons(case, by_key),
            ]
        )
    _bench.print_table(
        f"Queue throughput: {args.jobs:,} no-op jobs, median of {args.reps} runs"
        + (", raw table with the ordered ready index" if args.raw_ready_index else "")
        + f" ({_bench.machine()}; load average {load_before} before, {_bench.load()} after)",
        [
            "db",
            "op",
            "implementation",
            "procs",
            "median s",
            "jobs/s",
            "client CPU us/job",
            "SQL/job",
            "txn/job",
            "checkouts/job",
            "ours vs",
        ],
        rows,
    )
    if not args.no_pg:
        for name in ("bench_scheduler", "bench_raw", "bench_procrastinate"):
            _bench.drop_pg_database(args.pg, name + args.db_suffix)
    if args.mariadb:
        parsed = make_url(args.mariadb)
        admin = create_engine(parsed.set(database="mysql"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{parsed.database}`"))
        admin.dispose()


if __name__ == "__main__":
    main()
