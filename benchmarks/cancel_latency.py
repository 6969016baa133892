"""Cancel to stopped: how long a running job takes to end after ``app.cancel_job``.

    cd benchmarks && ../.venv/bin/python cancel_latency.py [--cancels 40] [--no-pg]

A real worker (``Worker`` on a thread of this process, concurrency 2, ``cancel_grace`` 0.5 s)
runs one job at a time; each is cancelled at a random moment 0.05-0.95 s into its attempt,
and the wall time is taken from the cancel's commit until the job is no longer ``claimed``
(read every 5 ms from another connection). Three handlers:

- ``thread, job.check()``: a sync handler that sleeps in 10 ms steps and calls ``job.check()``
  after each (it raises ``Cancelled`` once the worker has seen the cancel);
- ``async, await sleep``: an async handler in ``await asyncio.sleep`` (cancelled on the loop);
- ``process, busy loop``: ``isolation = "process"``, a pure-Python loop that never looks at its
  stop (its child is sent SIGTERM).

On SQLite (a file) and PostgreSQL (own database ``bench_cancel``). Prints p50, p99 and max per
engine and handler, and checks every cancelled job ended ``aborted`` with code ``cancelled``.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import _bench
from _bench import fmt, progress
from _isolation_jobs import checking, spin

from scheduler import Scheduler
from scheduler._config import WorkerSettings
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker


async def sleeping(job: Any) -> None:
    await asyncio.sleep(3600)


HANDLERS = {
    "thread, job.check()": ("bench.checking", checking, "thread"),
    "async, await sleep": ("bench.sleeping", sleeping, "thread"),
    "process, busy loop": ("bench.spin", spin, "process"),
}


def measure(url: str, cancels: int) -> dict[str, list[float]]:
    app = Scheduler(
        url,
        registry=Registry(),
        worker=WorkerSettings(concurrency=2, cancel_grace=0.5),
    )
    app.migrate()
    for name, func, isolation in HANDLERS.values():
        app.handler(name, isolation=isolation)(func)
    worker = Worker(app, serve_metrics=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert worker.started.wait(60)
    found: dict[str, list[float]] = {}
    rng = random.Random(7)
    try:
        for label, (name, _func, _isolation) in HANDLERS.items():
            progress(f"{label}: {cancels} cancels")
            for _ in range(cancels):
                job_id = app.enqueue(name)
                deadline = time.monotonic() + 30
                while app.get_job(job_id).state != "claimed":  # type: ignore[union-attr]
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{label}: job {job_id} never started")
                    time.sleep(0.005)
                time.sleep(rng.uniform(0.05, 0.95))
                app.cancel_job(job_id, reason="benchmark")
                asked = time.perf_counter()
                while (job := app.get_job(job_id)) is not None and job.state == "claimed":
                    if time.perf_counter() - asked > 30:
                        raise SystemExit(f"{label}: job {job_id} still running 30 s on")
                    time.sleep(0.005)
                took = time.perf_counter() - asked
                assert job is not None and (job.state, job.last_error_code) == (
                    "aborted",
                    "cancelled",
                ), (
                    label,
                    job,
                )
                found.setdefault(label, []).append(took)
    finally:
        worker.stop()
        thread.join(60)
        app.close()
    return found


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=1)
    p.add_argument("--cancels", type=int, default=40, help="cancels per handler and engine")
    args = p.parse_args()
    load_before = _bench.load()
    engines = []
    if not args.no_sqlite:
        engines.append(("SQLite", f"sqlite:///{_bench.scratch_dir() / 'cancel.db'}"))
    if not args.no_pg:
        engines.append(("PostgreSQL", _bench.recreate_pg_database(args.pg, "bench_cancel")))
    rows = []
    for engine, url in engines:
        progress(f"{engine}")
        for label, took in measure(url, args.cancels).items():
            rows.append(
                [
                    engine,
                    label,
                    fmt(quantile(took, 0.5)) + " s",
                    fmt(quantile(took, 0.99)) + " s",
                    fmt(max(took)) + " s",
                ]
            )
    if not args.no_pg:
        _bench.drop_pg_database(args.pg, "bench_cancel")
    _bench.print_table(
        f"Cancel to stopped, {args.cancels} cancels per case, cancel_grace 0.5 s"
        f" (load {load_before} before, {_bench.load()} after)",
        ["engine", "handler", "p50", "p99", "max"],
        rows,
    )
    print(_bench.machine())


if __name__ == "__main__":
    main()
