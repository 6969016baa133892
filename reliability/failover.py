"""A failover or a switchover under load: the workers resume on the new primary by themselves.

A primary and a synchronous streaming standby of this script's own (``_replication.py``: two
clusters on free loopback ports, made with PostgreSQL's own binaries). Two ``scheduler
worker`` processes (4 threads each, tick every 0.25 s, 5 s leases) connect with a multi-host
URL (``?host=A&host=B&target_session_attrs=read-write``) and run 20 tasks due every second,
while a producer thread enqueues about 10 jobs a second, half ``rel.safe`` (retry-safe) and
half ``rel.unsafe`` (not), each with a dedupe key (a retried enqueue adds no second job).

After ``--before`` seconds (10):

- ``--mode failover``: ``kill -9`` of the primary's postmaster, then ``pg_ctl promote`` of
  the standby;
- ``--mode switchover``: the primary stays up and turns read-only
  (``default_transaction_read_only = on``, reloaded: every write on it then fails with
  SQLSTATE 25006), then the standby is promoted.

The load goes on for ``--after`` seconds (30); then the queue is drained and everything is
accounted for on the new primary. ``resumed`` is, per worker, the time from the end of the
promotion to the first job it started or the first slot it dispatched after it: the worst
of the workers' must be under 15 s, without a restart.

    python reliability/failover.py [--mode failover|switchover] [--before 10] [--after 30]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import _replication

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs, workers

TERMINAL = ("succeeded", "aborted")
TASKS = 20
LEASE = 5.0
WORKERS = 2
RESUME_LIMIT = 15.0  # seconds from the promotion to the first work on the new primary


def run(
    mode: str = "failover",
    *,
    before: float = 10.0,
    after: float = 30.0,
    rate: float = 10.0,
    tasks: int = TASKS,
    workers_count: int = WORKERS,
    concurrency: int = 4,
    seed: int | None = None,
    out: Path | None = None,
    pair: _replication.Pair | None = None,
) -> tuple[list[c.Figure], list[str]]:
    """One run; ``pair`` (started, untouched) if the caller made one, else one of our own."""
    if mode not in ("failover", "switchover"):
        raise SystemExit(f"--mode must be failover or switchover, not {mode!r}")
    seed = random.randrange(2**32) if seed is None else seed
    out = out or c.workdir(mode)
    own = pair is None
    if pair is None:
        pair = _own_pair()
    previous = signal.signal(signal.SIGTERM, _terminate)
    running: list[c.Worker] = []
    producer: c.Producer | None = None
    codes: dict[str, int] = {}
    try:
        url = pair.url()
        c.prepare_database(url)
        config = c.write_config(
            out / f"{mode}.toml",
            url,
            scheduler={"tick_interval": 0.25},
            worker={
                "concurrency": concurrency,
                "lease_seconds": LEASE,
                "shutdown_grace_seconds": 10,
            },
            tasks=[
                {
                    "name": f"fo-{n:02}",
                    "cron": "* * * * * *",
                    "handler": "rel.fast" if n % 2 else "rel.safe",
                    "payload": {"sleep": 0.02},
                }
                for n in range(tasks)
            ],
        )
        synced = c.cli(config, "sync", url=url, out=out)
        if synced.returncode != 0:
            raise SystemExit(f"sync failed: {synced.stderr}")
        running = [
            c.Worker(config, url, out, f"worker-{n}", level="INFO") for n in range(workers_count)
        ]
        if not c.wait_for(lambda: _registered(url) >= workers_count, timeout=60, every=0.2):
            raise SystemExit("the workers did not start")
        producer = c.Producer(url, rate, seed, sleeps=(0.01, 0.3))
        producer.start()
        time.sleep(before)
        began = time.time()
        promoted_at = pair.failover() if mode == "failover" else pair.switchover()
        time.sleep(after)
        producer.stop.set()
        producer.join(30)
        alive = [w.name for w in running if w.alive()]
        queue = Scheduler(url, registry=Registry())
        try:
            deadline = time.monotonic() + 3 * LEASE + 60
            acked = {job_id for job_id, _ in producer.acked.values()}
            while time.monotonic() < deadline and _active(queue, acked):
                time.sleep(0.25)
            settle = time.monotonic() + 2 * LEASE + 2  # one lease after the drain, and a tick
            while time.monotonic() < settle and _stuck(queue, LEASE):
                time.sleep(0.25)
            with queue.store.read() as conn:
                db = {j.id: j for j in conn.execute(select(jobs))}
            stuck = _stuck(queue, LEASE)
        finally:
            queue.close()
        codes = c.stop_all(running, grace=30)
    finally:
        if producer is not None:
            producer.stop.set()
        for w in running:
            if w.alive():
                w.kill9()
        signal.signal(signal.SIGTERM, previous)
        if own:
            pair.stop()
    assert producer is not None
    producer.app.close()
    return analyse(mode, out, producer, db, running, alive, codes, began, promoted_at, stuck, seed)


def _own_pair() -> _replication.Pair:
    pair = _replication.Pair()
    try:
        return pair.start()
    except BaseException:
        pair.stop()
        raise


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def _registered(url: str) -> int:
    """How many workers have started their loop (their rows in scheduler_workers)."""
    app = Scheduler(url, registry=Registry())
    try:
        with app.store.read() as conn:
            found = conn.execute(select(workers.c.id).where(workers.c.id.not_like("%:tick")))
            return len(found.all())
    finally:
        app.close()


def _active(app: Scheduler, acked: set[int]) -> int:
    """Acknowledged jobs not yet at an end."""
    with app.store.read() as conn:
        found = conn.execute(select(jobs.c.id).where(jobs.c.state.not_in(TERMINAL))).all()
    return sum(1 for (job_id,) in found if job_id in acked)


def _stuck(app: Scheduler, lease: float) -> list[int]:
    """Jobs still ``claimed`` a whole lease after their lease ran out (nobody took them over)."""
    now = app.clock()
    with app.store.read() as conn:
        found = conn.execute(
            select(jobs.c.id, jobs.c.lease_expires_at).where(jobs.c.state == "claimed")
        ).all()
    return [j for j, until in found if until is not None and (now - until).total_seconds() > lease]


def analyse(
    mode: str,
    out: Path,
    producer: c.Producer,
    db: dict[int, Any],
    running: list[c.Worker],
    alive: list[str],
    codes: dict[str, int],
    began: float,
    promoted_at: float,
    stuck: list[int],
    seed: int,
) -> tuple[list[c.Figure], list[str]]:
    starts: collections.Counter[int] = collections.Counter()
    first_after: dict[int, float] = {}  # worker pid -> first job started / slot dispatched
    for m in c.read_jsonl(out / "markers"):
        if m["m"] == "start":
            starts[m["job"]] += 1
            if m["t"] >= promoted_at:
                first_after[m["pid"]] = min(first_after.get(m["pid"], m["t"]), m["t"])
    events = list(c.read_jsonl(out / "events"))
    dispatches = [e for e in events if e["e"] == "dispatch"]
    for e in dispatches:
        if e["t"] >= promoted_at:
            first_after[e["pid"]] = min(first_after.get(e["pid"], e["t"]), e["t"])
    per_slot = collections.Counter((e["row"], e["slot"]) for e in dispatches)
    per_job = collections.Counter(e["job"] for e in dispatches)
    doubled = sum(n - 1 for n in per_slot.values() if n > 1)
    doubled += sum(n - 1 for n in per_job.values() if n > 1)
    task_jobs = [j for j in db.values() if j.task_name is not None]
    created = collections.Counter((j.task_name, j.slot) for j in task_jobs)
    doubled += sum(n - 1 for n in created.values() if n > 1)
    acked = dict(producer.acked.values())  # job id -> handler
    lost = [j for j in acked if j not in db or db[j].state not in TERMINAL]
    unsafe = [j for j, h in acked.items() if h == "rel.unsafe"]
    safe = [j for j, h in acked.items() if h == "rel.safe"]
    per_n = collections.Counter(json.loads(db[j].payload).get("n") for j in db if j in acked)
    pids = {w.pid for w in running}
    resumed = [first_after[p] - promoted_at for p in pids if p in first_after]
    not_resumed = len(pids - set(first_after))
    worst = max(resumed) if resumed and not not_resumed else float("nan")
    logs = [w.output() for w in running]
    figures = [
        c.Figure(f"{mode}: seconds to promote", round(promoted_at - began, 2)),
        c.Figure("workers resumed, worst (s after promotion)", round(worst, 2)),
        c.Figure("workers not resumed within the run", not_resumed, True),
        c.Figure(
            f"workers resumed later than {RESUME_LIMIT:g} s",
            sum(1 for r in resumed if r > RESUME_LIMIT),
            True,
        ),
        c.Figure("task dispatches announced", len(dispatches)),
        c.Figure("jobs acknowledged (enqueued)", len(acked)),
        c.Figure("enqueue attempts refused", producer.refused),
        c.Figure("jobs succeeded", sum(1 for j in acked if j in db and db[j].state == "succeeded")),
        c.Figure(
            "non-retry-safe jobs abandoned", sum(1 for j in unsafe if db[j].state == "aborted")
        ),
        c.Figure("retry-safe jobs run again", sum(1 for j in safe if starts[j] > 1)),
        c.Figure("database errors logged", sum(log.count("database error") for log in logs)),
        c.Figure("committed jobs lost", len(lost), True),
        c.Figure("doubled slots", doubled, True),
        c.Figure("jobs enqueued twice", sum(1 for n in per_n.values() if n > 1), True),
        c.Figure("non-retry-safe jobs run twice", sum(1 for j in unsafe if starts[j] > 1), True),
        c.Figure("stuck claimed jobs after one lease", len(stuck), True),
        c.Figure("tracebacks in the workers' logs", c.tracebacks(logs)),
        c.Figure("workers died", len(running) - len(alive), True),
        c.Figure("workers exited non-zero", sum(1 for v in codes.values() if v != 0), True),
    ]
    notes = [f"seed {seed}", "resumed (s): " + ", ".join(f"{r:.2f}" for r in sorted(resumed))]
    return figures, notes


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument("--mode", choices=("failover", "switchover"), default="failover")
    p.add_argument("--before", type=float, default=10.0, help="seconds of load before")
    p.add_argument("--after", type=float, default=30.0, help="seconds of load after")
    p.add_argument("--rate", type=float, default=10.0, help="jobs enqueued per second")
    p.add_argument("--workers", type=int, default=WORKERS, help="worker processes")
    p.add_argument("--concurrency", type=int, default=4, help="job threads per worker")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    out = c.workdir(args.mode)
    result = run(
        args.mode,
        before=args.before,
        after=args.after,
        rate=args.rate,
        workers_count=args.workers,
        concurrency=args.concurrency,
        seed=args.seed,
        out=out,
    )
    return c.finish(f"failover ({args.mode})", result, out, args.keep)


if __name__ == "__main__":
    sys.exit(main())
