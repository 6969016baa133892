"""What the metrics hooks add to one job, measured directly: a figure a busy machine barely
moves, beside the whole-worker A/B of ``metrics_overhead.py`` whose wall and CPU figures swing
with the load.

Each job run by the worker passes through two hooks when metrics are on: the worker's
``Telemetry.running`` context around the handler call (its run time and queue wait: two
histogram observations) and the runner's recorded-outcomes hook after the commit (the
outcome counter; called here with a batch of one job, the worst case), beside the
``job_succeeded`` signal that is sent either way.
This script runs exactly those calls for a real job view, ``--calls`` times, with metrics off
(the same context, no receivers) and on, in 1 and in 4 threads (the worker's default), and
prints the CPU per job of each and their difference. It then drains ``--jobs`` no-op jobs
with a real worker, metrics off, for the CPU a job costs as a whole: the hooks' share of it is
the overhead a no-op job sees (any real handler's work makes it smaller).

    .venv/bin/python benchmarks/metrics_hooks.py [--calls 50000] [--jobs 3000] [--reps 3]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from _bench import load, machine, median, parser, print_table, scratch_dir

from scheduler import Scheduler, signals
from scheduler._config import MetricsSettings
from scheduler._model.ending import Ending as Outcome
from scheduler._model.handlers import Registry
from scheduler._worker.telemetry import Telemetry
from scheduler._worker.worker import Worker
from scheduler.metrics import metrics_for


def make(path: Path) -> Scheduler:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    registry = Registry()
    registry.handler("bench.noop", retry_safe=True)(lambda job: None)
    app = Scheduler(f"sqlite:///{path}", registry=registry, metrics=MetricsSettings(port=0))
    app.migrate()
    return app


def hooks_cpu(app: Scheduler, metrics: bool, calls: int, threads: int) -> float:
    """CPU µs per job of the two hooks, over ``calls`` jobs split among ``threads``."""
    job = app.get_job(app.enqueue("bench.noop", {}))
    assert job is not None
    telemetry = Telemetry(app)
    found = metrics_for(app) if metrics else None
    telemetry.metrics = found  # as Telemetry.open() sets it, without serving HTTP
    outcome = Outcome(job=job, started=job.run_at, state="succeeded", code=None)

    hooks = app._recorded_hooks  # what Runner.record() calls after its commit

    def one_thread() -> None:
        for _ in range(calls // threads):
            with telemetry.running(job) as run:
                run.ended(outcome)
            for hook in hooks:  # a batch of one: the worst case (the worker's hold ~10)
                hook([(job, "succeeded")])
            signals.job_succeeded.send(job.handler, job=job)

    workers = [threading.Thread(target=one_thread) for _ in range(threads)]
    cpu = time.process_time()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    took = time.process_time() - cpu
    if found is not None:
        found.close()
        delattr(app, "_metrics")
    return took / calls * 1e6


def drain_cpu(app: Scheduler, jobs: int) -> float:
    for _ in range(jobs):
        app.enqueue("bench.noop", {})
    cpu = time.process_time()
    result = Worker(app, concurrency=4).run(once=True)
    took = time.process_time() - cpu
    assert result.handled == jobs, result
    return took / jobs * 1e6


def main() -> None:
    p = parser(__doc__.splitlines()[0], reps=3)
    p.add_argument("--calls", type=int, default=50_000)
    p.add_argument("--jobs", type=int, default=3000)
    args = p.parse_args()
    before = load()
    app = make(scratch_dir() / "hooks.db")
    figures: dict[str, list[float]] = {}
    cases: dict[str, Callable[[], float]] = {}
    for threads in (1, 4):
        for metrics in (False, True):
            cases[f"{threads}-{metrics}"] = lambda t=threads, m=metrics: hooks_cpu(
                app, m, args.calls, t
            )
    for _ in range(args.reps):
        for name, case in cases.items():
            figures.setdefault(name, []).append(case())
        figures.setdefault("drain", []).append(drain_cpu(make(scratch_dir() / "d.db"), args.jobs))
    job = median(figures["drain"])
    rows = []
    for threads in (1, 4):
        off, on = median(figures[f"{threads}-False"]), median(figures[f"{threads}-True"])
        rows.append(
            [
                threads,
                f"{off:.2f}",
                f"{on:.2f}",
                f"{on - off:.2f}",
                f"{(on - off) / job * 100:.2f} %",
            ]
        )
    print_table(
        f"Metrics hooks per job, CPU µs (medians of {args.reps}; a no-op job drained by a"
        f" 4-thread worker costs {job:.0f} µs of CPU; {machine()}; load average {before}"
        f" before, {load()} after)",
        [
            "threads",
            "hooks, metrics off",
            "hooks, metrics on",
            "added by metrics",
            "of a no-op job",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
