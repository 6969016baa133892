"""Process isolation: 4 CPU-bound jobs on a 2-core machine, thread against process, wall time.

    cd benchmarks && ../.venv/bin/python isolation.py [--reps 3] [--n 20000000]

A real worker (``Worker``, concurrency 4, SQLite file) runs 4 jobs of a pure-Python loop. On
threads they share one GIL: about 4x one job's time. With ``isolation = "process"`` each runs
in its own spawned child: about 2x one job's time on 2 cores (4 on 2), plus the spawn of each
child. Prints the median wall time from the enqueue to the last job's end per case, and one
job alone on a thread (the unit).
"""

from __future__ import annotations

import threading
import time

import _bench
from _bench import fmt, median, progress
from _isolation_jobs import cpu

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker

JOBS = 4


def run(isolation: str, jobs: int, n: int, path: str) -> float:
    """Seconds from enqueuing ``jobs`` jobs to the last one's end, on a fresh worker."""
    app = Scheduler(f"sqlite:///{path}", registry=Registry(), concurrency=JOBS)
    app.migrate()
    app.handler("bench.cpu", isolation=isolation)(cpu)
    worker = Worker(app, serve_metrics=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert worker.started.wait(30)
    began = time.perf_counter()
    ids = [app.enqueue("bench.cpu", {"n": n}) for _ in range(jobs)]
    while True:
        states = {app.get_job(i).state for i in ids}  # type: ignore[union-attr]
        if states == {"succeeded"}:
            break
        if "aborted" in states:
            raise SystemExit(f"a job aborted: {states}")
        time.sleep(0.01)
    took = time.perf_counter() - began
    worker.stop()
    thread.join(60)
    app.close()
    return took


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=3)
    p.add_argument("--n", type=int, default=20_000_000, help="loop rounds per job")
    args = p.parse_args()
    scratch = _bench.scratch_dir()
    load_before = _bench.load()
    cases = [("one job, thread", "thread", 1), ("4 jobs, thread", "thread", JOBS)]
    cases.append(("4 jobs, process", "process", JOBS))
    times: dict[str, list[float]] = {}
    for rep in range(args.reps):
        for label, isolation, jobs in cases:
            progress(f"rep {rep + 1}: {label}")
            path = str(scratch / f"isolation-{rep}-{isolation}-{jobs}.db")
            times.setdefault(label, []).append(run(isolation, jobs, args.n, path))
    unit = median(times["one job, thread"])
    rows = [
        [label, fmt(median(t)), fmt(min(t)), fmt(median(t) / unit, 2)] for label, t in times.items()
    ]
    _bench.print_table(
        f"{JOBS} CPU-bound jobs ({args.n:,} rounds each) on a worker of concurrency {JOBS},"
        f" wall time, s ({args.reps} reps; load {load_before} before, {_bench.load()} after)",
        ["case", "median", "min", "x one job"],
        rows,
    )
    print(_bench.machine())


if __name__ == "__main__":
    main()
