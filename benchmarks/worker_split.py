"""How two workers on PostgreSQL share the jobs, and how long a job waits to start.

    benchmarks/.venv/bin/python benchmarks/worker_split.py [--seconds 15] [--concurrency 4]

Two real ``scheduler worker`` processes (the CLI, ``[worker] concurrency`` threads each) on one
PostgreSQL database (``bench_worker_split``, created and dropped here). This process feeds
them, phase after phase:

- ``trickle``: one job every 1/``--rate`` seconds (4 a second), short (5 ms) or long (300 ms);
- ``burst``: every 3 seconds a batch at once (one transaction), 40 short jobs or 16 of 500 ms;
  ``mixed``: 20 short and 4 of one second (short and long jobs have handlers of their own);
- ``short-then-long``: 40 short jobs, and once they are done 16 long ones (500 ms) at once,
  every 4 seconds (only the long ones are counted): the workers have just measured their
  jobs as short when the long ones come;
- ``scheduled``: 8 tasks whose cron fires every 2 seconds (``*/2`` in the seconds field), so
  the workers' own ticks dispatch the jobs: short (5 ms) or long (300 ms).

Each phase lasts ``--seconds``, then waits for its jobs to finish. For each phase it prints
each worker's share of the jobs (worker A is the one whose tick comes first in each
second: its offset on the tick grid is the smaller) and the latency from enqueue (a task's
job: from its slot) to the handler's start, read from the run history (``scheduler_runs``:
``started_at`` is when the handler was called, ``worker`` who ran it).
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import _bench
from _bench import fmt, progress
from sqlalchemy import func, insert, select

from scheduler import Scheduler, TaskSpec
from scheduler._store.jobs import new_job_values
from scheduler._store.tables import jobs, runs, workers
from scheduler._worker.worker import tick_offset

DATABASE = "bench_worker_split"
HELD_MS = 100  # a job claimed this long before its start waited for a thread of its worker
HANDLERS_MODULE = """
import time

from scheduler import default_registry


def work(job):
    time.sleep(job.payload.get("ms", 0) / 1000)


default_registry.handler("split.short", retry_safe=True)(work)
default_registry.handler("split.long", retry_safe=True)(work)
"""


def handler(ms: int) -> str:
    """Short jobs and long ones have handlers of their own, as in an application."""
    return "split.long" if ms >= 100 else "split.short"


@dataclass
class Phase:
    name: str
    feed: Callable[[Scheduler, float, str], None]  # (app, seconds, phase name)
    scheduled: bool = False


def trickle(ms: int, rate: float) -> Callable[[Scheduler, float, str], None]:
    def feed(app: Scheduler, seconds: float, phase: str) -> None:
        began = time.monotonic()
        n = 0
        while time.monotonic() - began < seconds:
            app.enqueue(handler(ms), {"ms": ms, "phase": phase})
            n += 1
            pause = began + n / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)

    return feed


def enqueue_burst(app: Scheduler, sizes: list[tuple[int, int]], phase: str) -> None:
    """`sizes`: (count, ms) per kind of job, all in one transaction."""
    now = app.clock()
    values = [
        new_job_values(
            handler=handler(ms),
            payload=json.dumps({"ms": ms, "phase": phase}),
            now=now,
            max_attempts=1,
        )
        for count, ms in sizes
        for _ in range(count)
    ]
    with app.store.begin() as conn:
        conn.execute(insert(jobs), values)


def bursts(sizes: list[tuple[int, int]], every: float = 3.0) -> Callable[..., None]:
    def feed(app: Scheduler, seconds: float, phase: str) -> None:
        began = time.monotonic()
        n = 0
        while time.monotonic() - began < seconds:
            enqueue_burst(app, sizes, phase)
            n += 1
            pause = began + n * every - time.monotonic()
            if pause > 0:
                time.sleep(pause)

    return feed


def switch(every: float = 4.0) -> Callable[[Scheduler, float, str], None]:
    """40 short jobs, then (once they are done) 16 long ones at once, every `every` s: the
    workers' measure of how long jobs take says "short" when the long ones arrive."""

    def feed(app: Scheduler, seconds: float, phase: str) -> None:
        began = time.monotonic()
        n = 0
        while time.monotonic() - began < seconds:
            enqueue_burst(app, [(40, 5)], f"{phase}.warm-up")
            deadline = time.monotonic() + 10
            while unfinished_of(app, f"{phase}.warm-up") and time.monotonic() < deadline:
                time.sleep(0.05)
            enqueue_burst(app, [(16, 500)], phase)
            n += 1
            pause = began + n * every - time.monotonic()
            if pause > 0:
                time.sleep(pause)

    return feed


def scheduled(ms: int, tasks: int = 8) -> Callable[[Scheduler, float, str], None]:
    def feed(app: Scheduler, seconds: float, phase: str) -> None:
        specs = [
            TaskSpec(f"{phase}-{i}", "* * * * * */2", handler(ms), {"ms": ms}, "UTC")
            for i in range(tasks)
        ]
        app.sync(specs)
        time.sleep(seconds)
        app.sync([])  # disables them: the rows stay, with their jobs' run history

    return feed


def write_config(scratch: Path, url: str, concurrency: int) -> Path:
    (scratch / "split_jobs.py").write_text(HANDLERS_MODULE)
    path = scratch / "app.toml"
    path.write_text(
        textwrap.dedent(
            f"""\
            [database]
            url = "{url}"

            [worker]
            imports = ["split_jobs"]
            concurrency = {concurrency}
            """
        )
    )
    return path


def start_workers(config: Path, count: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    script = Path(sys.executable).with_name("scheduler")
    command = [str(script), "--config", str(config), "--log-level", "warning", "worker"]
    procs = []
    for i in range(count):
        log = (logs / f"worker-{i}.log").open("wb")
        procs.append(subprocess.Popen(command, stdout=log, stderr=log, cwd=config.parent))
    return procs


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def phase_of(payload: object) -> str | None:
    """The ``phase`` of a job's payload as the table holds it (JSON text or decoded)."""
    value = json.loads(payload) if isinstance(payload, str | bytes) else payload
    found = value.get("phase") if isinstance(value, dict) else None
    return found if isinstance(found, str) else None


def unfinished_of(app: Scheduler, name: str) -> int:
    """Enqueued jobs of phase `name` not finished yet."""
    with app.store.read() as conn:
        rows = conn.execute(
            select(jobs.c.payload).where(jobs.c.state.in_(("queued", "claimed")))
        ).scalars()
        return sum(1 for p in rows if phase_of(p) == name)


def unfinished(app: Scheduler, phase: Phase) -> int:
    """Jobs of `phase` not finished yet (a task's: its rows' jobs still queued or claimed)."""
    if not phase.scheduled:
        return unfinished_of(app, phase.name)
    query = select(func.count()).select_from(jobs).where(jobs.c.state.in_(("queued", "claimed")))
    query = query.where(jobs.c.task_name.like(f"{phase.name}-%"))
    with app.store.read() as conn:
        return int(conn.execute(query).scalar_one())


@dataclass
class Result:
    jobs: int
    by_worker: Counter[str]
    latencies: list[float]  # seconds from enqueue (a task's job: its slot) to the start
    held: list[float]  # enqueued jobs: seconds from their claim to their start


def results(app: Scheduler, phases: list[Phase]) -> dict[str, Result]:
    query = select(
        runs.c.worker,
        runs.c.started_at,
        runs.c.slot,
        jobs.c.created_at,
        jobs.c.started_at,
        jobs.c.task_name,
        jobs.c.payload,
    ).join(jobs, jobs.c.id == runs.c.job_id)
    found: dict[str, Result] = defaultdict(lambda: Result(0, Counter(), [], []))
    names = [p.name for p in phases]
    with app.store.read() as conn:
        for worker, started, slot, created, claimed, task, payload in conn.execute(query):
            if task is not None:
                phase = task.rsplit("-", 1)[0]
                since = slot
            else:
                phase = phase_of(payload)
                since = created
            if phase not in names or started is None or since is None:
                continue
            result = found[phase]
            result.jobs += 1
            result.by_worker[worker] += 1
            result.latencies.append((started - since).total_seconds())
            if task is None and claimed is not None:  # a task's job: claimed anew each run
                result.held.append((started - claimed).total_seconds())
    return found


def wait_for_workers(app: Scheduler, count: int) -> None:
    """Until `count` workers have registered (their start-up done), then one tick more."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with app.store.read() as conn:
            if conn.execute(select(func.count()).select_from(workers)).scalar_one() >= count:
                time.sleep(1.0)
                return
        time.sleep(0.2)
    raise RuntimeError(f"{count} workers did not start within a minute")


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


PHASES = [
    Phase("trickle-short", trickle(5, 4.0)),
    Phase("trickle-long", trickle(300, 4.0)),
    Phase("burst-short", bursts([(40, 5)])),
    Phase("burst-long", bursts([(16, 500)])),
    Phase("burst-mixed", bursts([(20, 5), (4, 1000)])),
    Phase("short-then-long", switch()),
    Phase("scheduled-short", scheduled(5), scheduled=True),
    Phase("scheduled-long", scheduled(300), scheduled=True),
]


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=1)
    p.add_argument("--seconds", type=float, default=15.0, help="feeding time per phase")
    p.add_argument("--concurrency", type=int, default=4, help="[worker] concurrency of each")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--phases", default=",".join(ph.name for ph in PHASES), help="comma-separated subset"
    )
    p.add_argument("--keep-logs", action="store_true", help="print the workers' logs at exit")
    p.add_argument("--keep-db", action="store_true", help="leave the database for a look")
    args = p.parse_args()
    wanted = [ph for ph in PHASES if ph.name in args.phases.split(",")]
    load_before = _bench.load()
    url = _bench.recreate_pg_database(args.pg, DATABASE)
    scratch = _bench.scratch_dir()
    app = Scheduler(url)
    app.migrate()
    config = write_config(scratch, url, args.concurrency)
    procs = start_workers(config, args.workers, scratch)
    try:
        wait_for_workers(app, args.workers)
        for phase in wanted:
            progress(f"{phase.name}: feeding for {args.seconds:g} s")
            phase.feed(app, args.seconds, phase.name)
            deadline = time.monotonic() + 120
            while (left := unfinished(app, phase)) and time.monotonic() < deadline:
                time.sleep(0.5)
            if left:
                progress(f"{phase.name}: {left} job(s) still unfinished after 2 minutes")
            time.sleep(1.5)  # the last outcomes recorded, the workers idle again
        found = results(app, wanted)
    finally:
        stop_workers(procs)
        if args.keep_logs:
            for log in sorted(scratch.glob("worker-*.log")):
                sys.stderr.write(f"--- {log.name}\n{log.read_text()}")
    ran_by = sorted({w for r in found.values() for w in r.by_worker})
    interval = app.settings.tick_interval
    ran_by.sort(key=lambda w: tick_offset(w, interval))
    labels = {w: chr(ord("A") + i) for i, w in enumerate(ran_by)}
    app.close()
    if not args.keep_db:
        _bench.drop_pg_database(args.pg, DATABASE)

    rows = []
    for phase in wanted:
        r = found.get(phase.name, Result(0, Counter(), [], []))
        shares = " : ".join(str(r.by_worker.get(w, 0)) for w in ran_by)
        ms = [x * 1000 for x in r.latencies]
        held = [x * 1000 for x in r.held]
        rows.append(
            [
                phase.name,
                r.jobs,
                shares,
                fmt(statistics.median(ms)) if ms else "-",
                fmt(percentile(ms, 95)),
                fmt(max(ms)) if ms else "-",
                sum(1 for x in held if x >= HELD_MS) if held else "-",
                fmt(max(held)) if held else "-",
            ]
        )
    names = " : ".join(labels[w] for w in ran_by)
    _bench.print_table(
        f"Two workers on PostgreSQL ({args.concurrency} threads each, {args.seconds:g} s per"
        f" phase): jobs run by {names}, and the wait from enqueue (a task's job: its slot) to"
        f" the handler's start, in ms; held: jobs that waited {HELD_MS} ms or more between"
        " their claim and their start (in a worker's own queue), and the longest such wait",
        [
            "phase",
            "jobs",
            f"run by {names}",
            "wait p50",
            "wait p95",
            "wait max",
            "held",
            "held max",
        ],
        rows,
    )
    offsets = ", ".join(f"{labels[w]} +{tick_offset(w, interval) * 1000:.0f} ms" for w in ran_by)
    print(f"Tick offsets on the grid: {offsets}. Load average {load_before} before,")
    print(f"{_bench.load()} after. {_bench.machine()}, PostgreSQL {_bench.pg_version(args.pg)}.")


if __name__ == "__main__":
    main()
