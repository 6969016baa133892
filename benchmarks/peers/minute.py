"""A thousand every-minute tasks: from the minute's boundary to the last of them started, ours
beside pgqueuer, two scheduler processes each, rounds alternating.

    bash benchmarks/peers/setup.sh                  # benchmarks/peers/.venv
    benchmarks/peers/.venv/bin/python benchmarks/peers/minute.py [--tasks 1000] [--rounds 2]

Each round waits for the wall clock to pass a minute's boundary, gives the system a fresh
database, declares ``--tasks`` tasks of cron ``* * * * *`` and starts ``--processes`` processes
(each connected and running well before the next boundary ``B``); every task's body writes its
name and the time it started. The figure is the seconds from ``B`` to the last task's start
(and to the median start); every task must have started exactly once for ``B``.

- **ours**: ``TaskSpec(cron="* * * * *")`` rows put before the processes start, each process a
  worker with default settings (``Worker(app).run()``, what ``scheduler worker`` runs): its
  tick dispatches each due task as a job, the worker's threads start them (hold-back, rerun in
  place and the decision log as always).
- **pgqueuer**: ``@pgq.schedule(name, "* * * * *")`` for each task, ``pgq.run()`` in each
  process (its documented way): its scheduler picks the due schedules and runs their bodies in
  the process.

oban-py, the fastest peer at this (0.95 s for a thousand tasks, measured elsewhere), needs Python
3.12 and is not run here when the interpreter is older. The server is a cluster started here
(``--pg`` for another); databases ``bench_minute_<system>`` are created and dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: _bench

import _bench
from _bench import fmt, print_table, progress

SYSTEMS = ("ours", "pgqueuer")
SUFFIX = os.environ.get("SCHEDULER_BENCH_SUFFIX", "")


def database(system: str) -> str:
    return f"bench_minute_{system}{SUFFIX}"


def _libpq(server: str, system: str) -> str:
    return f"{server}/{database(system)}"


def _admin(server: str, statements: list[str]) -> None:
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def _writer(out: Path) -> Callable[[str], None]:
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock, out.open("a") as file:
            file.write(line + "\n")

    return write


# -- ours -----------------------------------------------------------------------------------------
def _ours_app(url: str, write: Callable[[str], None] | None = None) -> Any:
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry

    registry = Registry()

    @registry.handler("bench.stamp")
    def stamp(job: Any) -> None:
        started = time.time()
        if write is not None:
            write(f"{job.task_name} {job.slot.timestamp():.0f} {started:.6f}")

    return Scheduler(url, registry=registry)


def ours_prepare(server: str, tasks: int) -> None:
    from scheduler import TaskSpec

    url = _libpq(server, "ours").replace("postgresql://", "postgresql+psycopg://", 1)
    app = _ours_app(url)
    app.migrate()
    app.put_tasks(
        [TaskSpec(name=f"t{i:05d}", cron="* * * * *", handler="bench.stamp") for i in range(tasks)]
    )
    app.close()


def ours_process(server: str, _tasks: int, out: str, ready: Any, stop: Any) -> None:
    from scheduler._worker.worker import Worker

    url = _libpq(server, "ours").replace("postgresql://", "postgresql+psycopg://", 1)
    app = _ours_app(url, _writer(Path(out)))
    worker = Worker(app, serve_metrics=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    worker.started.wait(60)
    ready.set()
    stop.wait()
    worker.stop()
    thread.join(60)
    app.close()


# -- pgqueuer -------------------------------------------------------------------------------------
def pgqueuer_prepare(server: str, _tasks: int) -> None:
    async def go() -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(_libpq(server, "pgqueuer"))
        await Queries(AsyncpgDriver(conn)).install()
        await conn.close()

    asyncio.run(go())


def pgqueuer_process(server: str, tasks: int, out: str, ready: Any, stop: Any) -> None:
    write = _writer(Path(out))

    async def main() -> None:
        import asyncpg
        from pgqueuer import PgQueuer
        from pgqueuer.db import AsyncpgDriver

        conn = await asyncpg.connect(_libpq(server, "pgqueuer"))
        pgq = PgQueuer(AsyncpgDriver(conn))
        for i in range(tasks):
            name = f"t{i:05d}"

            async def stamp(schedule: Any, name: str = name) -> None:
                started = time.time()
                slot = schedule.next_run.timestamp() - 60  # returned after the move to the next
                write(f"{name} {slot:.0f} {started:.6f}")

            pgq.schedule(name, "* * * * *")(stamp)
        running = asyncio.create_task(pgq.run())
        await asyncio.sleep(2.0)  # its schedules inserted, its loops started
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        pgq.shutdown.set()
        await asyncio.wait_for(running, 60)
        await conn.close()

    asyncio.run(main())


PREPARE = {"ours": ours_prepare, "pgqueuer": pgqueuer_prepare}
PROCESS = {"ours": ours_process, "pgqueuer": pgqueuer_process}


# -- a round --------------------------------------------------------------------------------------
def _after_boundary(margin: float = 1.0) -> float:
    """Wait until the wall clock is ``margin`` seconds past a minute's boundary; return the
    next boundary (about a minute away)."""
    now = time.time()
    boundary = (now // 60) * 60
    if now - boundary > margin + 5:  # too late in this minute: wait for the next one
        time.sleep(boundary + 60 + margin - now)
        boundary += 60
    elif now - boundary < margin:
        time.sleep(boundary + margin - now)
    return boundary + 60


def one_round(server: str, system: str, tasks: int, processes: int) -> dict[str, float]:
    boundary = _after_boundary()
    load = os.getloadavg()[0]
    _admin(
        server,
        [
            f'DROP DATABASE IF EXISTS "{database(system)}" WITH (FORCE)',
            f'CREATE DATABASE "{database(system)}"',
        ],
    )
    PREPARE[system](server, tasks)
    folder = Path(tempfile.mkdtemp(prefix="minute-bench-"))
    out = folder / "starts"
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    readies = [ctx.Event() for _ in range(processes)]
    procs = [
        ctx.Process(target=PROCESS[system], args=(server, tasks, str(out), ready, stop))
        for ready in readies
    ]
    for p in procs:
        p.start()
    try:
        for ready in readies:
            if not ready.wait(120):
                raise RuntimeError(f"{system}: a process did not start")
        if time.time() > boundary - 5:
            raise RuntimeError(f"{system}: the processes were not ready 5 s before the boundary")
        deadline = boundary + 40
        while time.time() < deadline:
            time.sleep(0.5)
            if out.exists() and len(out.read_text().splitlines()) >= tasks:
                time.sleep(3.0)  # a second start of any task would show by now
                break
    finally:
        stop.set()
        for p in procs:
            p.join(90)
            if p.is_alive():
                p.kill()
    lines = [line.split() for line in out.read_text().splitlines()] if out.exists() else []
    ours = [(name, float(start)) for name, slot, start in lines if int(slot) == int(boundary)]
    if system == "ours":  # when the ticks' dispatches committed (with track_commit_timestamp)
        import psycopg

        with psycopg.connect(_libpq(server, "ours")) as conn:
            first, last = conn.execute(
                "SELECT min(pg_xact_commit_timestamp(xmin)), max(pg_xact_commit_timestamp(xmin))"
                " FROM scheduler_decisions"
            ).fetchone()  # type: ignore[misc]
        made = [t.timestamp() - boundary if t else float("nan") for t in (first, last)]
        progress(f"ours: jobs made {made[0]:.3f} .. {made[1]:.3f} s after the boundary")
    other = [line for line in lines if int(line[1]) != int(boundary)]
    counts = Counter(name for name, _ in ours)
    wanted = {f"t{i:05d}" for i in range(tasks)}
    if set(counts) != wanted or any(n != 1 for n in counts.values()) or other:
        twice = [n for n, c in counts.items() if c > 1]
        raise RuntimeError(
            f"{system}: {len(counts)} of {tasks} tasks started for the boundary, {len(twice)}"
            f" more than once, {len(other)} starts for another slot"
        )
    starts = sorted(start - boundary for _, start in ours)
    _admin(server, [f'DROP DATABASE IF EXISTS "{database(system)}" WITH (FORCE)'])
    return {
        "last": starts[-1],
        "median": statistics.median(starts),
        "first": starts[0],
        "load": load,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pg", help="a libpq server URL without database (postgresql://u@h:p)")
    p.add_argument("--tasks", type=int, default=1000)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    args = p.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    cluster = None
    if args.pg:
        server = args.pg.rstrip("/")
    else:
        cluster = _bench.PgCluster(settings={"track_commit_timestamp": "on"})
        server = cluster.server.replace("+psycopg", "", 1).rsplit("/", 1)[0]
    results: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    try:
        for r in range(args.rounds):
            for system in systems:
                got = one_round(server, system, args.tasks, args.processes)
                results[system].append(got)
                progress(
                    f"round {r + 1} {system}: last start {got['last']:.3f} s, median"
                    f" {got['median']:.3f} s after the boundary (load {got['load']:.1f})"
                )
    finally:
        if cluster is not None:
            cluster.close()
    rows = []
    for system in systems:
        got = results[system]
        rows.append(
            [
                system,
                fmt(statistics.median(g["last"] for g in got)),
                ", ".join(fmt(g["last"]) for g in got),
                fmt(statistics.median(g["median"] for g in got)),
                ", ".join(fmt(g["load"], 2) for g in got),
            ]
        )
    if "ours" in results and len(systems) > 1:
        for system in systems[1:]:
            pairs = zip(results["ours"], results[system], strict=True)
            ratios = [o["last"] / t["last"] for o, t in pairs]
            listed = ", ".join(fmt(x) for x in ratios)
            rows.append([f"ours ÷ {system}", fmt(statistics.median(ratios)), listed, "", ""])
    print_table(
        f"{args.tasks:,} every-minute tasks, {args.processes} processes: seconds from the"
        f" minute's boundary to the last task started ({_bench.machine()},"
        f" {datetime.now(UTC):%Y-%m-%d})",
        ["system", "last start (median)", "rounds", "median start (median)", "load before"],
        rows,
    )


if __name__ == "__main__":
    main()
