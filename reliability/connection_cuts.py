"""Connections cut: PostgreSQL terminates the worker's backends at random moments, under load.

One ``scheduler worker`` process (8 threads, tick every 0.2 s, 5 s leases) runs 40 tasks due
every second (``rel.fast`` and ``rel.safe``, retry-safe) while a producer thread in this script
enqueues about 20 jobs a second, half ``rel.safe`` (retry-safe) and half ``rel.unsafe`` (not),
each with a dedupe key so that a retried enqueue cannot add a second job. The worker connects
with ``application_name = scheduler-cuts-<pid of this script>`` (set in its URL); the producer
and this script connect under other names, so only the worker's backends are cut.

Once the worker has registered (its row in ``scheduler_workers``), for ``--seconds`` (300) a
killer thread, every 0.1-1.5 s (``--every``), either

- waits (up to 1 s) for one of the worker's backends to be *inside a statement*
  (``pg_stat_activity.state = 'active'``) and terminates that one: the tick's dispatch
  (compare-and-swap and INSERT), a claim, a heartbeat, a group commit of outcomes, ...; the
  table counts these cuts by the statement they cut; or
- terminates a random half of the worker's backends, whatever they are doing (idle in a
  transaction between a claim and its first heartbeat, idle in the pool, ...),

with ``pg_terminate_backend``. Afterwards the queue is drained and everything is accounted for;
the worker must still be running at the end, and exit 0 on SIGTERM.

    python reliability/connection_cuts.py [--seconds 300] [--every 0.1 1.5] [--url URL]
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs, workers

TERMINAL = ("succeeded", "aborted")
# Per run, so that two runs (or a run and the test suite) never cut each other's worker.
WORKER_APP = f"scheduler-cuts-{os.getpid()}"
KILLER_APP = f"scheduler-cuts-killer-{os.getpid()}"
TASKS = 40
LEASE = 5.0

# What a cut statement was, by its text (pg_stat_activity.query), most specific first.
KINDS = [
    ("tick: dispatch (swap + insert)", "WITH mine AS"),
    ("tick: due rows", "FROM scheduler_rows LEFT OUTER JOIN"),
    ("claim", "WITH ready AS"),
    ("takeover: expired leases", "scheduler_jobs.lease_expires_at <="),
    ("outcomes (group commit)", "SET state=%(state)s"),
    ("outcomes (group commit)", "INSERT INTO scheduler_runs"),
    ("outcomes (group commit)", "SET state="),
    ("heartbeat", "SET lease_expires_at="),
    ("worker presence", "scheduler_workers"),
    ("clock reading", "clock_timestamp()"),
    ("commit", "COMMIT"),
]


def kind_of(query: str) -> str:
    for kind, needle in KINDS:
        if needle in query:
            return kind
    return "other: " + " ".join(query.split()[:3])


class Killer(threading.Thread):
    """Terminate the worker's backends at random moments (see the module's docstring)."""

    def __init__(self, server: str, every: tuple[float, float], seed: int) -> None:
        super().__init__(name="killer", daemon=True)
        self.engine = create_engine(
            server, isolation_level="AUTOCOMMIT", connect_args={"application_name": KILLER_APP}
        )
        self.every = every
        self.rng = random.Random(seed + 1)
        self.stop = threading.Event()
        self.mid_statement: collections.Counter[str] = collections.Counter()
        self.random_cuts = 0
        self.terminated = 0
        self.errors = 0

    def _backends(self, conn: Any, active: bool) -> list[tuple[int, str]]:
        condition = " AND state = 'active'" if active else ""
        found = conn.execute(
            text(
                "SELECT pid, query FROM pg_stat_activity WHERE application_name = :name"
                f" AND pid <> pg_backend_pid(){condition}"
            ),
            {"name": WORKER_APP},
        ).all()
        return [(int(pid), str(query or "")) for pid, query in found]

    def _terminate(self, conn: Any, pid: int) -> bool:
        done = conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
        self.terminated += bool(done)
        return bool(done)

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*self.every)):
            try:
                with self.engine.connect() as conn:
                    if self.rng.random() < 0.5:
                        deadline = time.monotonic() + 1.0
                        while time.monotonic() < deadline and not self.stop.is_set():
                            busy = self._backends(conn, active=True)
                            if busy:
                                pid, query = self.rng.choice(busy)
                                if self._terminate(conn, pid):
                                    self.mid_statement[kind_of(query)] += 1
                                break
                            time.sleep(0.002)
                    else:
                        backends = self._backends(conn, active=False)
                        chosen = [b for b in backends if self.rng.random() < 0.5] or backends[:1]
                        for pid, _query in chosen:
                            self._terminate(conn, pid)
                        self.random_cuts += bool(chosen)
            except Exception:
                self.errors += 1


def run(
    url: str,
    *,
    seconds: float = 300.0,
    every: tuple[float, float] = (0.1, 1.5),
    rate: float = 20.0,
    seed: int | None = None,
    prepare: bool = True,
    out: Path | None = None,
) -> tuple[list[c.Figure], list[str]]:
    c.check_loopback(url)
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise SystemExit("connection_cuts needs a PostgreSQL URL (pg_terminate_backend)")
    seed = random.randrange(2**32) if seed is None else seed
    out = out or c.workdir("cuts")
    previous = signal.signal(signal.SIGTERM, _terminate)
    worker: c.Worker | None = None
    producer: c.Producer | None = None
    killer: Killer | None = None
    codes: dict[str, int] = {}
    try:
        if prepare:
            c.prepare_database(url)
        tasks = [
            {
                "name": f"cut-{n:02}",
                "cron": "* * * * * *",
                "handler": "rel.fast" if n % 2 else "rel.safe",
                "payload": {"sleep": 0.02},
            }
            for n in range(TASKS)
        ]
        config = c.write_config(
            out / "cuts.toml",
            url,
            scheduler={"tick_interval": 0.2},
            worker={"concurrency": 8, "lease_seconds": LEASE, "shutdown_grace_seconds": 10},
            tasks=tasks,
        )
        synced = c.cli(config, "sync", url=url, out=out)
        if synced.returncode != 0:
            raise SystemExit(f"sync failed: {synced.stderr}")
        worker_url = parsed.update_query_dict({"application_name": WORKER_APP})
        worker = c.Worker(config, worker_url.render_as_string(False), out, "worker")
        # Cuts begin once the worker runs (it has registered): a cut during the CLI's own
        # start-up checks, before the worker loop, makes `scheduler worker` exit 1.
        if not c.wait_for(lambda: _registered(url), timeout=60, every=0.2):
            raise SystemExit("the worker did not start")
        producer = c.Producer(url, rate, seed, sleeps=(0.01, 0.3))
        killer = Killer(url, every, seed)
        producer.start()
        killer.start()
        began = time.monotonic()
        while time.monotonic() < began + seconds and worker.alive():
            time.sleep(0.5)
        killer.stop.set()
        killer.join(30)
        producer.stop.set()
        producer.join(30)
        still_running = worker.alive()
        queue = Scheduler(url, registry=Registry())
        try:
            drain_deadline = time.monotonic() + 3 * LEASE + 60
            acked = {job_id for job_id, _ in producer.acked.values()}
            while time.monotonic() < drain_deadline and _active(queue, acked):
                time.sleep(0.25)
            with queue.store.read() as conn:
                db = {j.id: j for j in conn.execute(select(jobs))}
        finally:
            queue.close()
        codes = c.stop_all([worker], grace=30)
    finally:
        for thread in (killer, producer):
            if thread is not None:
                thread.stop.set()
        if worker is not None and worker.alive():
            worker.kill9()
        signal.signal(signal.SIGTERM, previous)
    assert producer is not None and killer is not None and worker is not None
    producer.app.close()
    killer.engine.dispose()
    return analyse(out, producer, killer, db, worker, still_running, codes, seconds, seed)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def _registered(url: str) -> bool:
    """The worker has started its loop: its row is in scheduler_workers."""
    app = Scheduler(url, registry=Registry())
    try:
        with app.store.read() as conn:
            found = conn.execute(
                select(workers.c.id).where(workers.c.id.not_like("%:tick"))
            ).first()
        return found is not None
    finally:
        app.close()


def _active(app: Scheduler, acked: set[int]) -> int:
    """Jobs not yet at an end: every acknowledged job, and every task job but the rows' newest
    (the tick goes on dispatching until the worker stops)."""
    with app.store.read() as conn:
        found = conn.execute(
            select(jobs.c.id, jobs.c.task_name).where(jobs.c.state.not_in(TERMINAL))
        ).all()
    return sum(1 for job_id, task in found if task is None and job_id in acked)


def analyse(
    out: Path,
    producer: c.Producer,
    killer: Killer,
    db: dict[int, Any],
    worker: c.Worker,
    still_running: bool,
    codes: dict[str, int],
    seconds: float,
    seed: int,
) -> tuple[list[c.Figure], list[str]]:
    starts: collections.Counter[int] = collections.Counter()
    dones: collections.Counter[int] = collections.Counter()
    for m in c.read_jsonl(out / "markers"):
        if m["m"] == "start":
            starts[m["job"]] += 1
        elif m["m"] == "done":
            dones[m["job"]] += 1
    events = list(c.read_jsonl(out / "events"))
    dispatches = [e for e in events if e["e"] == "dispatch"]
    per_slot = collections.Counter((e["row"], e["slot"]) for e in dispatches)
    per_job = collections.Counter(e["job"] for e in dispatches)
    doubled = sum(n - 1 for n in per_slot.values() if n > 1)
    doubled += sum(n - 1 for n in per_job.values() if n > 1)
    task_jobs = [j for j in db.values() if j.task_name is not None]
    announced = set(per_job)
    unannounced = sum(1 for j in task_jobs if j.id not in announced)
    # A task's jobs: one per slot dispatched; two jobs of one row with the same created_at
    # would be one decision written twice.
    created = collections.Counter((j.task_name, j.created_at) for j in task_jobs)
    doubled += sum(n - 1 for n in created.values() if n > 1)
    acked = dict(producer.acked.values())  # job id -> handler
    lost = [j for j in acked if j not in db or db[j].state not in TERMINAL]
    unsafe = [j for j, h in acked.items() if h == "rel.unsafe"]
    safe = [j for j, h in acked.items() if h == "rel.safe"]
    per_n = collections.Counter(json.loads(db[j].payload).get("n") for j in db if j in acked)
    # Every job is at an end but the newest of each row (the tick dispatched until the stop),
    # which the worker's shutdown may leave claimed: those end by lease expiry and takeover.
    newest: dict[str, int] = {}
    for j in task_jobs:
        if j.id > newest.get(j.task_name, 0):
            newest[j.task_name] = j.id
    stuck = [
        j
        for j in db.values()
        if j.state == "claimed" and not (j.task_name is not None and newest[j.task_name] == j.id)
    ]
    log = worker.output()
    figures = [
        c.Figure("seconds under cuts", seconds),
        c.Figure("backends terminated", killer.terminated),
        c.Figure("cuts inside a statement", sum(killer.mid_statement.values())),
        *(
            c.Figure(f"  ... in {kind}", n)
            for kind, n in sorted(killer.mid_statement.items(), key=lambda kv: -kv[1])
        ),
        c.Figure("cuts of random backends", killer.random_cuts),
        c.Figure("task dispatches announced", len(dispatches)),
        c.Figure("task jobs committed, acknowledgement cut", unannounced),
        c.Figure("jobs acknowledged (enqueued)", len(acked)),
        c.Figure("enqueue attempts refused", producer.refused),
        c.Figure("jobs succeeded", sum(1 for j in acked if j in db and db[j].state == "succeeded")),
        c.Figure(
            "non-retry-safe jobs abandoned", sum(1 for j in unsafe if db[j].state == "aborted")
        ),
        c.Figure("retry-safe jobs run again", sum(1 for j in safe if starts[j] > 1)),
        c.Figure("database errors logged", log.count("database error")),
        c.Figure("tracebacks in the worker's log", c.tracebacks([log])),
        c.Figure("doubled slots", doubled, True),
        c.Figure("jobs enqueued twice", sum(1 for n in per_n.values() if n > 1), True),
        c.Figure("jobs lost", len(lost), True),
        c.Figure("non-retry-safe jobs run twice", sum(1 for j in unsafe if starts[j] > 1), True),
        c.Figure(
            "succeeded without a finished handler",
            sum(1 for j in acked if j in db and db[j].state == "succeeded" and dones[j] == 0),
            True,
        ),
        c.Figure("stuck claimed jobs", len(stuck), True),
        c.Figure("worker died", int(not still_running), True),
        c.Figure("worker exited non-zero", sum(1 for v in codes.values() if v != 0), True),
    ]
    notes = [f"worker still running: {'yes' if still_running else 'no'}", f"seed {seed}"]
    if killer.errors:
        notes.append(f"killer errors: {killer.errors}")
    return figures, notes


def main() -> int:
    p = c.parser(__doc__, seconds=300.0, url=c.DEFAULT_PG)
    p.add_argument("--every", type=float, nargs=2, default=(0.1, 1.5), metavar=("MIN", "MAX"))
    p.add_argument("--rate", type=float, default=20.0, help="jobs enqueued per second")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    if args.url:
        c.check_loopback(args.url)
    out = c.workdir("cuts")
    result = run(
        args.url,
        seconds=args.seconds,
        every=tuple(args.every),
        rate=args.rate,
        seed=args.seed,
        out=out,
    )
    return c.finish("connection_cuts", result, out, args.keep)


if __name__ == "__main__":
    sys.exit(main())
