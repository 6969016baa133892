"""Wake-up latency: enqueue-to-start of single jobs to an idle worker in another process, ours
(PostgreSQL NOTIFY, PostgreSQL and MariaDB through a Redis broker, SQLite across processes,
and with wake-ups off) beside procrastinate on the same PostgreSQL; a cron slot's
dispatch-to-start (the tick in one process, the worker in another); an idle worker's cost.

    benchmarks/.venv/bin/python benchmarks/wakeup_latency.py [--samples 1000]
        [--mariadb mysql+pymysql://root@127.0.0.1:3306/bench_wakeup] [--cron-samples 300]

Each case starts a worker process (concurrency 4, the handler records when it started) and,
once it listens, enqueues ``--samples`` jobs from this process one at a time, at random
intervals of 20-60 ms (the worker is idle at each). Latency is measured from the enqueue's
return (its commit: the job cannot start before) to the handler's first line, both on this
host's wall clock; the column "from the call" adds the enqueue itself (its commit's fsync).
The databases (``bench_wakeup`` and ``bench_wakeup_procrastinate``, plus
``SCHEDULER_BENCH_SUFFIX``) are created and dropped here; redis-server is started on a free
port. Prints Markdown tables, with the load average beside them: on a shared machine
percentiles move with the load, so compare figures of one run.
"""

from __future__ import annotations

import multiprocessing
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bench
from _bench import Counter, fmt, progress
from sqlalchemy import create_engine, select, text

HANDLER = "bench.stamp"
SPACING = (0.020, 0.060)  # seconds between two enqueues (uniform)


# -- our worker, in a process of its own -----------------------------------------------------------
def _stamp_to(out: Path) -> Callable[[Any], None]:
    lock = threading.Lock()

    def stamp(job: Any) -> None:
        started = time.time()
        with lock, out.open("a") as file:
            file.write(f"{job.payload.get('i', job.id)} {started:.6f} {job.id}\n")

    return stamp


def ours_worker(
    url: str, out: str, broker: str | None, wakeups: bool, tick: float, ready: Any, stop: Any
) -> None:
    """A worker (concurrency 4; ``tick``: its tick interval) until ``stop`` is set."""
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry
    from scheduler._worker.worker import Worker

    registry = Registry()
    registry.handler(HANDLER, retry_safe=True)(_stamp_to(Path(out)))
    concurrency = 0 if out == "" else 4
    app = Scheduler(
        url,
        registry=registry,
        broker_url=broker,
        wakeups=wakeups,
        clock="local",
        concurrency=concurrency,
        tick_interval=tick,
    )
    worker = Worker(app)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while wakeups and concurrency and worker._listening is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(1.0)  # the LISTEN connection, the broker's BLPOP, the watcher: all under way
    ready.set()
    stop.wait()
    worker.stop()
    thread.join(60)
    app.close()


def start_process(target: Callable[..., None], *args: Any) -> tuple[Any, Any]:
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=target, args=(*args, ready, stop))
    proc.start()
    if not ready.wait(120):
        proc.kill()
        raise RuntimeError("the worker process did not start")
    return proc, stop


def stop_process(proc: Any, stop: Any) -> None:
    stop.set()
    proc.join(60)
    if proc.is_alive():
        proc.kill()


def read_starts(out: Path) -> dict[int, float]:
    found: dict[int, float] = {}
    if out.exists():
        for line in out.read_text().splitlines():
            key, started, *_ = line.split()
            found.setdefault(int(key), float(started))
    return found


def wait_all(out: Path, n: int, timeout: float = 120) -> dict[int, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = read_starts(out)
        if len(found) >= n:
            return found
        time.sleep(0.05)
    raise RuntimeError(f"only {len(read_starts(out))} of {n} jobs started")


Samples = list[tuple[float, float]]  # (from the enqueue's return, from its call), seconds


def ours_latency(
    url: str, samples: int, *, broker: str | None = None, wakeups: bool = True
) -> Samples:
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry

    folder = Path(tempfile.mkdtemp(prefix="wakeup-bench-"))
    out = folder / "starts"
    proc, stop = start_process(ours_worker, url, str(out), broker, wakeups, 1.0)
    app = Scheduler(url, registry=Registry(), broker_url=broker, wakeups=wakeups, clock="local")
    try:
        for i in range(-5, 0):  # warm-up: connections, statement caches
            app.enqueue(HANDLER, {"i": i})
        wait_all(out, 5)
        calls: dict[int, tuple[float, float]] = {}
        for i in range(samples):
            time.sleep(random.uniform(*SPACING))
            called = time.time()
            app.enqueue(HANDLER, {"i": i})
            calls[i] = (called, time.time())
        starts = wait_all(out, samples + 5)
    finally:
        stop_process(proc, stop)
        app.close()
        shutil.rmtree(folder, ignore_errors=True)
    return [(starts[i] - back, starts[i] - called) for i, (called, back) in calls.items()]


# -- procrastinate ---------------------------------------------------------------------------------
def _procrastinate_app(conninfo: str, out: Path | None) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    lock = threading.Lock()

    async def stamp(i: int) -> None:
        started = time.time()
        if out is not None:
            with lock, out.open("a") as file:
                file.write(f"{i} {started:.6f}\n")

    app.task(name=HANDLER)(stamp)
    return app


def procrastinate_worker(conninfo: str, out: str, ready: Any, stop: Any) -> None:
    import asyncio

    app = _procrastinate_app(conninfo, Path(out))

    async def main() -> None:
        async with app.open_async():
            task = asyncio.create_task(
                app.run_worker_async(
                    concurrency=4, wait=True, listen_notify=True, install_signal_handlers=False
                )
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


def procrastinate_latency(url: str, samples: int) -> Samples:
    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    folder = Path(tempfile.mkdtemp(prefix="wakeup-bench-"))
    out = folder / "starts"
    setup = _procrastinate_app(conninfo, None)
    with setup.open():
        setup.schema_manager.apply_schema()
    proc, stop = start_process(procrastinate_worker, conninfo, str(out))
    app = _procrastinate_app(conninfo, None)
    try:
        with app.open():
            task = app.tasks[HANDLER]
            for i in range(-5, 0):
                task.defer(i=i)
            wait_all(out, 5)
            calls: dict[int, tuple[float, float]] = {}
            for i in range(samples):
                time.sleep(random.uniform(*SPACING))
                called = time.time()
                task.defer(i=i)
                calls[i] = (called, time.time())
            starts = wait_all(out, samples + 5)
    finally:
        stop_process(proc, stop)
        shutil.rmtree(folder, ignore_errors=True)
    return [(starts[i] - back, starts[i] - called) for i, (called, back) in calls.items()]


# -- a cron slot: the tick in one process, the worker in another -----------------------------------
def cron_latency(url: str, samples: int, tasks: int = 10) -> list[float]:
    """``tasks`` tasks every second, each with a jitter of up to a second (so that their slots
    spread over it), ticked every 0.1 s by a process that runs no jobs (concurrency 0); a
    worker process, whose own tick is hourly, runs them. Dispatch-to-start: the job's
    ``created_at`` (the instant the tick began, before its due query and the dispatch's
    commit) to its handler's first line."""
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry
    from scheduler._model.rows import TaskSpec
    from scheduler._store.tables import jobs

    folder = Path(tempfile.mkdtemp(prefix="wakeup-bench-"))
    out = folder / "starts"
    app = Scheduler(url, registry=Registry(), clock="local")
    specs = [
        TaskSpec(name=f"every-second-{n}", cron="* * * * * *", handler=HANDLER, jitter=1)
        for n in range(tasks)
    ]
    with app.store.begin() as conn:
        conn.execute(text("DELETE FROM scheduler_jobs"))
    worker, worker_stop = start_process(ours_worker, url, str(out), None, True, 3600.0)
    app.sync(specs)
    ticker, ticker_stop = start_process(ours_worker, url, "", None, True, 0.1)
    # The slots that passed while the ticker started are dispatched together at its first
    # tick (a burst, not single jobs): only the jobs dispatched a second after it are counted.
    counted_from = time.time() + 1.0
    warm = len(read_starts(out))
    try:
        wait_all(out, warm + samples, timeout=samples / tasks * 3 + 60)
        time.sleep(1.0)
        starts = read_starts(out)
    finally:
        stop_process(ticker, ticker_stop)
        stop_process(worker, worker_stop)
        app.sync([])
        shutil.rmtree(folder, ignore_errors=True)
    with app.store.read() as conn:
        created = dict(conn.execute(select(jobs.c.id, jobs.c.created_at)).all())
    app.close()
    return [
        started - created[job_id].timestamp()
        for job_id, started in starts.items()
        if created[job_id].timestamp() >= counted_from
    ][:samples]


# -- an idle worker's cost -------------------------------------------------------------------------
def idle_cost(url: str, wakeups: bool, broker: str | None, seconds: float) -> tuple[float, float]:
    """(SQL statements per second, CPU seconds per second) of an idle worker in this process:
    the engine's statements, and the LISTEN connection's two (counted once per connection)."""
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry
    from scheduler._worker.worker import Worker

    app = Scheduler(url, registry=Registry(), broker_url=broker, wakeups=wakeups, clock="local")
    counter = Counter(app.store.engine)
    worker = Worker(app)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    time.sleep(3)  # start-up, the first ticks and polls
    counter.reset()
    cpu, began = time.process_time(), time.monotonic()
    time.sleep(seconds)
    counts = counter.reset()
    took = time.monotonic() - began
    used = time.process_time() - cpu
    worker.stop()
    thread.join(30)
    app.close()
    return counts.statements / took, used / took


# -- servers ---------------------------------------------------------------------------------------
def start_redis() -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    return proc, f"redis://127.0.0.1:{port}/0"


def fsync_floor(url: str, n: int = 200) -> float:
    """The median of a one-row INSERT and its COMMIT on a fresh connection's table: the
    commit's fsync, which every enqueue and every claim waits for."""
    engine = create_engine(url)
    times = []
    with engine.connect() as conn:
        conn.execute(text("CREATE TEMPORARY TABLE fsync_probe (x integer)"))
        conn.commit()
        conn.execute(text("CREATE TABLE IF NOT EXISTS fsync_probe_kept (x integer)"))
        conn.commit()
        for _ in range(n):
            began = time.perf_counter()
            conn.execute(text("INSERT INTO fsync_probe_kept VALUES (1)"))
            conn.commit()
            times.append(time.perf_counter() - began)
        conn.execute(text("DROP TABLE fsync_probe_kept"))
        conn.commit()
    engine.dispose()
    return _bench.median(times)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def ms(value: float) -> str:
    return fmt(value * 1000)


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=1)
    p.add_argument("--samples", type=int, default=1000, help="jobs per case (default 1000)")
    p.add_argument("--cron-samples", type=int, default=300, help="cron jobs (default 300)")
    p.add_argument("--mariadb", default=None, help="a loopback MariaDB database URL (dropped)")
    p.add_argument("--no-procrastinate", action="store_true")
    p.add_argument("--no-off", action="store_true", help="skip ours with wake-ups off")
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--only", default="", help="comma-separated case names to run")
    args = p.parse_args()
    from scheduler import Scheduler

    redis_proc, redis_url = start_redis()
    scratch = _bench.scratch_dir()
    urls: dict[str, str] = {}
    if not args.no_pg:
        urls["PostgreSQL"] = _bench.recreate_pg_database(args.pg, "bench_wakeup")
        Scheduler(urls["PostgreSQL"]).migrate()
    if args.mariadb:
        from queue_throughput import recreate_mariadb_database

        urls["MariaDB"] = recreate_mariadb_database(args.mariadb)
        Scheduler(urls["MariaDB"]).migrate()
    if not args.no_sqlite:
        urls["SQLite"] = f"sqlite:///{scratch / 'wakeup.db'}"
        Scheduler(urls["SQLite"]).migrate()
    cases: list[tuple[str, str, Callable[[], Samples]]] = []
    if "PostgreSQL" in urls:
        pg = urls["PostgreSQL"]
        cases.append(("pg", "PostgreSQL, NOTIFY", lambda: ours_latency(pg, args.samples)))
        cases.append(
            (
                "pg-broker",
                "PostgreSQL, Redis broker",
                lambda: ours_latency(pg, args.samples, broker=redis_url),
            )
        )
        if not args.no_procrastinate:
            proc_url = _bench.recreate_pg_database(args.pg, "bench_wakeup_procrastinate")
            cases.append(
                (
                    "procrastinate",
                    "procrastinate (PostgreSQL, LISTEN/NOTIFY)",
                    lambda: procrastinate_latency(proc_url, args.samples),
                )
            )
        if not args.no_off:
            cases.append(
                (
                    "pg-off",
                    "PostgreSQL, wake-ups off (poll)",
                    lambda: ours_latency(pg, args.samples, wakeups=False),
                )
            )
    if "MariaDB" in urls:
        maria = urls["MariaDB"]
        cases.append(
            (
                "mariadb-broker",
                "MariaDB, Redis broker",
                lambda: ours_latency(maria, args.samples, broker=redis_url),
            )
        )
    if "SQLite" in urls:
        lite = urls["SQLite"]
        cases.append(
            ("sqlite", "SQLite, across processes", lambda: ours_latency(lite, args.samples))
        )
    only = {name for name in args.only.split(",") if name}
    rows = []
    try:
        for key, name, measure in cases:
            if only and key not in only:
                continue
            progress(f"{name}: {args.samples} jobs")
            load = _bench.load()
            found = measure()
            back = [s[0] for s in found]
            call = [s[1] for s in found]
            rows.append(
                [
                    name,
                    ms(pct(back, 50)),
                    ms(pct(back, 90)),
                    ms(pct(back, 99)),
                    ms(max(back)),
                    ms(pct(call, 50)),
                    ms(pct(call, 99)),
                    load,
                ]
            )
        floor = {db: fsync_floor(url) for db, url in urls.items() if db == "PostgreSQL"}
        _bench.print_table(
            f"Enqueue-to-start latency, ms, {args.samples} single jobs to an idle worker process"
            ' (from the enqueue\'s return; "call": from its call)',
            ["case", "p50", "p90", "p99", "max", "call p50", "call p99", "load"],
            rows,
        )
        if floor:
            print(
                f"PostgreSQL INSERT + COMMIT (the fsync every claim waits for): median"
                f" {ms(floor['PostgreSQL'])} ms\n"
            )
        if "PostgreSQL" in urls and (not only or "cron" in only):
            progress(f"cron: {args.cron_samples} slots")
            load = _bench.load()
            found_cron = cron_latency(urls["PostgreSQL"], args.cron_samples)
            _bench.print_table(
                "A cron slot's dispatch-to-start, ms (tick in one process, worker in another,"
                " PostgreSQL)",
                ["jobs", "p50", "p90", "p99", "max", "load"],
                [
                    [
                        len(found_cron),
                        ms(pct(found_cron, 50)),
                        ms(pct(found_cron, 90)),
                        ms(pct(found_cron, 99)),
                        ms(max(found_cron)),
                        load,
                    ]
                ],
            )
        if not only or "idle" in only:
            idle_rows = []
            for db, url in urls.items():
                broker = redis_url if db == "MariaDB" else None
                for on in (False, True):
                    progress(f"idle: {db}, wake-ups {'on' if on else 'off'}")
                    statements, cpu = idle_cost(url, on, broker, args.idle_seconds)
                    how = ("broker" if broker else "on") if on else "off"
                    idle_rows.append([db, how, fmt(statements), f"{cpu * 100:.2f} %"])
            _bench.print_table(
                "An idle worker's cost per POLL_SECONDS (1 s): SQL statements, CPU of its process"
                " (+2 statements per LISTEN connection, once)",
                ["database", "wake-ups", "statements/s", "CPU"],
                idle_rows,
            )
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
        if "MariaDB" in urls:
            maria_admin = create_engine(urls["MariaDB"])
            with maria_admin.begin() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS `{maria_admin.url.database}`"))
            maria_admin.dispose()
        if not args.no_pg:
            _bench.drop_pg_database(args.pg, "bench_wakeup")
            if not args.no_procrastinate:
                _bench.drop_pg_database(args.pg, "bench_wakeup_procrastinate")
    print(_bench.machine())
    print(
        f"load average (1 min) at the end: {_bench.load()}; finished {datetime.now(UTC):%F %T} UTC"
    )


if __name__ == "__main__":
    main()
