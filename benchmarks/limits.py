"""Limits every worker shares: what they cost, and whether a rate holds.

    benchmarks/.venv/bin/python benchmarks/limits.py [--jobs 4000] [--reps 2] [--rate-seconds 20]

Three tables (Markdown, on stdout; progress on stderr):

1. **Throughput** on PostgreSQL (own database ``bench_limits``, dropped after): 8 real
   ``scheduler worker`` processes of 5 threads each drain ``--jobs`` no-op jobs, with no limit
   and with one limit of ``concurrency = 40`` over the handler (the same 40 threads: the cost
   of the claim that counts, not of fewer threads), and with a limit of ``concurrency =
   100000`` that is never full (the claim under limits apart from waiting for places). Cases
   alternate, ``--reps`` each; jobs per second from the enqueue to the last success, and jobs
   per claim (the jobs' distinct ``started_at``: each claim gives its jobs its time).
2. **Rate**: the same 8 workers under ``rate = "100/1s"`` with more jobs ready than the rate
   lets start: the starts (each attempt's ``started_at``, the claim's time) over
   ``--rate-seconds`` after the first second, their mean per second, and the most started in
   any one-second window.
3. **Idle cost**: one worker in this process with nothing to do, SQL statements per second,
   without limits and with three limits configured, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import _bench
from _bench import Counter, fmt, median, progress
from sqlalchemy import func, select

from scheduler import Limit, Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs
from scheduler._worker.worker import Worker

WORKERS = 8
THREADS = 5
HANDLERS = """
import time
from scheduler import default_registry

@default_registry.handler("bench.noop", retry_safe=True)
def noop(job):
    if job.payload.get("ms"):
        time.sleep(job.payload["ms"] / 1000)
"""


def write_config(folder: Path, url: str, limit: str) -> Path:
    (folder / "bench_limits_jobs.py").write_text(HANDLERS)
    path = folder / "app.toml"
    path.write_text(
        f'[database]\nurl = "{url}"\n\n[scheduler]\ntick_interval = 1.0\n\n'
        f'[worker]\nimports = ["bench_limits_jobs"]\nconcurrency = {THREADS}\n'
        + (f'\n[[limits]]\nname = "api"\nhandlers = ["bench.noop"]\n{limit}\n' if limit else "")
    )
    return path


def start_workers(folder: Path, config: Path) -> list[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    procs = []
    for n in range(WORKERS):
        log = open(folder / f"worker{n}.log", "wb")  # closed with the process
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "scheduler.cli", "--config", str(config), "worker"],
                cwd=folder,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        logs = [(folder / f"worker{n}.log").read_text() for n in range(WORKERS)]
        if all("started" in text for text in logs):
            return procs
        time.sleep(0.1)
    raise SystemExit("the workers did not start")


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(60)


def empty(app: Scheduler) -> None:
    from scheduler._store.tables import limit_holds, runs

    with app.store.begin() as conn:
        for table in (runs, jobs, limit_holds):
            conn.execute(table.delete())


def succeeded(app: Scheduler) -> int:
    with app.store.read() as conn:
        found = conn.execute(select(func.count()).where(jobs.c.state == "succeeded"))
        return int(found.scalar_one())


def claims_made(app: Scheduler) -> int:
    """How many claims started the jobs: each claim gives its jobs one ``started_at``."""
    with app.store.read() as conn:
        found = conn.execute(select(func.count(jobs.c.started_at.distinct())))
        return int(found.scalar_one())


def throughput(url: str, limit: str, n: int, ms: float = 0) -> tuple[float, float]:
    """(jobs per second, jobs per claim)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = write_config(folder, url, limit)
        app = Scheduler.from_toml(config, registry=Registry())
        empty(app)
        procs = start_workers(folder, config)
        try:
            time.sleep(2)
            began = time.monotonic()
            for start in range(0, n, 1000):
                count = min(1000, n - start)
                app.enqueue_many([{"handler": "bench.noop", "payload": {"ms": ms}}] * count)
            while succeeded(app) < n:
                time.sleep(0.05)
            took = time.monotonic() - began
            claims = claims_made(app)
        finally:
            stop_workers(procs)
            app.close()
    return n / took, n / max(claims, 1)


def rate_held(url: str, seconds: float) -> tuple[float, int, int]:
    """(mean starts per second over the measured span, most in any 1 s window, starts)."""
    n = int(100 * (seconds + 10))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = write_config(folder, url, 'rate = "100/1s"')
        app = Scheduler.from_toml(config, registry=Registry())
        empty(app)
        procs = start_workers(folder, config)
        try:
            app.enqueue_many([{"handler": "bench.noop"}] * n)
            time.sleep(seconds + 3)
            with app.store.read() as conn:
                started = sorted(
                    conn.execute(select(jobs.c.started_at).where(jobs.c.started_at.is_not(None)))
                    .scalars()
                    .all()
                )
        finally:
            stop_workers(procs)
            app.close()
    first = started[0] + timedelta(seconds=1)  # the first second: the workers' first polls
    span = [t for t in started if first <= t < first + timedelta(seconds=seconds)]
    window = timedelta(seconds=1)
    most, j = 0, 0
    for i, t in enumerate(started):
        while started[j] <= t - window:
            j += 1
        most = max(most, i - j + 1)
    return len(span) / seconds, most, len(span)


def idle_statements(url: str, limits: list[Limit], seconds: float) -> float:
    app = Scheduler(url, registry=Registry(), limits=limits, clock="local")
    empty(app)  # nothing left over from the cases before: an idle worker
    for name in ("crm.sync", "mail.send", "api.call"):
        app.registry.handler(name)(lambda job: None)
    counter = Counter(app.store.engine)
    worker = Worker(app, serve_metrics=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    time.sleep(7)  # start-up, the first ticks, polls and limited claims (every 5 s idle)
    counter.reset()
    began = time.monotonic()
    time.sleep(seconds)
    counts = counter.reset()
    took = time.monotonic() - began
    worker.stop()
    thread.join(30)
    app.close()
    return counts.statements / took


CASES = {
    "none": "",
    "concurrency = 40": "concurrency = 40",
    # Never full: what the claim under limits costs apart from waiting for places.
    "concurrency = 100000": "concurrency = 100000",
}

LIMITS = [
    Limit(
        "crm-api", handlers=["crm.sync"], concurrency=10, rate="100/60s", per="tenant", fair=True
    ),
    Limit("mail", handlers=["mail.send"], rate="5/1s"),
    Limit("api", handlers=["api.call"], concurrency=3),
]


def main() -> None:
    p = _bench.parser(__doc__ or "", reps=2)
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument(
        "--job-ms", type=float, default=0, help="each job sleeps this long (default 0: no-op)"
    )
    p.add_argument("--rate-seconds", type=float, default=20.0)
    p.add_argument("--idle-seconds", type=float, default=20.0)
    p.add_argument("--only-throughput", action="store_true", help="skip the rate and idle cases")
    args = p.parse_args()
    print(f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start\n")
    pg = _bench.recreate_pg_database(args.pg, "bench_limits")
    Scheduler(pg, registry=Registry()).migrate()
    try:
        rates: dict[str, list[float]] = {case: [] for case in CASES}
        per_claim: dict[str, list[float]] = {case: [] for case in CASES}
        for rep in range(args.reps):
            for case in CASES:
                progress(f"throughput {case}, rep {rep + 1}")
                rate, size = throughput(pg, CASES[case], args.jobs, args.job_ms)
                rates[case].append(rate)
                per_claim[case].append(size)
        base = median(rates["none"])
        body = f"{args.job_ms:g} ms" if args.job_ms else "no-op"
        print(
            f"Throughput, {args.jobs} {body} jobs, {WORKERS} workers x {THREADS} threads,"
            " PostgreSQL"
        )
        print(
            "\n| limit | jobs/s (median) | runs | of no limit | jobs per claim |"
            "\n|---|---|---|---|---|"
        )
        for case, found in rates.items():
            runs = ", ".join(fmt(r) for r in found)
            size = median(per_claim[case])
            print(
                f"| {case} | {fmt(median(found))} | {runs} | {median(found) / base:.0%}"
                f" | {size:.1f} |"
            )
        if args.only_throughput:
            return
        progress("rate 100/1s")
        mean, most, count = rate_held(pg, args.rate_seconds)
        print(f"\nRate 100/1s, {WORKERS} workers, {args.rate_seconds:g} s measured, PostgreSQL")
        print("\n| starts | per second (mean) | off 100/s | most in any 1 s |\n|---|---|---|---|")
        print(f"| {count} | {mean:.1f} | {(mean - 100) / 100:+.1%} | {most} |")
        print(f"\nIdle worker, SQL statements per second over {args.idle_seconds:g} s")
        print("\n| database | no limits | 3 limits configured |\n|---|---|---|")
        with tempfile.TemporaryDirectory() as tmp:
            lite = f"sqlite:///{tmp}/idle.db"
            Scheduler(lite, registry=Registry()).migrate()
            for name, url in (("SQLite", lite), ("PostgreSQL", pg)):
                progress(f"idle {name}")
                without = idle_statements(url, [], args.idle_seconds)
                with_limits = idle_statements(url, LIMITS, args.idle_seconds)
                print(f"| {name} | {without:.2f} | {with_limits:.2f} |")
    finally:
        _bench.drop_pg_database(args.pg, "bench_limits")


if __name__ == "__main__":
    main()
