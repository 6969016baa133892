"""Database restart: PostgreSQL goes down and comes back under two workers and a producer.

Two ``scheduler worker`` processes run jobs (half retry-safe, half not; each handler writes
``start``/``done`` markers) while a producer thread in this script enqueues about 20 jobs a
second, each with a dedupe key so that a retried enqueue cannot add a second job while the
first is active. ``--restarts`` (1) times, spread over ``--seconds`` (40), the server is
restarted with::

    pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main restart

Afterwards the queue is drained and every acknowledged job is accounted for. Whatever happens
(an error, Ctrl-C, SIGTERM), the script leaves the server running: it starts it again if
``pg_isready`` says it is down.

    python reliability/db_restart.py [--seconds 40] [--restarts 1] [--url URL]
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs

TERMINAL = ("succeeded", "aborted")


def cluster_version() -> str:
    versions = sorted(os.listdir("/etc/postgresql"))
    if not versions:
        raise SystemExit("no PostgreSQL cluster under /etc/postgresql")
    return versions[-1]


def pg_ready(host: str, port: int) -> bool:
    done = subprocess.run(
        ["pg_isready", "-q", "-h", host, "-p", str(port)], capture_output=True, timeout=10
    )
    return done.returncode == 0


def pg_ctl(action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", cluster_version(), "main", action],
        capture_output=True,
        text=True,
        timeout=120,
    )


def ensure_running(host: str, port: int) -> bool:
    """Start the cluster if it does not answer; True once it does."""
    if pg_ready(host, port):
        return True
    print("PostgreSQL is not answering: starting it", flush=True)
    pg_ctl("start")
    return c.wait_for(lambda: pg_ready(host, port), timeout=60, every=0.5)


def run(
    url: str,
    *,
    seconds: float = 40.0,
    restarts: int = 1,
    rate: float = 20.0,
    lease: float = 5.0,
    seed: int | None = None,
    prepare: bool = True,
    out: Path | None = None,
) -> tuple[list[c.Figure], list[str]]:
    c.check_loopback(url)
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise SystemExit("db_restart needs a PostgreSQL URL")
    host, port = parsed.host or "127.0.0.1", parsed.port or 5432
    seed = random.randrange(2**32) if seed is None else seed
    out = out or c.workdir("restart")
    previous = signal.signal(signal.SIGTERM, _terminate)
    workers: list[c.Worker] = []
    producer: c.Producer | None = None
    restart_log: list[tuple[float, float, int]] = []  # (began, ready, pg_ctlcluster status)
    codes: dict[str, int] = {}
    try:
        ensure_running(host, port)
        if prepare:
            c.prepare_database(url)
        config = c.write_config(
            out / "restart.toml",
            url,
            scheduler={"tick_interval": 0.2},
            worker={"concurrency": 4, "lease_seconds": lease, "shutdown_grace_seconds": 10},
        )
        workers = [c.Worker(config, url, out, f"w{i}") for i in range(2)]
        producer = c.Producer(url, rate, seed)
        producer.start()
        began = time.monotonic()
        for i in range(restarts):
            at = began + seconds * (i + 1) / (restarts + 1)
            time.sleep(max(0.0, at - time.monotonic()))
            t0 = time.time()
            print(f"restarting PostgreSQL ({i + 1}/{restarts})", flush=True)
            status = pg_ctl("restart").returncode
            c.wait_for(lambda: pg_ready(host, port), timeout=60, every=0.1)
            restart_log.append((t0, time.time(), status))
        time.sleep(max(0.0, began + seconds - time.monotonic()))
        producer.stop.set()
        producer.join(30)
        alive = {w.name: w.alive() for w in workers}
        queue = Scheduler(url, registry=Registry())
        try:
            drain_deadline = time.monotonic() + 3 * lease + 60
            while time.monotonic() < drain_deadline and _active(queue):
                time.sleep(0.25)
            with queue.store.read() as conn:
                db = {j.id: j for j in conn.execute(select(jobs))}
        finally:
            queue.close()
        codes = c.stop_all(workers, grace=30)
    finally:
        if producer is not None:
            producer.stop.set()
        for w in workers:
            if w.alive():
                w.kill9()
        running = ensure_running(host, port)
        signal.signal(signal.SIGTERM, previous)
    assert producer is not None
    producer.app.close()
    return analyse(out, producer, db, workers, alive, codes, restart_log, running, seed)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def _active(app: Scheduler) -> int:
    with app.store.read() as conn:
        return len(list(conn.execute(select(jobs.c.id).where(jobs.c.state.not_in(TERMINAL)))))


def analyse(
    out: Path,
    producer: c.Producer,
    db: dict[int, Any],
    workers: list[c.Worker],
    alive: dict[str, bool],
    codes: dict[str, int],
    restart_log: list[tuple[float, float, int]],
    running: bool,
    seed: int,
) -> tuple[list[c.Figure], list[str]]:
    starts: collections.Counter[int] = collections.Counter()
    dones: collections.Counter[int] = collections.Counter()
    done_times: list[float] = []
    for m in c.read_jsonl(out / "markers"):
        if m["m"] == "start":
            starts[m["job"]] += 1
        elif m["m"] == "done":
            dones[m["job"]] += 1
            done_times.append(m["t"])
    acked = dict(producer.acked.values())  # job id -> handler
    lost = [j for j in acked if j not in db or db[j].state not in TERMINAL]
    unsafe = [j for j, h in acked.items() if h == "rel.unsafe"]
    safe = [j for j, h in acked.items() if h == "rel.safe"]
    per_n = collections.Counter(json.loads(db[j].payload).get("n") for j in db)
    recovery = [
        min((t for t in done_times if t > ready), default=float("nan")) - ready
        for _, ready, _ in restart_log
    ]
    logs = [w.output() for w in workers]
    figures = [
        c.Figure("restarts", len(restart_log)),
        c.Figure("restart took (s, longest)", max((r - b for b, r, _ in restart_log), default=0.0)),
        c.Figure("first job done after restart (s)", max(recovery, default=float("nan"))),
        c.Figure("jobs acknowledged", len(acked)),
        c.Figure("enqueue attempts refused", producer.refused),
        c.Figure("jobs enqueued twice by the producer", sum(1 for n in per_n.values() if n > 1)),
        c.Figure("jobs succeeded", sum(1 for j in acked if j in db and db[j].state == "succeeded")),
        c.Figure("jobs abandoned", sum(1 for j in unsafe if db[j].last_error_code == "abandoned")),
        c.Figure("retry-safe jobs run again", sum(1 for j in safe if starts[j] > 1)),
        c.Figure("database errors logged", sum(t.count("database error") for t in logs)),
        c.Figure("tracebacks in worker logs", c.tracebacks(logs)),
        c.Figure("pg_ctlcluster failed", sum(1 for *_, s in restart_log if s != 0), True),
        c.Figure("jobs lost", len(lost), True),
        c.Figure("non-retry-safe jobs run twice", sum(1 for j in unsafe if starts[j] > 1), True),
        c.Figure(
            "succeeded without a finished handler",
            sum(1 for j in acked if j in db and db[j].state == "succeeded" and dones[j] == 0),
            True,
        ),
        c.Figure("workers died", sum(1 for a in alive.values() if not a), True),
        c.Figure("workers exited non-zero", sum(1 for v in codes.values() if v != 0), True),
        c.Figure("server left stopped", int(not running), True),
    ]
    return figures, [f"seed {seed}"]


def main() -> int:
    p = c.parser(__doc__, seconds=40.0, url=c.DEFAULT_PG)
    p.add_argument("--restarts", type=int, default=1)
    p.add_argument("--rate", type=float, default=20.0, help="jobs enqueued per second")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    if args.url:
        c.check_loopback(args.url)  # before anything is created
    out = c.workdir("restart")
    result = run(
        args.url,
        seconds=args.seconds,
        restarts=args.restarts,
        rate=args.rate,
        seed=args.seed,
        out=out,
    )
    return c.finish("db_restart", result, out, args.keep)


if __name__ == "__main__":
    sys.exit(main())
