"""Recovery probes and job.complete: what they cost.

    benchmarks/.venv/bin/python benchmarks/recovery_probes.py [--rows 10000] [--probing 100]

1. The tick's read of the probing rows (``recovery = "probe"``, disabled by the failure limit):
   R rows of which P probe, none due. Prints the read's median time, and the statements of
   an idle tick once the process has read them (the target: 1, as without probes).
2. A success recorded by ``job.complete(connection=...)`` in the handler's transaction against
   the worker's own recording: jobs per second of ``work()`` over N jobs, each way.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import _bench
from _bench import fmt, median, progress
from sqlalchemy import event, insert, update

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store import probes as _probes
from scheduler._store.tables import rows


def probing_read(url: str, total: int, probing: int, reps: int) -> tuple[float, int]:
    app = Scheduler(url, registry=Registry())
    app.migrate()
    far = datetime.now(UTC) + timedelta(days=2)
    specs = [
        TaskSpec(f"t{i:06d}", "0 3 * * *", "h", recovery="probe" if i < probing else "manual")
        for i in range(total)
    ]
    app.sync(specs)
    with app.store.begin() as conn:  # P rows disabled by the limit, their probe hours away
        conn.execute(
            update(rows)
            .where(rows.c.recovery == "probe")
            .values(
                enabled=False,
                disabled_reason="max_consecutive_failures",
                disabled_at=datetime.now(UTC),
                probe_at=far,
            )
        )
    now = datetime.now(UTC)
    times: list[float] = []
    with app.store.engine.connect() as conn:
        for _ in range(reps):
            _probes.soon(app.store)  # read every time
            began = time.perf_counter()
            _probes.sweep(app.store, conn, now, lambda _h: (3, "default"))
            times.append(time.perf_counter() - began)
    app.tick(now=now)
    statements: list[str] = []
    event.listen(app.store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    app.tick(now=now + timedelta(seconds=1))
    app.close()
    return median(times), len(statements)


def completions(url: str, jobs: int, complete: bool) -> float:
    app = Scheduler(url, registry=Registry())
    app.migrate()

    @app.handler("noop")
    def noop(job: Any) -> None:
        if complete:
            with app.store.engine.begin() as conn:
                job.complete(connection=conn)

    with app.store.begin() as conn:
        now = datetime.now(UTC) - timedelta(seconds=1)
        conn.execute(
            insert(rows.metadata.tables["scheduler_jobs"]),
            [
                {
                    "handler": "noop",
                    "payload": "{}",
                    "queue": "default",
                    "priority": 0,
                    "run_at": now,
                    "state": "queued",
                    "attempts": 0,
                    "max_attempts": 3,
                    "created_at": now,
                }
                for _ in range(jobs)
            ],
        )
    began = time.perf_counter()
    done = app.work()
    took = time.perf_counter() - began
    app.close()
    assert done == jobs, done
    return jobs / took


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=50)
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--probing", type=int, default=100)
    p.add_argument("--jobs", type=int, default=500)
    args = p.parse_args()
    scratch = _bench.scratch_dir()
    urls: dict[str, Any] = {}
    if not args.no_sqlite:
        urls["SQLite"] = lambda name: f"sqlite:///{scratch / f'{name}.db'}"
    if not args.no_pg:
        urls["PostgreSQL"] = lambda name: _bench.recreate_pg_database(args.pg, f"bench_{name}")
    print(f"R = {args.rows:,} rows, P = {args.probing} probing; N = {args.jobs} jobs")
    print(
        "database    | probing read (median) | idle tick statements | work() jobs/s: worker"
        " records | job.complete"
    )
    for db, url_of in urls.items():
        progress(f"{db}: probing rows")
        read, count = probing_read(url_of("probes"), args.rows, args.probing, args.reps)
        progress(f"{db}: completions")
        plain = completions(url_of("plain"), args.jobs, complete=False)
        own = completions(url_of("own"), args.jobs, complete=True)
        print(f"{db:<11} | {fmt(read * 1000)} ms | {count} | {plain:,.0f} | {own:,.0f}")


if __name__ == "__main__":
    main()
