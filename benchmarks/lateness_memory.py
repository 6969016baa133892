"""Dispatch lateness of a second-level cron task, and worker memory over 100k no-op jobs.

    benchmarks/.venv/bin/python benchmarks/lateness_memory.py [--seconds 60] [--jobs 100000]

One worker process on a SQLite file: the real ``scheduler worker`` command (a tick every
``tick_interval``, default concurrency), or, on a checkout without ``scheduler/cli.py``, the
public API in a loop (``benchmarks/_lateness_app.py``). Phase 1: a ``* * * * * *`` task runs
for ``--seconds``; each dispatch's lateness is the time its ``job_dispatched`` receiver ran
minus the ``slot`` it was for. Phase 2: the worker's RSS (``VmRSS`` in /proc/PID/status) after
a 1,000-job warm-up and after ``--jobs`` more no-op jobs. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import _bench
from _bench import fmt, progress
from sqlalchemy import func, insert, select

from scheduler import Scheduler
from scheduler._store.jobs import new_job_values
from scheduler._store.tables import jobs

HERE = Path(__file__).resolve().parent
CHUNK = 1000


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def write_config(scratch: Path, tick_interval: float) -> Path:
    path = scratch / "app.toml"
    path.write_text(
        f"""[database]
url = "sqlite:///{scratch / "lateness.db"}"

[scheduler]
tick_interval = {tick_interval}

[worker]
imports = ["_lateness_app"]

[[tasks]]
name = "every-second"
cron = "* * * * * *"
handler = "bench.every_second"
"""
    )
    return path


def worker_command(config: Path) -> tuple[list[str], str]:
    if importlib.util.find_spec("scheduler.cli") is not None:
        script = Path(sys.executable).with_name("scheduler")
        if script.exists():
            return [str(script), "--config", str(config), "worker"], "scheduler worker (CLI)"
        runner = "from scheduler.cli import main; main()"
        return [sys.executable, "-c", runner, "--config", str(config), "worker"], (
            "scheduler worker (CLI)"
        )
    return [sys.executable, str(HERE / "_lateness_app.py")], "Scheduler API loop"


def enqueue(app: Scheduler, n: int) -> None:
    now = datetime.now(UTC) - timedelta(seconds=1)
    with app.store.begin() as conn:
        conn.execute(
            insert(jobs),
            [new_job_values(handler="bench.noop", payload="{}", now=now) for _ in range(n)],
        )


def pending(app: Scheduler) -> int:
    with app.store.read() as conn:
        stmt = (
            select(func.count())
            .select_from(jobs)
            .where(jobs.c.state.in_(("queued", "claimed")), jobs.c.handler == "bench.noop")
        )
        return int(conn.execute(stmt).scalar_one())


def drain(app: Scheduler, pid: int, total: int, backlog: int, timeout: float) -> tuple[float, int]:
    """Enqueue ``total`` no-op jobs, never more than ``backlog`` waiting at once, and wait until
    the worker has run them all; return the seconds taken and the peak RSS seen (KiB)."""
    began = time.monotonic()
    sent, peak = 0, rss_kib(pid)
    while True:
        waiting = pending(app)
        if sent < total and waiting < backlog // 2:
            n = min(backlog - waiting, total - sent)
            for start in range(0, n, CHUNK):
                enqueue(app, min(CHUNK, n - start))
            sent += n
        elif sent >= total and waiting == 0:
            return time.monotonic() - began, peak
        peak = max(peak, rss_kib(pid))
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"the worker did not drain {total} jobs in {timeout:.0f}s")
        time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="phase 1 length (default 60)")
    p.add_argument("--jobs", type=int, default=100_000, help="phase 2 no-op jobs (default 100000)")
    p.add_argument(
        "--backlog",
        type=int,
        default=2000,
        help="most jobs waiting at once in phase 2 (default 2000; see README)",
    )
    p.add_argument("--tick-interval", type=float, default=1.0)
    args = p.parse_args()
    scratch = _bench.scratch_dir()
    load_before = _bench.load()
    config = write_config(scratch, args.tick_interval)
    log_path = scratch / "lateness.log"
    app = Scheduler.from_toml(config)
    app.migrate()
    app.sync()
    command, how = worker_command(config)
    env = dict(
        os.environ,
        SCHEDULER_CONFIG=str(config),
        BENCH_LATENESS_LOG=str(log_path),
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    )
    stderr = open(scratch / "worker.log", "w")  # closed below
    progress(f"starting the worker: {' '.join(command)}")
    proc = subprocess.Popen(command, env=env, cwd=scratch, stderr=stderr)
    try:
        time.sleep(3)
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited: {(scratch / 'worker.log').read_text()}")
        rss_start = rss_kib(proc.pid)
        progress(f"phase 1: the every-second task for {args.seconds:.0f}s")
        phase1_from = time.time()
        time.sleep(args.seconds)
        phase1_to = time.time()
        rss_idle = rss_kib(proc.pid)
        progress("phase 2: 1,000-job warm-up")
        drain(app, proc.pid, 1000, args.backlog, timeout=600)
        rss_before = rss_kib(proc.pid)
        progress(f"phase 2: {args.jobs:,} no-op jobs, at most {args.backlog:,} waiting")
        seconds, peak = drain(app, proc.pid, args.jobs, args.backlog, timeout=3600)
        rss_after = rss_kib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        stderr.close()
        app.close()

    dispatches: dict[str, tuple[float, float]] = {}
    starts: dict[str, float] = {}
    for line in log_path.read_text().splitlines():
        kind, job, *times = line.split()
        if kind == "dispatch":
            dispatches[job] = (float(times[0]), float(times[1]))
        else:
            starts[job] = float(times[0])
    in_phase1 = {j: v for j, v in dispatches.items() if phase1_from <= v[0] < phase1_to}
    late = [(at - slot) * 1000 for slot, at in in_phase1.values()]
    start_late = [(starts[j] - slot) * 1000 for j, (slot, _) in in_phase1.items() if j in starts]
    slots = int(phase1_to) - int(phase1_from)
    target_p99 = args.tick_interval * 1000 + 50
    log_lines = sum(1 for _ in open(scratch / "worker.log", errors="replace"))
    mib = 1024
    rows = [
        ["worker", how, ""],
        ["slots in phase 1 / dispatched", f"{slots} / {len(late)}", "(missed slots coalesce)"],
        ["dispatch lateness p50 (ms)", fmt(percentile(late, 50)), ""],
        ["dispatch lateness p99 (ms)", fmt(percentile(late, 99)), f"<= {target_p99:g}"],
        ["dispatch lateness max (ms)", fmt(max(late, default=float("nan"))), ""],
        ["job start lateness p50 (ms)", fmt(percentile(start_late, 50)), ""],
        ["job start lateness p99 (ms)", fmt(percentile(start_late, 99)), ""],
        ["RSS 3 s after start (MiB)", fmt(rss_start / mib), ""],
        [f"RSS after phase 1 ({args.seconds:.0f} s) (MiB)", fmt(rss_idle / mib), ""],
        ["RSS after 1,000-job warm-up: before (MiB)", fmt(rss_before / mib), ""],
        [f"RSS after {args.jobs:,} jobs: after (MiB)", fmt(rss_after / mib), ""],
        ["RSS growth over the jobs (MiB)", fmt((rss_after - rss_before) / mib), "<= 5"],
        ["peak RSS during the jobs (MiB)", fmt(peak / mib), ""],
        [f"{args.jobs:,} jobs drained in (s)", fmt(seconds), ""],
        ["jobs/s", fmt(args.jobs / seconds), ""],
        ["worker log lines (stderr)", f"{log_lines:,}", ""],
    ]
    _bench.print_table(
        f"Lateness and memory: tick_interval {args.tick_interval:g}s, SQLite ({_bench.machine()};"
        f" load average {load_before} before, {_bench.load()} after)",
        ["metric", "value", "target"],
        rows,
    )


if __name__ == "__main__":
    main()
