"""Many workers behind PgBouncer in transaction mode: a mixed load, and nothing goes wrong.

A PgBouncer of this script's own (``_pgbouncer.py``: Debian's ``pgbouncer``, ``pool_mode =
transaction``, ``--pool`` 8 server connections in all) in front of the PostgreSQL server of
``--url``. ``--workers`` 10 ``scheduler worker`` processes (``concurrency = 8`` each: 80 job
threads, tick every 0.5 s) connect through it with ``[database] pooler = "transaction"``,
and run ``--tasks`` 40 tasks due every second (half ``rel.fast``, half ``rel.safe``, which
records each run) while a producer thread in this script, also through the pooler, enqueues
``--rate`` 40 jobs a second (half ``rel.safe``, retry-safe, half ``rel.unsafe``, not; each
with a dedupe key). After ``--seconds`` (300) the producer stops, the queue drains, the
workers stop (SIGTERM) and everything is accounted for:

- errors in the workers' logs (ERROR lines, database errors, tracebacks): must be 0;
- each slot once: two dispatches of one (task, slot), of one job, or two jobs of one slot
  must be 0; the slots of the measured window not dispatched (coalesced into a later run
  because no tick reached them in time) are shown;
- every acknowledged job at an end (lost: must be 0) and no job run twice (must be 0);
- PgBouncer's own view of its pool at the end (``SHOW POOLS``), and its log's errors.

    python reliability/pooler_load.py [--seconds 300] [--workers 10] [--pool 8] [--url URL]

``--url`` is the PostgreSQL server and database behind the pooler (its scheduler tables are
emptied; default ``scheduler_reliability`` on 127.0.0.1:5432).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import _pgbouncer

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs, workers

TERMINAL = ("succeeded", "aborted")
LEASE = 30.0
POOLER_ENV = "SCHEDULER_DATABASE_POOLER"
ERROR_MARKS = (" ERROR ", "database error", "Traceback (most recent call last)")


def run(
    url: str,
    *,
    seconds: float = 300.0,
    workers_count: int = 10,
    concurrency: int = 8,
    pool: int = 8,
    tasks: int = 40,
    rate: float = 40.0,
    seed: int | None = None,
    prepare: bool = True,
    out: Path | None = None,
) -> tuple[list[c.Figure], list[str]]:
    c.check_loopback(url)
    direct = make_url(url)
    if direct.get_backend_name() != "postgresql" or not direct.database:
        raise SystemExit("pooler_load needs a PostgreSQL URL with a database")
    seed = random.randrange(2**32) if seed is None else seed
    out = out or c.workdir("pooler")
    if prepare:
        c.prepare_database(url)
    bouncer = _pgbouncer.PgBouncer(
        {direct.database: (direct.database, _search_path(direct))},
        server_host=direct.host or "127.0.0.1",
        server_port=direct.port or 5432,
        pool_size=pool,
    ).start()
    pooled = bouncer.url(direct.database)
    previous = signal.signal(signal.SIGTERM, _terminate)
    running: list[c.Worker] = []
    producer: c.Producer | None = None
    codes: dict[str, int] = {}
    pools: list[dict[str, Any]] = []
    try:
        config = c.write_config(
            out / "pooler.toml",
            pooled,
            database={"pooler": "transaction"},
            scheduler={"tick_interval": 0.5},
            worker={
                "concurrency": concurrency,
                "lease_seconds": LEASE,
                "shutdown_grace_seconds": 15,
            },
            tasks=[
                {
                    "name": f"pool-{n:02}",
                    "cron": "* * * * * *",
                    "handler": "rel.fast" if n % 2 else "rel.safe",
                    "payload": {"sleep": 0.02},
                }
                for n in range(tasks)
            ],
        )
        synced = c.cli(config, "sync", url=pooled, out=out)
        if synced.returncode != 0:
            raise SystemExit(f"sync failed: {synced.stderr}")
        running = [
            c.Worker(config, pooled, out, f"worker-{n:02}", level="INFO")
            for n in range(workers_count)
        ]
        if not c.wait_for(lambda: _registered(url) >= workers_count, timeout=120, every=0.5):
            raise SystemExit("the workers did not start")
        producer = _PooledProducer(pooled, rate, seed)
        producer.start()
        window_start = time.time() + 2
        time.sleep(seconds)
        window_end = time.time() - 2
        producer.stop.set()
        producer.join(30)
        alive = [w.name for w in running if w.alive()]
        queue = Scheduler(url, registry=Registry())
        try:
            deadline = time.monotonic() + 120
            acked = {job_id for job_id, _ in producer.acked.values()}
            while time.monotonic() < deadline and _active(queue, acked):
                time.sleep(0.5)
            codes = c.stop_all(running, grace=60)
            with queue.store.read() as conn:
                db = {j.id: j for j in conn.execute(select(jobs))}
        finally:
            queue.close()
        pools = _show_pools(bouncer)
    finally:
        if producer is not None:
            producer.stop.set()
        for w in running:
            if w.alive():
                w.kill9()
        signal.signal(signal.SIGTERM, previous)
        bouncer_log = bouncer.log_path.read_text() if bouncer.log_path.exists() else ""
        bouncer.stop()
    assert producer is not None
    producer.app.close()
    figures, notes = analyse(
        out, producer, db, running, alive, codes, window_start, window_end, bouncer_log, pools
    )
    figures.insert(
        1, c.Figure("worker processes x job threads", f"{workers_count} x {concurrency}")
    )
    return figures, [*notes, f"seed {seed}"]


class _PooledProducer(c.Producer):
    """The producer, through the pooler: its Scheduler knows it is behind one."""

    def __init__(self, url: str, rate: float, seed: int) -> None:
        saved = os.environ.get(POOLER_ENV)
        os.environ[POOLER_ENV] = "transaction"
        try:
            super().__init__(url, rate, seed, sleeps=(0.01, 0.2))
        finally:
            if saved is None:
                os.environ.pop(POOLER_ENV, None)
            else:
                os.environ[POOLER_ENV] = saved


def _search_path(url: Any) -> str | None:
    """The schema a URL's ``options=-csearch_path=X`` chooses (PgBouncer does not pass
    ``options`` on: its server connections get it with ``connect_query``), else None."""
    options = url.query.get("options", "")
    for part in (options if isinstance(options, str) else " ".join(options)).split():
        if part.startswith("-csearch_path="):
            return str(part.split("=", 1)[1])
    return None


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def _registered(url: str) -> int:
    app = Scheduler(url, registry=Registry())
    try:
        with app.store.read() as conn:
            found = conn.execute(select(workers.c.id).where(workers.c.id.not_like("%:tick")))
            return len(found.all())
    finally:
        app.close()


def _active(app: Scheduler, acked: set[int]) -> int:
    with app.store.read() as conn:
        found = conn.execute(select(jobs.c.id).where(jobs.c.state.not_in(TERMINAL))).all()
    return sum(1 for (job_id,) in found if job_id in acked)


def _show_pools(bouncer: _pgbouncer.PgBouncer) -> list[dict[str, Any]]:
    """PgBouncer's ``SHOW POOLS`` (its admin console, database ``pgbouncer``; SQLAlchemy's
    dialect set-up queries do not run there, so psycopg itself)."""
    import psycopg

    conninfo = f"host=127.0.0.1 port={bouncer.port} user={_pgbouncer.USER} dbname=pgbouncer"
    try:
        with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
            cursor = conn.execute("SHOW POOLS")
            names = [d.name for d in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    except psycopg.Error:  # the figures stand without it
        return []


def analyse(
    out: Path,
    producer: c.Producer,
    db: dict[int, Any],
    running: list[c.Worker],
    alive: list[str],
    codes: dict[str, int],
    window_start: float,
    window_end: float,
    bouncer_log: str,
    pools: list[dict[str, Any]],
) -> tuple[list[c.Figure], list[str]]:
    starts: collections.Counter[int] = collections.Counter()
    for m in c.read_jsonl(out / "markers"):
        if m["m"] == "start":
            starts[m["job"]] += 1
    dispatches = [e for e in c.read_jsonl(out / "events") if e["e"] == "dispatch"]
    per_slot = collections.Counter((e["row"], e["slot"]) for e in dispatches)
    per_job = collections.Counter(e["job"] for e in dispatches)
    doubled = sum(n - 1 for n in per_slot.values() if n > 1)
    doubled += sum(n - 1 for n in per_job.values() if n > 1)
    task_jobs = [j for j in db.values() if j.task_name is not None]
    per_db_slot = collections.Counter((j.task_name, j.slot) for j in task_jobs)
    doubled += sum(n - 1 for n in per_db_slot.values() if n > 1)
    rows = sorted({j.task_name for j in task_jobs})
    seconds = range(int(window_start) + 1, int(window_end))
    seen = {(e["row"], int(e["slot"])) for e in dispatches}
    due = [(row, s) for row in rows for s in seconds]
    missing = sum(1 for key in due if key not in seen)
    acked = dict(producer.acked.values())
    lost = [j for j in acked if j not in db or db[j].state not in TERMINAL]
    per_n = collections.Counter(json.loads(db[j].payload).get("n") for j in db if j in acked)
    logs = [w.output() for w in running]
    errors = sum(
        line.count(mark) for log in logs for line in log.splitlines() for mark in ERROR_MARKS
    )
    succeeded = sum(1 for j in db.values() if j.state == "succeeded")
    span = max(window_end - window_start + 4, 1)
    bouncer_errors = sum(1 for line in bouncer_log.splitlines() if " ERROR " in line)
    figures = [
        c.Figure("seconds", round(span)),
        c.Figure("slots due in the window", len(due)),
        c.Figure("slots dispatched", len(per_slot)),
        c.Figure("slots not dispatched (coalesced)", missing),
        c.Figure("jobs acknowledged (enqueued)", len(acked)),
        c.Figure("enqueue attempts refused", producer.refused),
        c.Figure("jobs succeeded (all)", succeeded),
        c.Figure("jobs per second", round(succeeded / span, 1)),
        c.Figure("pgbouncer log errors", bouncer_errors),
        c.Figure("errors in the workers' logs", errors, True),
        c.Figure("doubled slots", doubled, True),
        c.Figure("jobs enqueued twice", sum(1 for n in per_n.values() if n > 1), True),
        c.Figure("jobs lost", len(lost), True),
        c.Figure("jobs run twice", sum(1 for n in starts.values() if n > 1), True),
        c.Figure("workers died", len(running) - len(alive), True),
        c.Figure("workers exited non-zero", sum(1 for v in codes.values() if v != 0), True),
    ]
    notes = []
    for pool in pools:
        if pool.get("database") not in (None, "pgbouncer"):
            notes.append(
                "pgbouncer pool {database}: server connections active {sv_active}, idle"
                " {sv_idle}, used {sv_used}; clients waiting {cl_waiting}".format(**pool)
            )
    return figures, notes


def main() -> int:
    p = c.parser(__doc__, seconds=300.0, url=c.DEFAULT_PG)
    p.add_argument("--workers", type=int, default=10, help="worker processes")
    p.add_argument("--concurrency", type=int, default=8, help="job threads per worker")
    p.add_argument("--pool", type=int, default=8, help="PgBouncer's server connections")
    p.add_argument("--tasks", type=int, default=40, help="tasks due every second")
    p.add_argument("--rate", type=float, default=40.0, help="jobs enqueued per second")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    out = c.workdir("pooler")
    result = run(
        args.url,
        seconds=args.seconds,
        workers_count=args.workers,
        concurrency=args.concurrency,
        pool=args.pool,
        tasks=args.tasks,
        rate=args.rate,
        seed=args.seed,
        out=out,
    )
    return c.finish("pooler_load", result, out, args.keep)


if __name__ == "__main__":
    sys.exit(main())
