"""Async handlers: N jobs that each ``await asyncio.sleep(0.1)`` on one worker's event loop
(``async_concurrency`` 100), beside the same jobs as sync handlers (``time.sleep(0.1)``) on 100
threads (``concurrency`` 100), in the same run.

    benchmarks/.venv/bin/python benchmarks/async_handlers.py [--jobs 10000] [--reps 1]

Each case enqueues the jobs, then starts one worker process (``Worker(app).run(once=True)``:
it ticks, runs every ready job, exits) and reads from it: wall time from the worker's start to
its last recorded job, its CPU time (user + system), and its RSS growth (``VmHWM``, the peak,
minus ``VmRSS`` before the first claim). The ideal wall time is jobs x 0.1 s / 100; the target
(issue 16) is at most 1.25 x the ideal for the async case (12.5 s at 10,000 jobs) with RSS
growth at most 30 MB. SQLite (a file in a temporary folder) and PostgreSQL (database
``bench_async``, created and dropped here) unless ``--no-sqlite`` / ``--no-pg``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bench
from _bench import fmt, median, progress
from sqlalchemy import insert

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.jobs import new_job_values
from scheduler._store.tables import jobs as job_table

SLEEP = 0.1
CONCURRENCY = 100
HANDLERS = {"async": "bench.async_sleep", "sync": "bench.sync_sleep"}


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(kind: str, url: str) -> None:
    """The worker process: run every ready job once, print the figures as JSON."""
    import asyncio

    from scheduler._worker.worker import Worker

    registry = Registry()
    if kind == "async":

        @registry.handler(HANDLERS["async"], retry_safe=True)
        async def sleep_async(job: Any) -> None:
            await asyncio.sleep(SLEEP)

        settings = {"concurrency": 1, "async_concurrency": CONCURRENCY}
    else:

        @registry.handler(HANDLERS["sync"], retry_safe=True)
        def sleep_sync(job: Any) -> None:
            time.sleep(SLEEP)

        settings = {"concurrency": CONCURRENCY}
    app = Scheduler(url, registry=registry, shutdown_grace_seconds=60, **settings)
    app.check_schema()
    rss_before = status_kib("VmRSS")
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    began = time.monotonic()
    result = Worker(app).run(once=True)
    wall = time.monotonic() - began
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    figures = {
        "handled": result.handled,
        "wall": wall,
        "cpu": cpu,
        "rss_before_kib": rss_before,
        "rss_peak_kib": status_kib("VmHWM"),
    }
    print(json.dumps(figures))
    app.close()


def enqueue(url: str, handler: str, count: int) -> None:
    app = Scheduler(url, registry=Registry())
    now = datetime.now(UTC)
    values = [
        new_job_values(handler=handler, payload="{}", now=now, max_attempts=3) for _ in range(count)
    ]
    with app.store.begin() as conn:
        for start in range(0, count, 2000):
            conn.execute(insert(job_table), values[start : start + 2000])
    app.close()


def fresh_database(backend: str, server: str, folder: Path, case: str) -> str:
    if backend == "sqlite":
        path = folder / f"{case}-{time.monotonic_ns()}.db"
        url = f"sqlite:///{path}"
    else:
        url = _bench.recreate_pg_database(server, "bench_async")
    Scheduler(url, registry=Registry()).migrate()
    return url


def run_case(backend: str, kind: str, jobs: int, server: str, folder: Path) -> dict[str, Any]:
    url = fresh_database(backend, server, folder, kind)
    enqueue(url, HANDLERS[kind], jobs)
    progress(f"{backend} {kind}: {jobs} jobs enqueued; worker starting (load {_bench.load()})")
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, url],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)},
    )
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if figures["handled"] != jobs:
        raise RuntimeError(f"{backend} {kind}: handled {figures['handled']} of {jobs} jobs")
    progress(f"{backend} {kind}: {figures['wall']:.2f}s wall, {figures['cpu']:.2f}s CPU")
    return figures


def main() -> None:
    p = _bench.parser(__doc__ or "", reps=1)
    p.add_argument("--jobs", type=int, default=10_000)
    args = p.parse_args()
    folder = _bench.scratch_dir()
    backends = [b for b, off in (("sqlite", args.no_sqlite), ("postgresql", args.no_pg)) if not off]
    ideal = args.jobs * SLEEP / CONCURRENCY
    rows = []
    loads = [_bench.load()]
    for backend in backends:
        for kind in ("async", "sync"):
            runs = [run_case(backend, kind, args.jobs, args.pg, folder) for _ in range(args.reps)]
            loads.append(_bench.load())
            wall = median([r["wall"] for r in runs])
            growth = median([(r["rss_peak_kib"] - r["rss_before_kib"]) / 1024 for r in runs])
            rows.append(
                [
                    backend,
                    "async def, async_concurrency 100"
                    if kind == "async"
                    else "def, concurrency 100 (threads)",
                    fmt(wall),
                    f"{ideal / wall:.0%}",
                    fmt(median([r["cpu"] for r in runs])),
                    fmt(growth),
                ]
            )
        if backend == "postgresql":
            _bench.drop_pg_database(args.pg, "bench_async")
    _bench.print_table(
        f"{args.jobs:,} jobs of 0.1 s sleep, one worker (median of {args.reps};"
        f" ideal {ideal:g} s; target async <= {ideal * 1.25:g} s, RSS growth <= 30 MB)",
        ["database", "handlers", "wall s", "of ideal", "worker CPU s", "RSS growth MB"],
        rows,
    )
    print(f"1-minute load average during the run: {', '.join(loads)}; {_bench.machine()}")
    print(f"checkout {_bench.source_version()}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
