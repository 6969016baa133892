"""Queue race: several processes call ``work()`` on one job set at once, run after run.

Each of ``--runs`` (20) runs empties the queue, enqueues ``--jobs`` (60) jobs, starts
``--processes`` (3) spawned processes that each build their own Scheduler, connect, wait for
one start signal and call ``app.work()`` until nothing is ready (the scenario of issue 18, where
a MariaDB deadlock reached one of the callers). Each handler call appends ``job_id worker`` to
a file, one ``os.write`` per line. MariaDB by default, or any engine with ``--url``.

    python reliability/queue_race.py [--runs 20] [--processes 3] [--jobs 60] [--url URL]
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

HANDLER = "race.job"


def append_line(path: str, line: str) -> None:
    """One ``write`` on an ``O_APPEND`` descriptor: lines from many processes never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def racer(url: str, out: str, start: Any, worker_id: str) -> None:
    """One process: wait for the start signal, then run ready jobs until none is left."""
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry

    app = Scheduler(url, registry=Registry(), worker_id=worker_id)

    @app.handler(HANDLER)
    def run(job: Any) -> None:
        append_line(out, f"{job.id} {worker_id}")
        time.sleep(0.01)  # long enough for the other processes to reach the same jobs

    try:
        app.check_schema()  # connected before the start, so all processes begin together
        if not start.wait(60):
            raise RuntimeError("start signal never came")
        app.work()
    except BaseException:
        with open(Path(out).with_suffix(".errors"), "a") as f:
            f.write(f"{worker_id}: {traceback.format_exc()}\n")
        raise
    finally:
        app.close()


def one_run(url: str, out: Path, processes: int, count: int) -> dict[str, int]:
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry
    from scheduler._store.tables import jobs, runs

    app = Scheduler(url, registry=Registry())
    try:
        with app.store.begin() as conn:
            conn.execute(delete(runs))
            conn.execute(delete(jobs))
        ids = [app.enqueue(HANDLER, {"n": n}) for n in range(count)]
        calls = out / "calls.log"
        calls.unlink(missing_ok=True)
        ctx = multiprocessing.get_context("spawn")
        start = ctx.Event()
        procs = [
            ctx.Process(target=racer, args=(url, str(calls), start, f"w{n}"))
            for n in range(processes)
        ]
        for proc in procs:
            proc.start()
        time.sleep(1.0)
        start.set()
        for proc in procs:
            proc.join(120)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        lines = calls.read_text().split() if calls.exists() else []
        per_job = collections.Counter(int(job) for job in lines[::2])
        with app.store.read() as conn:
            states = dict(
                conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all()
            )
            attempts = conn.execute(select(func.max(jobs.c.attempts))).scalar_one()
        return {
            "processes exited non-zero": sum(1 for p in procs if p.exitcode != 0),
            "jobs run twice": sum(1 for n in per_job.values() if n > 1),
            "jobs never run": sum(1 for i in ids if i not in per_job),
            "jobs not succeeded": count - int(states.get("succeeded", 0)),
            "jobs with more than one attempt": int((attempts or 0) > 1),
            "workers that ran jobs": len(set(lines[1::2])),
        }
    finally:
        app.close()


def run(
    url: str,
    *,
    runs: int = 20,
    processes: int = 3,
    jobs: int = 60,
    prepare: bool = True,
    out: Path,
    verbose: bool = True,
) -> tuple[list[c.Figure], list[str]]:
    c.check_loopback(url)
    if prepare:
        c.prepare_database(url)
    totals: collections.Counter[str] = collections.Counter()
    single = 0
    for n in range(runs):
        found = one_run(url, out, processes, jobs)
        single += found.pop("workers that ran jobs") < 2
        totals.update(found)
        if verbose:
            bad = {k: v for k, v in found.items() if v}
            print(f"run {n + 1}/{runs}: {'FAIL ' + str(bad) if bad else 'ok'}", flush=True)
    errors = out / "calls.errors"
    tracebacks = c.tracebacks([errors.read_text()]) if errors.exists() else 0
    figures = [
        c.Figure("runs", runs),
        c.Figure("jobs per run", jobs),
        c.Figure("processes per run", processes),
        c.Figure("runs where only one process got work", single),
        *(c.Figure(name, value, True) for name, value in totals.items()),
        c.Figure("errors raised out of work()", tracebacks, True),
    ]
    return figures, []


def main() -> int:
    p = c.parser(__doc__, seconds=None, url=c.DEFAULT_MARIADB)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--jobs", type=int, default=60)
    args = p.parse_args()
    c.check_loopback(args.url)
    out = c.workdir("queue-race")
    result = run(args.url, runs=args.runs, processes=args.processes, jobs=args.jobs, out=out)
    return c.finish("queue_race", result, out, args.keep)


if __name__ == "__main__":
    sys.exit(main())
