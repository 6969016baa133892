"""What Prometheus metrics cost: queue throughput and tick time with metrics on and off (A/B).

Both modes run in the same process, in alternation (off, on, off, on ...), on fresh databases,
so that a slow spell of the machine lands on both. "On" is a real worker with ``[metrics]
port`` set, serving /metrics over HTTP, scraped once a second by a thread of this process
during the measurement (so the cached database gauges are read too); "off" is the same worker
with ``port = 0``.

- **drain**: ``Worker(app, concurrency=4).run(once=True)`` over N no-op jobs enqueued
  beforehand: jobs per second (the metrics hooks: one span-less context manager around each
  handler call, the outcome counter from ``job_succeeded``, the histograms).
- **tick**: the worker's tick over R rows, all due (``concurrent = true``, a settable clock
  moved a second per tick): milliseconds per tick (the hooks: the tick histogram, the
  decision counter, and the lateness histogram from each ``job_dispatched``).
- **idle tick**: the same rows, none due.

Wall-clock figures carry the machine's noise (a shared VM: see the load averages in the
title); the CPU rows (the process's CPU per job, the ticking thread's CPU per tick) much less.

Usage: ``benchmarks/.venv/bin/python benchmarks/metrics_overhead.py [--jobs 2000] [--rows 100]
[--reps 5] [--no-pg]``. PostgreSQL uses its own database ``bench_metrics_15``.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

from _bench import (
    drop_pg_database,
    load,
    machine,
    median,
    parser,
    print_table,
    progress,
    recreate_pg_database,
    scratch_dir,
)
from sqlalchemy import delete

from scheduler import Scheduler
from scheduler._config import MetricsSettings
from scheduler._model.handlers import Registry
from scheduler._model.rows import TaskSpec
from scheduler._store.tables import metadata
from scheduler._worker.worker import Worker

PG_DATABASE = "bench_metrics_15"


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


SCRAPE_EVERY = [1.0]  # seconds between scrapes (--scrape-every)


class Scraper:
    """Scrapes /metrics every ``--scrape-every`` seconds (default 1) while the measurement
    runs, and once at the end, so the folded events are in the measured CPU either way."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._scrape()

    def _scrape(self) -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics") as r:
                r.read()
            self.scrapes += 1
        except OSError:
            pass

    def _loop(self) -> None:
        while not self._stop.wait(SCRAPE_EVERY[0]):
            self._scrape()


def make_app(url: str, metrics: bool, clock: Clock | None = None, **kw: Any) -> Scheduler:
    registry = Registry()
    registry.handler("bench.noop", retry_safe=True)(lambda job: None)
    port = free_port() if metrics else 0
    return Scheduler(
        url,
        registry=registry,
        metrics=MetricsSettings(port=port, host="127.0.0.1"),
        clock=clock,
        **kw,
    )


def empty(app: Scheduler) -> None:
    with app.store.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(delete(table))


def close(app: Scheduler) -> None:
    found = getattr(app, "_metrics", None)
    if found is not None:
        found.close()  # disconnect its signal receivers
    app.close()


def drain(url: str, metrics: bool, jobs: int) -> tuple[float, float]:
    """Jobs per second of one worker round over ``jobs`` no-op jobs, and the process's CPU
    time per job in µs (every thread: the worker's, the HTTP server's and the scraper's)."""
    app = make_app(url, metrics)
    try:
        app.migrate()
        empty(app)
        for _ in range(jobs):
            app.enqueue("bench.noop", {})
        worker = Worker(app, concurrency=4)
        began, cpu = time.perf_counter(), time.process_time()
        with Scraper(app.metrics_settings.port) if metrics else _Nothing():  # its last scrape
            result = worker.run(once=True)  # folds every pending event: measured too
        took, cpu = time.perf_counter() - began, time.process_time() - cpu
        assert result.handled == jobs, result
        return jobs / took, cpu / jobs * 1e6
    finally:
        close(app)


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> None:
        return None


def ticks(url: str, metrics: bool, rows: int, count: int) -> dict[str, float]:
    """Medians of ``count`` ticks with every row due, then of idle ticks: wall-clock and
    CPU milliseconds of the ticking thread."""
    clock = Clock()
    tasks = [
        TaskSpec(f"t{i}", "* * * * * *", "bench.noop", {}, "UTC", concurrent=True)
        for i in range(rows)
    ]
    app = make_app(url, metrics, clock, tasks=tasks)
    try:
        app.migrate()
        empty(app)
        app.sync()
        worker = Worker(app, concurrency=0)
        worker._telemetry.open()
        found: dict[str, list[float]] = {"tick": [], "tick_cpu": [], "idle": [], "idle_cpu": []}

        def timed(name: str) -> None:
            began, cpu = time.perf_counter(), time.thread_time()
            worker._tick()
            found[name].append((time.perf_counter() - began) * 1000)
            found[f"{name}_cpu"].append((time.thread_time() - cpu) * 1000)

        try:
            with Scraper(app.metrics_settings.port) if metrics else _Nothing():
                for _ in range(count):
                    clock.now += timedelta(seconds=1)
                    timed("tick")
                    timed("idle")  # nothing due until the next second
        finally:
            worker._telemetry.close()
        return {name: median(values) for name, values in found.items()}
    finally:
        close(app)


def main() -> None:
    p = parser(__doc__.splitlines()[0], reps=5)
    p.add_argument("--jobs", type=int, default=2000, help="jobs per drain (default 2000)")
    p.add_argument("--rows", type=int, default=100, help="rows due per tick (default 100)")
    p.add_argument("--ticks", type=int, default=30, help="ticks per measurement (default 30)")
    p.add_argument("--scrape-every", type=float, default=1.0, help="seconds (default 1)")
    args = p.parse_args()
    SCRAPE_EVERY[0] = args.scrape_every
    scratch = scratch_dir()
    engines: list[tuple[str, Any]] = []
    if not args.no_sqlite:
        engines.append(("SQLite", lambda n: f"sqlite:///{scratch / f'm{n}.db'}"))
    if not args.no_pg:
        url = recreate_pg_database(args.pg, PG_DATABASE)
        engines.append(("PostgreSQL", lambda _n, url=url: url))
    figures: dict[tuple[str, str, bool], list[float]] = {}
    before = load()
    try:
        for engine, url_for in engines:
            for rep in range(args.reps):
                for metrics in (False, True) if rep % 2 == 0 else (True, False):
                    mode = "on" if metrics else "off"
                    progress(f"{engine} rep {rep + 1}/{args.reps} metrics {mode}")
                    url = url_for(f"{rep}{mode}")
                    rate, cpu = drain(url, metrics, args.jobs)
                    tick = ticks(url_for(f"{rep}{mode}t"), metrics, args.rows, args.ticks)
                    for name, value in {"drain": rate, "drain_cpu": cpu, **tick}.items():
                        figures.setdefault((engine, name, metrics), []).append(value)
    finally:
        if not args.no_pg:
            drop_pg_database(args.pg, PG_DATABASE)
    labels = {
        "drain": f"drain {args.jobs} jobs, 4 threads (jobs/s)",
        "drain_cpu": "drain: process CPU per job (µs)",
        "tick": f"tick, {args.rows} rows due (ms)",
        "tick_cpu": f"tick, {args.rows} rows due: CPU (ms)",
        "idle": f"idle tick, {args.rows} rows (ms)",
        "idle_cpu": f"idle tick, {args.rows} rows: CPU (ms)",
    }
    table = []
    for engine, _ in engines:
        for name, label in labels.items():
            off = median(figures[engine, name, False])
            on = median(figures[engine, name, True])
            # The cost of metrics, in %: slower throughput, or a longer tick.
            cost = (off / on - 1) * 100 if name == "drain" else (on / off - 1) * 100
            table.append([engine, label, f"{off:,.2f}", f"{on:,.2f}", f"{cost:+.1f} %"])
    print_table(
        f"Metrics off vs on (medians of {args.reps} alternating runs, a scrape every"
        f" {args.scrape_every:g} s; {machine()};"
        f" load average {before} before, {load()} after)",
        ["engine", "measure", "metrics off", "metrics on", "cost of metrics"],
        table,
    )


if __name__ == "__main__":
    sys.exit(main())
