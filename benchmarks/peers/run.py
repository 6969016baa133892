"""Ours beside the Python peers on one PostgreSQL, in one run, rounds alternating.

    bash benchmarks/peers/setup.sh                       # benchmarks/peers/.venv
    benchmarks/peers/.venv/bin/python benchmarks/peers/run.py [--rounds 3]
    benchmarks/peers/.venv/bin/python benchmarks/peers/run.py --breakdown   # statements per job

Each system works in a database of its own on the server of ``--pg`` (``bench_peers_ours``,
``bench_peers_pgqueuer``, ``bench_peers_procrastinate``, ``bench_peers_raw``; created here,
dropped at the end), emptied before every measurement. Each is driven the way its own docs
show: ours by its worker with default settings (``Worker(app).run(once=True)``, what
``scheduler worker --once`` runs), pgqueuer by ``PgQueuer(AsyncpgDriver(...))`` and
``qm.run(mode=drain)`` at its default batch size, procrastinate by ``run_worker_async`` with its
defaults. Every measurement of a peer follows one of ours (the pair gives one ratio); the
1-minute load is recorded before each. Every drained job is checked to have run exactly once
(ours: its run history; the peers: the job ids their handlers saw), every enqueue counted.

The measurements (``--cases``):

- ``drain1``, ``drain4``: ``--jobs`` ready no-op jobs (bulk-inserted, not timed) drained by 1
  and by 4 worker processes, spawned and connected before the clock starts; jobs/s from the
  common start to the last process's end. procrastinate drains ``--procrastinate-jobs`` (it is
  ten times slower: its rate is the same over fewer jobs). ``raw`` beside them: the machine's
  own limit, a batched ``FOR UPDATE SKIP LOCKED`` pipeline in psycopg (claim 10 in one
  transaction, complete those 10 in another).
- ``enqueue``: ``--enqueue-jobs`` one-call enqueues in one process (jobs/s, client CPU).
- ``bulk``: ``--jobs`` jobs in one call (ours ``enqueue_many``, pgqueuer ``enqueue`` with lists,
  procrastinate ``batch_defer_async``).
- ``latency``: ``--samples`` single jobs enqueued 20-60 ms apart to an idle worker process;
  from the enqueue call to the handler's start, p50 and p99.

``--breakdown`` instead starts a PostgreSQL cluster of its own with ``pg_stat_statements`` and
counts, per drained and per enqueued job, the statements each system sends (``BEGIN`` and
``COMMIT`` included: each is a round trip) and the client CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: _bench

import _bench
from _bench import fmt, print_table, progress

HANDLER = "bench.noop"
PEERS = ("pgqueuer", "procrastinate")
CASES = ("drain1", "drain4", "enqueue", "bulk", "latency")
SPACING = (0.020, 0.060)
CHUNK = 5000
SUFFIX = os.environ.get("SCHEDULER_BENCH_SUFFIX", "")


def database(system: str) -> str:
    return f"bench_peers_{system}{SUFFIX}"


@dataclass
class Where:
    """The server, as a libpq URL (``postgresql://user@host:port/``) without a database."""

    server: str

    def libpq(self, system: str) -> str:
        return f"{self.server}/{database(system)}"

    def sqlalchemy(self, system: str) -> str:
        return self.libpq(system).replace("postgresql://", "postgresql+psycopg://", 1)


def _server(url: str) -> str:
    url = url.replace("postgresql+psycopg://", "postgresql://", 1)
    return url.rsplit("/", 1)[0]


def _admin(where: Where, statements: Sequence[str], db: str = "postgres") -> None:
    import psycopg

    with psycopg.connect(f"{where.server}/{db}", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def _query(where: Where, system: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(where.libpq(system), autocommit=True) as conn:
        return conn.execute(sql).fetchall()  # type: ignore[arg-type]


# -- ours ---------------------------------------------------------------------------------------
def _noop(*_args: Any) -> None:
    """The job body: nothing."""


def _ours_app(url: str, handler: Callable[..., Any] = _noop, **settings: Any) -> Any:
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry

    registry = Registry()
    registry.handler(HANDLER, retry_safe=True)(handler)
    return Scheduler(url, registry=registry, **settings)


def ours_prepare(where: Where) -> None:
    app = _ours_app(where.sqlalchemy("ours"))
    app.migrate()
    app.close()


def ours_reset(where: Where) -> None:
    _admin(where, ["TRUNCATE scheduler_jobs, scheduler_runs RESTART IDENTITY"], database("ours"))


def ours_fill(where: Where, n: int) -> None:
    app = _ours_app(where.sqlalchemy("ours"))
    for start in range(0, n, CHUNK):
        app.enqueue_many([{"handler": HANDLER}] * min(CHUNK, n - start))
    app.close()


def ours_drain_setup(url: str) -> Callable[[], list[int] | int]:
    from scheduler._worker.worker import Worker

    app = _ours_app(url)
    app.check_schema()
    with app.store.read():
        pass  # the first connection, before the clock starts
    return lambda: Worker(app).run(once=True).handled  # type: ignore[no-any-return]


def ours_check(where: Where, n: int) -> None:
    jobs = _query(
        where,
        "ours",
        "SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*) FROM scheduler_jobs",
    )[0]
    runs = _query(
        where,
        "ours",
        "SELECT count(*), count(DISTINCT job_id), count(*) FILTER (WHERE outcome = 'succeeded')"
        " FROM scheduler_runs",
    )[0]
    if jobs != (n, n) or runs != (n, n, n):
        raise RuntimeError(f"ours: jobs (succeeded, all) {jobs}, runs {runs}; expected {n} each")


def ours_enqueue(where: Where, n: int) -> float:
    app = _ours_app(where.sqlalchemy("ours"))
    app.enqueue(HANDLER, {})  # the first connection
    began = time.perf_counter()
    for _ in range(n - 1):
        app.enqueue(HANDLER, {})
    elapsed = time.perf_counter() - began
    app.close()
    return elapsed * n / (n - 1)


def ours_bulk(where: Where, n: int) -> float:
    app = _ours_app(where.sqlalchemy("ours"))
    app.check_schema()
    items = [{"handler": HANDLER, "payload": {}}] * n
    began = time.perf_counter()
    app.enqueue_many(items)
    elapsed = time.perf_counter() - began
    app.close()
    return elapsed


def ours_count(where: Where) -> int:
    return int(_query(where, "ours", "SELECT count(*) FROM scheduler_jobs")[0][0])


def _stamp_to(out: Path) -> Callable[[Any], None]:
    lock = threading.Lock()

    def stamp(job: Any) -> None:
        started = time.time()
        with lock, out.open("a") as file:
            file.write(f"{job.payload['i']} {started:.6f}\n")

    return stamp


def ours_latency_worker(url: str, out: str, ready: Any, stop: Any) -> None:
    from scheduler._worker.worker import Worker

    app = _ours_app(url, _stamp_to(Path(out)), clock="local")
    worker = Worker(app)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    worker.started.wait(30)
    time.sleep(1.0)  # the LISTEN connection under way
    ready.set()
    stop.wait()
    worker.stop()
    thread.join(60)
    app.close()


def ours_latency(where: Where, samples: int) -> list[float]:
    url = where.sqlalchemy("ours")
    app = _ours_app(url, clock="local")
    return _latency(
        ours_latency_worker, url, samples, lambda i: app.enqueue(HANDLER, {"i": i}), app.close
    )


# -- pgqueuer -------------------------------------------------------------------------------------
def _pgqueuer(dsn: str, seen: list[int] | None = None, out: Path | None = None) -> Any:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver

    async def make() -> Any:
        conn = await asyncpg.connect(dsn)
        pgq = PgQueuer(AsyncpgDriver(conn))
        lock = threading.Lock()

        @pgq.entrypoint(HANDLER)
        async def noop(job: Any) -> None:
            if out is not None:
                started = time.time()
                with lock, out.open("a") as file:
                    file.write(f"{int(job.payload.decode())} {started:.6f}\n")
            elif seen is not None:
                seen.append(int(job.id))

        return pgq, conn

    return make


def pgqueuer_prepare(where: Where) -> None:
    async def go() -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(where.libpq("pgqueuer"))
        await Queries(AsyncpgDriver(conn)).install()
        await conn.close()

    asyncio.run(go())


def pgqueuer_reset(where: Where) -> None:
    _admin(
        where,
        ["TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics RESTART IDENTITY"],
        database("pgqueuer"),
    )


async def _pgq_queries(dsn: str) -> tuple[Any, Any]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    return Queries(AsyncpgDriver(conn)), conn


def pgqueuer_fill(where: Where, n: int) -> None:
    async def go() -> None:
        queries, conn = await _pgq_queries(where.libpq("pgqueuer"))
        for start in range(0, n, CHUNK):
            size = min(CHUNK, n - start)
            await queries.enqueue([HANDLER] * size, [None] * size, [0] * size)
        await conn.close()

    asyncio.run(go())


def pgqueuer_drain_setup(dsn: str) -> Callable[[], list[int] | int]:
    from pgqueuer.types import QueueExecutionMode

    seen: list[int] = []
    loop = asyncio.new_event_loop()
    pgq, conn = loop.run_until_complete(_pgqueuer(dsn, seen)())

    def go() -> list[int]:
        loop.run_until_complete(pgq.qm.run(mode=QueueExecutionMode.drain))
        loop.run_until_complete(conn.close())
        return seen

    return go


def pgqueuer_enqueue(where: Where, n: int) -> float:
    async def go() -> float:
        queries, conn = await _pgq_queries(where.libpq("pgqueuer"))
        await queries.enqueue(HANDLER, None)
        began = time.perf_counter()
        for _ in range(n - 1):
            await queries.enqueue(HANDLER, None)
        elapsed = time.perf_counter() - began
        await conn.close()
        return elapsed * n / (n - 1)

    return asyncio.run(go())


def pgqueuer_bulk(where: Where, n: int) -> float:
    async def go() -> float:
        queries, conn = await _pgq_queries(where.libpq("pgqueuer"))
        began = time.perf_counter()
        await queries.enqueue([HANDLER] * n, [None] * n, [0] * n)
        elapsed = time.perf_counter() - began
        await conn.close()
        return elapsed

    return asyncio.run(go())


def pgqueuer_count(where: Where) -> int:
    return int(_query(where, "pgqueuer", "SELECT count(*) FROM pgqueuer")[0][0])


def pgqueuer_latency_worker(dsn: str, out: str, ready: Any, stop: Any) -> None:
    async def main() -> None:
        pgq, conn = await _pgqueuer(dsn, out=Path(out))()
        task = asyncio.create_task(pgq.qm.run())
        await asyncio.sleep(1.0)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        pgq.qm.shutdown.set()
        await asyncio.wait_for(task, 30)
        await conn.close()

    asyncio.run(main())


def pgqueuer_latency(where: Where, samples: int) -> list[float]:
    loop = asyncio.new_event_loop()
    queries, conn = loop.run_until_complete(_pgq_queries(where.libpq("pgqueuer")))

    def enqueue(i: int) -> None:
        loop.run_until_complete(queries.enqueue(HANDLER, str(i).encode()))

    def close() -> None:
        loop.run_until_complete(conn.close())
        loop.close()

    return _latency(pgqueuer_latency_worker, where.libpq("pgqueuer"), samples, enqueue, close)


# -- procrastinate --------------------------------------------------------------------------------
def _procrastinate(dsn: str, seen: list[int] | None = None, out: Path | None = None) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    lock = threading.Lock()

    async def noop(context: Any, i: int = 0) -> None:
        if out is not None:
            started = time.time()
            with lock, out.open("a") as file:
                file.write(f"{i} {started:.6f}\n")
        elif seen is not None:
            seen.append(int(context.job.id))

    app.task(name=HANDLER, pass_context=True)(noop)
    return app


def procrastinate_prepare(where: Where) -> None:
    app = _procrastinate(where.libpq("procrastinate"))
    with app.open():
        app.schema_manager.apply_schema()


def procrastinate_reset(where: Where) -> None:
    _admin(
        where,
        [
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers,"
            " procrastinate_periodic_defers RESTART IDENTITY CASCADE"
        ],
        database("procrastinate"),
    )


def procrastinate_fill(where: Where, n: int) -> None:
    app = _procrastinate(where.libpq("procrastinate"))
    with app.open():
        task = app.tasks[HANDLER]
        for start in range(0, n, CHUNK):
            task.batch_defer(*({} for _ in range(min(CHUNK, n - start))))


def procrastinate_drain_setup(dsn: str) -> Callable[[], list[int] | int]:
    seen: list[int] = []
    app = _procrastinate(dsn, seen)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(app.open_async())

    def go() -> list[int]:
        loop.run_until_complete(
            app.run_worker_async(wait=False, install_signal_handlers=False, listen_notify=False)
        )
        loop.run_until_complete(app.close_async())
        return seen

    return go


def procrastinate_enqueue(where: Where, n: int) -> float:
    app = _procrastinate(where.libpq("procrastinate"))

    async def go() -> float:
        async with app.open_async():
            task = app.tasks[HANDLER]
            await task.defer_async()
            began = time.perf_counter()
            for _ in range(n - 1):
                await task.defer_async()
            return (time.perf_counter() - began) * n / (n - 1)

    return asyncio.run(go())


def procrastinate_bulk(where: Where, n: int) -> float:
    app = _procrastinate(where.libpq("procrastinate"))

    async def go() -> float:
        async with app.open_async():
            task = app.tasks[HANDLER]
            items = [{} for _ in range(n)]
            began = time.perf_counter()
            await task.batch_defer_async(*items)
            return time.perf_counter() - began

    return asyncio.run(go())


def procrastinate_count(where: Where) -> int:
    return int(_query(where, "procrastinate", "SELECT count(*) FROM procrastinate_jobs")[0][0])


def procrastinate_latency_worker(dsn: str, out: str, ready: Any, stop: Any) -> None:
    app = _procrastinate(dsn, out=Path(out))

    async def main() -> None:
        async with app.open_async():
            task = asyncio.create_task(
                app.run_worker_async(wait=True, listen_notify=True, install_signal_handlers=False)
            )
            await asyncio.sleep(1.0)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.1)
            task.cancel()
            try:
                await task
            except BaseException:
                pass

    asyncio.run(main())


def procrastinate_latency(where: Where, samples: int) -> list[float]:
    app = _procrastinate(where.libpq("procrastinate"))
    app.open()
    task = app.tasks[HANDLER]
    return _latency(
        procrastinate_latency_worker,
        where.libpq("procrastinate"),
        samples,
        lambda i: task.defer(i=i),
        app.close,
    )


# -- the raw pipeline: the machine's own limit --------------------------------------------------
RAW_SCHEMA = """
CREATE TABLE raw_jobs (
    id bigserial PRIMARY KEY,
    queue text NOT NULL DEFAULT 'default',
    priority integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    state text NOT NULL DEFAULT 'queued',
    attempts integer NOT NULL DEFAULT 0,
    lease_owner text,
    lease_expires_at timestamptz,
    finished_at timestamptz,
    payload text NOT NULL DEFAULT '{}'
);
CREATE INDEX raw_jobs_ready ON raw_jobs (queue, priority, run_at, id) WHERE state = 'queued';
"""
RAW_CLAIM = """
UPDATE raw_jobs SET state = 'running', attempts = attempts + 1, lease_owner = %(owner)s,
       lease_expires_at = now() + interval '60 seconds'
 WHERE id IN (SELECT id FROM raw_jobs
               WHERE state = 'queued' AND queue = 'default' AND run_at <= now()
               ORDER BY priority, run_at, id LIMIT 10 FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
RAW_COMPLETE = """
UPDATE raw_jobs SET state = 'succeeded', finished_at = now(), lease_owner = NULL,
       lease_expires_at = NULL
 WHERE id = ANY(%(ids)s) AND state = 'running' AND lease_owner = %(owner)s
"""


def raw_prepare(where: Where) -> None:
    _admin(where, [RAW_SCHEMA], database("raw"))


def raw_reset(where: Where) -> None:
    _admin(where, ["TRUNCATE raw_jobs RESTART IDENTITY"], database("raw"))


def raw_fill(where: Where, n: int) -> None:
    _admin(
        where,
        [
            "INSERT INTO raw_jobs (run_at)"
            f" SELECT now() - interval '1 second' FROM generate_series(1, {n})"
        ],
        database("raw"),
    )


def raw_drain_setup(dsn: str) -> Callable[[], list[int] | int]:
    import psycopg

    conn = psycopg.connect(dsn)
    owner = f"raw-{os.getpid()}"

    def go() -> list[int]:
        seen: list[int] = []
        while True:
            with conn.transaction():
                claimed = conn.execute(RAW_CLAIM, {"owner": owner}).fetchall()
            if not claimed:
                break
            ids = []
            for job_id, payload in claimed:
                _noop(json.loads(payload))
                ids.append(job_id)
            with conn.transaction():
                done = conn.execute(RAW_COMPLETE, {"ids": ids, "owner": owner}).rowcount
            assert done == len(ids), (done, ids)
            seen.extend(ids)
        conn.close()
        return seen

    return go


# -- processes ----------------------------------------------------------------------------------
def _child(
    setup: Callable[[str], Callable[[], Any]], dsn: str, ready: Any, start: Any, results: Any
) -> None:
    try:
        go = setup(dsn)
        ready.put(None)
        start.wait()
        cpu = time.process_time()
        handled = go()
        results.put((handled, time.process_time() - cpu, time.monotonic(), None))
    except BaseException as exc:
        ready.put(None)
        results.put(([], 0.0, time.monotonic(), f"{type(exc).__name__}: {exc}"))


def drain(
    setup: Callable[[str], Callable[[], Any]], dsn: str, processes: int
) -> tuple[float, list[Any], float]:
    """Wall time from the common start to the last end, what each process handled, CPU."""
    procs, results, began = _bench.start_together(_child, (setup, dsn), processes, "worker")
    handled: list[Any] = []
    cpu, last, errors = 0.0, began, []
    for _ in procs:
        got, used, finished, error = results.get(timeout=3600)
        handled.append(got)
        cpu += used
        last = max(last, finished)
        if error:
            errors.append(error)
    for p in procs:
        p.join()
    if errors:
        raise RuntimeError("a worker process failed: " + "; ".join(errors))
    return last - began, handled, cpu


def check_ids(system: str, handled: list[Any], n: int) -> None:
    ids = [i for got in handled for i in got]
    if len(ids) != n or len(set(ids)) != n:
        raise RuntimeError(
            f"{system}: {len(ids)} runs of {len(set(ids))} jobs; expected {n} once each"
        )


def _latency(
    worker: Callable[..., None],
    dsn: str,
    samples: int,
    enqueue: Callable[[int], Any],
    close: Callable[[], Any],
) -> list[float]:
    """Milliseconds from each enqueue's call to its handler's start in an idle worker."""
    folder = Path(tempfile.mkdtemp(prefix="peers-bench-"))
    out = folder / "starts"
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=worker, args=(dsn, str(out), ready, stop))
    proc.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the worker process did not start")
        for i in range(-5, 0):  # warm-up: connections, statement caches
            enqueue(i)
        _wait_starts(out, 5)
        calls: dict[int, float] = {}
        for i in range(samples):
            time.sleep(random.uniform(*SPACING))
            calls[i] = time.time()
            enqueue(i)
        starts = _wait_starts(out, samples + 5)
    finally:
        stop.set()
        proc.join(60)
        if proc.is_alive():
            proc.kill()
        close()
        shutil.rmtree(folder, ignore_errors=True)
    return [(starts[i] - called) * 1000 for i, called in calls.items()]


def _wait_starts(out: Path, n: int, timeout: float = 120) -> dict[int, float]:
    deadline = time.monotonic() + timeout
    found: dict[int, float] = {}
    while time.monotonic() < deadline:
        found = {}
        if out.exists():
            for line in out.read_text().splitlines():
                key, started = line.split()
                if int(key) in found:
                    raise RuntimeError(f"job {key} started twice")
                found[int(key)] = float(started)
        if len(found) >= n:
            return found
        time.sleep(0.05)
    raise RuntimeError(f"only {len(found)} of {n} jobs started")


# -- the systems ----------------------------------------------------------------------------------
@dataclass
class System:
    name: str
    prepare: Callable[[Where], None]
    reset: Callable[[Where], None]
    fill: Callable[[Where, int], None]
    drain_setup: Callable[[str], Callable[[], Any]]
    enqueue: Callable[[Where, int], float] | None = None
    bulk: Callable[[Where, int], float] | None = None
    count: Callable[[Where], int] | None = None
    latency: Callable[[Where, int], list[float]] | None = None


SYSTEMS = {
    "ours": System(
        "ours",
        ours_prepare,
        ours_reset,
        ours_fill,
        ours_drain_setup,
        ours_enqueue,
        ours_bulk,
        ours_count,
        ours_latency,
    ),
    "pgqueuer": System(
        "pgqueuer",
        pgqueuer_prepare,
        pgqueuer_reset,
        pgqueuer_fill,
        pgqueuer_drain_setup,
        pgqueuer_enqueue,
        pgqueuer_bulk,
        pgqueuer_count,
        pgqueuer_latency,
    ),
    "procrastinate": System(
        "procrastinate",
        procrastinate_prepare,
        procrastinate_reset,
        procrastinate_fill,
        procrastinate_drain_setup,
        procrastinate_enqueue,
        procrastinate_bulk,
        procrastinate_count,
        procrastinate_latency,
    ),
    "raw": System("raw", raw_prepare, raw_reset, raw_fill, raw_drain_setup),
}


@dataclass
class Result:
    """One measurement: the figure (jobs/s, or latency p50 and p99 in ms), client CPU µs/job."""

    value: float
    cpu_us: float = float("nan")
    p99: float = float("nan")
    load: float = 0.0


def measure(where: Where, system: System, case: str, args: argparse.Namespace) -> Result:
    load = os.getloadavg()[0]
    if case in ("drain1", "drain4"):
        n = args.procrastinate_jobs if system.name == "procrastinate" else args.jobs
        system.reset(where)
        system.fill(where, n)
        _admin(where, ["ANALYZE"], database(system.name))
        procs = 1 if case == "drain1" else 4
        url = where.sqlalchemy("ours") if system.name == "ours" else where.libpq(system.name)
        elapsed, handled, cpu = drain(system.drain_setup, url, procs)
        if system.name == "ours":
            if sum(handled) != n:
                raise RuntimeError(f"ours: handled {sum(handled)} of {n}")
            ours_check(where, n)
        else:
            check_ids(system.name, handled, n)
        return Result(n / elapsed, cpu * 1e6 / n, load=load)
    if case in ("enqueue", "bulk"):
        n = args.enqueue_jobs if case == "enqueue" else args.jobs
        system.reset(where)
        run = system.enqueue if case == "enqueue" else system.bulk
        assert run is not None and system.count is not None
        cpu = time.process_time()
        elapsed = run(where, n)
        used = time.process_time() - cpu
        if system.count(where) != n:
            raise RuntimeError(f"{system.name}: {system.count(where)} jobs after {n} enqueues")
        return Result(n / elapsed, used * 1e6 / n, load=load)
    if case == "latency":
        system.reset(where)
        assert system.latency is not None
        found = system.latency(where, args.samples)
        return Result(_pct(found, 50), p99=_pct(found, 99), load=load)
    raise ValueError(case)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class Pairs:
    ours: list[Result] = field(default_factory=list)
    theirs: dict[str, list[Result]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)


LABELS = {
    "drain1": "drain {jobs} ready no-op jobs, 1 worker process (jobs/s)",
    "drain4": "the same, 4 worker processes (jobs/s)",
    "enqueue": "enqueue, one call per job (jobs/s)",
    "bulk": "bulk enqueue, {jobs} in one call (jobs/s)",
    "latency": "enqueue→start latency to an idle worker, p50 / p99 (ms)",
}


def _figure(results: list[Result], case: str) -> str:
    if not results:
        return "—"
    med = statistics.median(r.value for r in results)
    if case == "latency":
        return f"{med:.2f} / {statistics.median(r.p99 for r in results):.2f}"
    return fmt(med)


def _range(ratios: list[float]) -> str:
    if not ratios:
        return "—"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def report(
    pairs: dict[str, Pairs], peers: list[str], args: argparse.Namespace, loads: list[float]
) -> None:
    others = [*peers, *(["raw"] if "raw" in args.peers_all else [])]
    rows = []
    for case, got in pairs.items():
        label = LABELS[case].format(jobs=f"{args.jobs:,}")
        rows.append([label, *(_range(got.ratios.get(p, [])) for p in others)])
    print_table(
        f"Ours ÷ peer, median over the pairs (range); latency: p50 ratio, lower is better"
        f" ({_bench.machine()}; {args.rounds} rounds; 1-min load before the rounds"
        f" {min(loads):.1f}-{max(loads):.1f}, median {statistics.median(loads):.1f})",
        ["work", *(f"ours ÷ {p}" for p in others)],
        rows,
    )
    rows = []
    for case, got in pairs.items():
        label = LABELS[case].format(jobs=f"{args.jobs:,}")
        rows.append(
            [
                label,
                _figure(got.ours, case),
                *(_figure(got.theirs.get(p, []), case) for p in others),
            ]
        )
    print_table(
        "Medians",
        ["work", f"ours ({max(len(g.ours) for g in pairs.values())} runs)", *others],
        rows,
    )
    rows = []
    for case in ("drain1", "drain4", "enqueue", "bulk"):
        if case not in pairs:
            continue
        got = pairs[case]

        def cpu(results: list[Result]) -> str:
            return fmt(statistics.median(r.cpu_us for r in results)) if results else "—"

        rows.append([case, cpu(got.ours), *(cpu(got.theirs.get(p, [])) for p in others)])
    print_table("Client CPU µs per job (medians)", ["case", "ours", *others], rows)


def run(args: argparse.Namespace) -> None:
    cluster = None if args.pg else _bench.PgCluster()
    try:
        _run(args, Where(_server(args.pg or cluster.server)))  # type: ignore[union-attr]
    finally:
        if cluster is not None:
            cluster.close()


def _run(args: argparse.Namespace, where: Where) -> None:
    systems = ["ours", *args.peers, *(["raw"] if args.raw else [])]
    args.peers_all = systems
    _admin(where, [f"DROP DATABASE IF EXISTS {database(s)}" for s in systems])
    _admin(where, [f"CREATE DATABASE {database(s)}" for s in systems])
    try:
        for s in systems:
            SYSTEMS[s].prepare(where)
        pairs: dict[str, Pairs] = {case: Pairs() for case in args.cases}
        loads: list[float] = []
        for r in range(args.rounds):
            for case in args.cases:
                against = [*args.peers, *(["raw"] if args.raw and case.startswith("drain") else [])]
                for peer in against:
                    _wait_load(args.max_load)
                    ours = measure(where, SYSTEMS["ours"], case, args)
                    theirs = measure(where, SYSTEMS[peer], case, args)
                    loads += [ours.load, theirs.load]
                    got = pairs[case]
                    got.ours.append(ours)
                    got.theirs.setdefault(peer, []).append(theirs)
                    got.ratios.setdefault(peer, []).append(ours.value / theirs.value)
                    progress(
                        f"round {r + 1} {case}: ours {ours.value:,.1f} (load {ours.load:.1f})"
                        f" {peer} {theirs.value:,.1f} (load {theirs.load:.1f})"
                        f" = {ours.value / theirs.value:.2f}"
                    )
        report(pairs, args.peers, args, loads)
    finally:
        _admin(where, [f"DROP DATABASE IF EXISTS {database(s)}" for s in systems])


def _wait_load(limit: float | None, patience: float = 120) -> None:
    """Wait (at most ``patience`` seconds) for the 1-minute load to fall under ``limit``."""
    if limit is None:
        return
    deadline = time.monotonic() + patience
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(2)


# -- the breakdown: statements per job, on a cluster of our own -----------------------------------
def breakdown(args: argparse.Namespace) -> None:
    cluster = _bench.PgCluster(
        settings={
            "shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track": "top",
            "pg_stat_statements.track_utility": "on",
        }
    )
    where = Where(_server(cluster.server))
    systems = ["ours", *args.peers, *(["raw"] if args.raw else [])]
    try:
        _admin(where, [f"CREATE DATABASE {database(s)}" for s in systems])
        for s in systems:
            _admin(where, ["CREATE EXTENSION IF NOT EXISTS pg_stat_statements"], database(s))
            SYSTEMS[s].prepare(where)
        rows = []
        detail: dict[str, list[tuple[str, float]]] = {}
        for s in systems:
            system = SYSTEMS[s]
            n = args.jobs
            for case in ("drain1", "enqueue"):
                if case == "enqueue" and system.enqueue is None:
                    continue
                system.reset(where)
                if case == "drain1":
                    system.fill(where, n)
                    _admin(where, ["ANALYZE"], database(s))
                _admin(where, ["SELECT pg_stat_statements_reset()"], database(s))
                count = n if case == "drain1" else args.enqueue_jobs
                result = measure_no_reset(where, system, case, count)
                stats = _query(
                    where,
                    s,
                    "SELECT s.calls, s.total_exec_time, s.query FROM pg_stat_statements s"
                    f" JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{database(s)}'"
                    " AND s.query NOT LIKE '%pg_stat_statements%' ORDER BY s.calls DESC",
                )
                calls = sum(int(c) for c, _, _ in stats)
                server_ms = sum(float(t) for _, t, _ in stats)
                rows.append(
                    [
                        s,
                        case,
                        fmt(calls / count),
                        fmt(server_ms * 1000 / count),
                        fmt(result),
                    ]
                )
                detail[f"{s} {case}"] = [
                    (" ".join(str(q).split())[:110], int(c) / count) for c, _, q in stats[:8]
                ]
        print_table(
            f"Statements per job as the server counts them (pg_stat_statements, BEGIN/COMMIT"
            f" included: each a round trip), {args.jobs:,} jobs drained by 1 process and"
            f" {args.enqueue_jobs:,} one-call enqueues ({_bench.machine()})",
            ["system", "case", "statements/job", "server µs/job", "client CPU µs/job"],
            rows,
        )
        for key, statements in detail.items():
            print(f"\n{key}:")
            for text, per in statements:
                print(f"  {per:8.3f}  {text}")
    finally:
        cluster.close()


def measure_no_reset(where: Where, system: System, case: str, n: int) -> float:
    """Client CPU µs per job of one drain (1 process) or ``n`` enqueues, already prepared."""
    if case == "drain1":
        url = where.sqlalchemy("ours") if system.name == "ours" else where.libpq(system.name)
        _, handled, cpu = drain(system.drain_setup, url, 1)
        if system.name != "ours":
            check_ids(system.name, handled, n)
        return cpu * 1e6 / n
    assert system.enqueue is not None
    cpu = time.process_time()
    system.enqueue(where, n)
    return (time.process_time() - cpu) * 1e6 / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--pg",
        default=os.environ.get("SCHEDULER_BENCH_PG"),
        help="a server to work on (its role needs CREATEDB); default: a cluster started here",
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="rounds (each: ours then each peer, per case)"
    )
    p.add_argument("--jobs", type=int, default=20000, help="jobs per drain and per bulk enqueue")
    p.add_argument("--procrastinate-jobs", type=int, default=4000, help="jobs procrastinate drains")
    p.add_argument("--enqueue-jobs", type=int, default=2000, help="one-call enqueues per run")
    p.add_argument("--samples", type=int, default=200, help="latency samples per run")
    p.add_argument(
        "--peers", default=",".join(PEERS), help="comma-separated: pgqueuer,procrastinate"
    )
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ",".join(CASES))
    p.add_argument("--no-raw", dest="raw", action="store_false", help="leave the raw pipeline out")
    p.add_argument(
        "--max-load",
        type=float,
        default=None,
        help="wait (up to 2 min) for the load to fall under this before each pair",
    )
    p.add_argument(
        "--breakdown", action="store_true", help="statements per job on a cluster of our own"
    )
    args = p.parse_args()
    args.peers = [x for x in args.peers.split(",") if x]
    args.cases = [x for x in args.cases.split(",") if x]
    for peer in args.peers:
        if peer not in PEERS:
            p.error(f"--peers: {peer!r} is not one of {', '.join(PEERS)}")
    for case in args.cases:
        if case not in CASES:
            p.error(f"--cases: {case!r} is not one of {', '.join(CASES)}")
    if args.breakdown:
        breakdown(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
