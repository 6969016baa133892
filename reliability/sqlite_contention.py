"""SQLite contention: five processes and a producer write one SQLite file at once.

Four ``scheduler worker`` processes (4 job threads each, ticking too) and one ticking-only
scheduler process (``scheduler worker --concurrency 0``) share one SQLite file with 60 tasks on
second-level crons (fast, failing and flaky handlers), while a producer thread in this script
enqueues ad-hoc jobs as fast as the database takes them (up to ``--rate`` a second). Every
"database is locked" that reaches a user is counted: in the processes' logs (stderr) and as
exceptions raised to the producer.

    python reliability/sqlite_contention.py [--seconds 30] [--url sqlite:///FILE]
"""

from __future__ import annotations

import collections
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs

LOCKED = re.compile(r"database (table )?is locked|SQLITE_BUSY", re.IGNORECASE)


def make_tasks(count: int) -> list[dict[str, Any]]:
    tasks = []
    for i in range(count):
        task: dict[str, Any] = {"name": f"busy-{i:02d}", "cron": "* * * * * *"}
        if i % 10 == 8:
            task.update(handler="rel.fail", max_consecutive_failures=3)
        elif i % 10 == 9:
            task.update(handler="rel.flaky", payload={"p": 0.3}, max_consecutive_failures=5)
        else:
            task["handler"] = "rel.fast"
        tasks.append(task)
    return tasks


class Producer(threading.Thread):
    def __init__(self, url: str, rate: float) -> None:
        super().__init__(name="producer", daemon=True)
        self.app = Scheduler(url, registry=Registry())
        self.rate = rate
        self.stop = threading.Event()
        self.enqueued = 0
        self.errors: collections.Counter[str] = collections.Counter()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.app.enqueue("rel.fast", {"n": self.enqueued})
                self.enqueued += 1
            except Exception as exc:  # counted, never hidden
                self.errors["locked" if LOCKED.search(str(exc)) else type(exc).__name__] += 1
            self.stop.wait(1.0 / self.rate)


def run(
    url: str,
    *,
    seconds: float = 30.0,
    workers: int = 4,
    rows: int = 60,
    rate: float = 50.0,
    prepare: bool = True,
    out: Path | None = None,
) -> tuple[list[c.Figure], list[str]]:
    if not c.is_sqlite(url):
        raise SystemExit("sqlite_contention needs a sqlite:/// URL")
    if prepare:
        c.prepare_database(url)
    out = out or c.workdir("sqlite")
    config = c.write_config(
        out / "sqlite.toml",
        url,
        scheduler={"tick_interval": 0.2, "backoff_base_seconds": 0.5, "backoff_max_seconds": 2},
        worker={"concurrency": 4, "lease_seconds": 30, "shutdown_grace_seconds": 10},
        tasks=make_tasks(rows),
    )
    synced = c.cli(config, "sync", url=url, out=out)
    if synced.returncode != 0:
        raise SystemExit(f"scheduler sync failed: {synced.stderr.strip()}")
    procs = [c.Worker(config, url, out, "ticker", "--concurrency", "0")]
    procs += [c.Worker(config, url, out, f"w{i}") for i in range(workers)]
    producer = Producer(url, rate)
    try:
        c.wait_for(
            lambda: sum(1 for r in c.read_jsonl(out / "events") if r["e"] == "ready") >= len(procs),
            timeout=60,
        )
        producer.start()
        time.sleep(seconds)
    finally:
        producer.stop.set()
        producer.join(30)
        codes = c.stop_all(procs, grace=30)
    try:
        with producer.app.store.read() as conn:
            states = collections.Counter(j.state for j in conn.execute(select(jobs.c.state)))
    finally:
        producer.app.close()
    logs = {w.name: w.output() for w in procs}
    locked_lines = sum(1 for t in logs.values() for line in t.splitlines() if LOCKED.search(line))
    records = list(c.read_jsonl(out / "events"))
    events = collections.Counter(r["e"] for r in records)
    slots = collections.Counter((r["row"], r["slot"]) for r in records if r["e"] == "dispatch")
    disables = collections.Counter(r["row"] for r in records if r["e"] == "disabled")
    figures = [
        c.Figure("processes on the file", len(procs)),
        c.Figure("seconds", seconds),
        c.Figure("dispatched by ticks", events["dispatch"] + events["rerun"]),
        c.Figure("ad-hoc jobs enqueued", producer.enqueued),
        c.Figure("jobs succeeded", states["succeeded"]),
        c.Figure("jobs aborted", states["aborted"]),
        c.Figure("jobs still queued", states["queued"]),
        c.Figure("rows disabled (signalled)", events["disabled"]),
        c.Figure("slots dispatched twice", sum(n - 1 for n in slots.values()), True),
        c.Figure("disables signalled more than once", sum(n - 1 for n in disables.values()), True),
        c.Figure('"database is locked" in logs', locked_lines, True),
        c.Figure('"database is locked" raised to the producer', producer.errors["locked"], True),
        c.Figure(
            "other producer errors", sum(producer.errors.values()) - producer.errors["locked"], True
        ),
        c.Figure(
            "database errors in logs", sum(t.count("database error") for t in logs.values()), True
        ),
        c.Figure("tracebacks in logs", c.tracebacks(logs.values()), True),
        c.Figure("jobs left claimed", states["claimed"], True),
        c.Figure("processes exited non-zero", sum(1 for v in codes.values() if v != 0), True),
    ]
    return figures, []


def main() -> int:
    p = c.parser(__doc__, seconds=30.0, url=None)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rate", type=float, default=50.0, help="ad-hoc jobs enqueued per second")
    args = p.parse_args()
    if args.url:
        c.check_loopback(args.url)  # before anything is created
    out = c.workdir("sqlite")
    url = args.url or f"sqlite:///{out / 'contention.db'}"
    result = run(url, seconds=args.seconds, workers=args.workers, rate=args.rate, out=out)
    return c.finish("sqlite_contention", result, out, args.keep)


if __name__ == "__main__":
    sys.exit(main())
