"""Bursts at the top of the hour: N scheduler rows due at the same instant, dispatched by 1
tick and by several processes ticking at once, beside APScheduler 3.11 on the same burst.

    benchmarks/.venv/bin/python benchmarks/burst.py [--rows 100000] [--reps 1] [--workers 4]

Every row has ``0 * * * *`` and ``next_run_at`` at the same past instant. A case resets them
(no jobs, version 1), then starts its processes together; each runs one ``tick()`` (a tick
goes through every due row it sees). Counted afterwards, in the database: every row has
exactly one job and has moved to its next slot. Counted in the processes: the dispatch
statements sent (one per fresh dispatch attempted) and the races lost. Targets (issue 12):
every slot dispatched once; W workers no slower than 1 (within 10 %); lost races <= 5 % of the
dispatch statements. APScheduler: one ``_process_jobs()`` over its SQLAlchemyJobStore holding
the same N due cron jobs, with a no-op executor (it has no way for several schedulers to share
a job store). PostgreSQL databases ``bench_burst_*`` (plus ``$SCHEDULER_BENCH_SUFFIX``) are
created and dropped here; SQLite files live in a temporary folder.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import _bench
from _bench import fmt, median, progress
from sqlalchemy import delete, event, func, insert, select, text, update
from sqlalchemy.engine import make_url

from scheduler import Scheduler
from scheduler._store.engine import make_engine

try:
    from scheduler._store.tables import jobs, rows
except ImportError:  # the layout before the store became a package (an A/B run)
    from scheduler._tables import jobs, rows  # type: ignore[import-not-found,no-redef]

HANDLER = "bench.noop"
CRON = "0 * * * *"
CHUNK = 10_000


def top_of_the_hour() -> tuple[datetime, datetime]:
    """The instant every row is due at, and the `now` every tick of the run is given."""
    now = datetime.now(UTC).replace(microsecond=0)
    due = now.replace(minute=0, second=0) - timedelta(hours=1)
    return due, due + timedelta(seconds=30)


def make_app(url: str) -> Scheduler:
    """A Scheduler on `url`; a URL of the pooler this script starts (``POOLED`` in its query)
    gets no server-side prepared statements (``prepare_threshold=None``), as a transaction
    pooler needs."""
    if POOLED in url:
        plain = url.replace("?" + POOLED, "")
        engine = make_engine(
            plain,
            connect_args={"prepare_threshold": None, "application_name": "scheduler-burst"},
        )
        app = Scheduler(engine=engine)
    else:
        app = Scheduler(url)
    app.handler(HANDLER, retry_safe=True)(_bench.noop)
    return app


POOLED = "bench_pooled=1"  # marks a URL of the pooler (removed before connecting)


def load(url: str, n: int, due: datetime, cron: str = CRON) -> None:
    app = make_app(url)
    try:
        app.migrate()
        with app.store.begin() as conn:
            conn.execute(delete(jobs))
            conn.execute(delete(rows))
            for start in range(0, n, CHUNK):
                conn.execute(
                    insert(rows),
                    [
                        {
                            "name": f"customer-{i:07d}",
                            "handler": HANDLER,
                            "payload": "{}",
                            "cron": cron,
                            "timezone": "UTC",
                            "concurrent": False,
                            "enabled": True,
                            "next_run_at": due,
                            "consecutive_failures": 0,
                            "version": 1,
                            "created_at": due,
                            "updated_at": due,
                        }
                        for i in range(start, min(n, start + CHUNK))
                    ],
                )
    finally:
        app.close()


def reset(url: str, due: datetime, vacuum: bool = True) -> None:
    """Every row due again at `due`, no jobs; dead rows vacuumed (PostgreSQL) unless not
    `vacuum`."""
    app = make_app(url)
    try:
        with app.store.begin() as conn:
            conn.execute(update(rows).values(last_job_id=None))
            conn.execute(delete(jobs))
            conn.execute(update(rows).values(next_run_at=due, version=1, consecutive_failures=0))
        engine = app.store.engine
        if engine.dialect.name == "postgresql" and vacuum:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE scheduler_rows"))  # not in a transaction
                conn.execute(text("VACUUM ANALYZE scheduler_jobs"))
        else:
            with engine.connect() as conn:
                conn.execute(text("ANALYZE"))
                conn.commit()
        if engine.dialect.name == "postgresql":
            _bench.checkpoint_pg(url)
    finally:
        app.close()


def check(url: str, n: int, due: datetime) -> tuple[int, int, int]:
    """(jobs, rows with exactly one job, rows still due): exactly once is (n, n, 0)."""
    app = make_app(url)
    try:
        with app.store.read() as conn:
            total = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
            per_row = (
                select(jobs.c.task_name).group_by(jobs.c.task_name).having(func.count() == 1)
            ).subquery()
            once = conn.execute(select(func.count()).select_from(per_row)).scalar_one()
            still = conn.execute(
                select(func.count()).select_from(rows).where(rows.c.next_run_at <= due)
            ).scalar_one()
        return int(total), int(once), int(still)
    finally:
        app.close()


# -- one ticking process ------------------------------------------------------------------------
def _ticker(url: str, now: datetime, loop: bool, ready: Any, start: Any, results: Any) -> None:
    try:
        app = make_app(url)
        app.tick(now=now - timedelta(days=1))  # warm-up: connections, caches; nothing is due
        counts = {"dispatch": 0, "statements": 0}

        def count(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
            counts["statements"] += 1
            if "INSERT INTO scheduler_jobs" in statement:
                counts["dispatch"] += 1  # one per fresh dispatch attempted, won or lost

        event.listen(app.store.engine, "before_cursor_execute", count)
        ready.put(None)
        start.wait()
        began, cpu = time.monotonic(), time.process_time()
        dispatched = lost = held = ticks = 0
        while True:  # --loop: until a tick finds nothing (the clock's now); else one tick
            report = app.tick() if loop else app.tick(now=now)
            ticks += 1
            dispatched += len(report.dispatched)
            lost += len(report.lost_race)
            held += len(report.held_back)
            if not loop or not report:
                break
        finished = time.monotonic()
        results.put(
            {
                "dispatched": dispatched,
                "lost": lost,
                "held": held,
                "ticks": ticks,
                "dispatch": counts["dispatch"],
                "statements": counts["statements"],
                "began": began,
                "finished": finished,
                "cpu": time.process_time() - cpu,
                "error": None,
            }
        )
        app.close()
    except BaseException as exc:  # report, never leave the parent waiting
        ready.put(None)
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def run_ticks(url: str, now: datetime, processes: int, loop: bool = False) -> dict[str, Any]:
    """`processes` fresh processes each run one tick, started together; the wall time from
    the common start to the last finish, and the summed counts."""
    procs, results, began = _bench.start_together(_ticker, (url, now, loop), processes, "ticking")
    found = [results.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    errors = [r["error"] for r in found if r["error"]]
    if errors:
        raise RuntimeError("ticking process failed: " + "; ".join(errors))
    total = {k: sum(r[k] for r in found) for k in ("dispatched", "lost", "dispatch", "cpu")}
    total["statements"] = sum(r["statements"] for r in found)
    total["seconds"] = max(r["finished"] for r in found) - began
    total["per_process"] = sorted(r["dispatched"] for r in found)
    return total


# -- APScheduler 3.11 ---------------------------------------------------------------------------
def aps_burst(url: str, n: int, due: datetime) -> dict[str, Any]:
    """APScheduler's one `_process_jobs()` over n cron jobs due at `due` (tick_cost's harness,
    the same trigger as ours)."""
    import tick_cost

    tick_cost.CRON = CRON
    aps = tick_cost.Aps(url)
    try:
        aps.load(n, due)  # every job's next run time is `due`, an hour or so ago
        began, cpu = time.monotonic(), time.process_time()
        submitted, statements = aps.tick()
        seconds, cpu = time.monotonic() - began, time.process_time() - cpu
        with aps.engine.connect() as conn:
            table = aps.store.jobs_t
            still = conn.execute(
                select(func.count())
                .select_from(table)
                .where(table.c.next_run_time <= due.timestamp())
            ).scalar_one()
        return {
            "seconds": seconds,
            "cpu": cpu,
            "dispatched": submitted,
            "statements": statements,
            "still": int(still),
        }
    finally:
        aps.close()


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=1)
    p.add_argument("--rows", type=int, default=100_000, help="rows due at once (default 100000)")
    p.add_argument("--workers", type=int, default=4, help="processes ticking at once (default 4)")
    p.add_argument("--no-aps", action="store_true", help="skip APScheduler")
    p.add_argument(
        "--aps-rows",
        type=int,
        default=0,
        help="APScheduler's burst size, if not --rows (it dispatches 5-10x slower than ours)",
    )
    p.add_argument(
        "--loop",
        action="store_true",
        help="each process calls app.tick() (the clock's now) until a tick finds nothing,"
        " instead of one tick (issue 25); the rows' schedule is then yearly, due a minute ago",
    )
    p.add_argument(
        "--url",
        help="PostgreSQL database to use as it is (its scheduler tables are emptied), instead of"
        " creating bench_burst_ours from --pg",
    )
    p.add_argument(
        "--pooler",
        action="store_true",
        help="also run the PostgreSQL cases through a pgbouncer (transaction mode) this script"
        " starts on a free port",
    )
    p.add_argument(
        "--pool-size", type=int, default=20, help="the pooler's default_pool_size (default 20)"
    )
    p.add_argument(
        "--no-vacuum",
        action="store_true",
        help="PostgreSQL: no VACUUM ANALYZE after each reset (the reset's dead rows stay)",
    )
    args = p.parse_args()
    n = args.rows
    due, now = top_of_the_hour()
    cron = CRON
    if args.loop:
        cron = "0 0 1 1 *"  # no slot passes during the run: every dispatch is a fresh one
        now = datetime.now(UTC).replace(microsecond=0)
        due = now - timedelta(minutes=1)
    scratch = _bench.scratch_dir()
    load_before = _bench.load()
    table: list[list[Any]] = []
    dbs: list[tuple[str, str, str, list[int]]] = []
    bouncer: _bench.PgBouncer | None = None
    if not args.no_pg:
        if args.url:
            ours = args.url
            args.no_aps = True
        else:
            ours = _bench.recreate_pg_database(args.pg, "bench_burst_ours")
        aps = "" if args.no_aps else _bench.recreate_pg_database(args.pg, "bench_burst_aps")
        dbs.append(("PostgreSQL", ours, aps, [1, args.workers]))
        if args.pooler:
            bouncer = _bench.PgBouncer(ours, pool_size=args.pool_size)
            database = make_url(ours).database or ""
            through = bouncer.url(database) + "?" + POOLED
            dbs.append(
                (
                    f"PostgreSQL via pgbouncer (pool {args.pool_size})",
                    through,
                    "",
                    [1, args.workers],
                )
            )
    if not args.no_sqlite:
        dbs.append(
            (
                "SQLite",
                f"sqlite:///{scratch / 'burst.db'}",
                f"sqlite:///{scratch / 'burst-aps.db'}",
                [1],
            )
        )

    def done(row: list[Any]) -> None:
        table.append(row)
        progress("row: " + " | ".join(str(c) for c in row))  # kept if the run is cut short

    for db, url, aps_url, worker_counts in dbs:
        progress(f"{db}: loading {n:,} rows due at {due:%H:%M}")
        direct = ours if POOLED in url else url  # set-up and checks go straight to the server
        load(direct, n, due, cron)
        cells: dict[int, list[dict[str, Any]]] = {w: [] for w in worker_counts}
        for rep in range(args.reps):
            for workers in worker_counts:  # interleaved: load elsewhere lands on both
                reset(direct, due, vacuum=not args.no_vacuum)
                progress(f"{db}: {workers} process(es) ticking, rep {rep + 1}")
                result = run_ticks(url, now, workers, args.loop)
                result["check"] = check(direct, n, due)
                cells[workers].append(result)
        for workers, results in cells.items():
            seconds = median([r["seconds"] for r in results])
            last = results[-1]
            lost = sum(r["lost"] for r in results)
            sent = sum(r["dispatch"] for r in results)
            once = all(r["check"] == (n, n, 0) for r in results)
            base = median([r["seconds"] for r in cells[1]])
            done(
                [
                    db,
                    "ours",
                    workers,
                    fmt(seconds),
                    fmt(n / seconds),
                    fmt(median([r["cpu"] for r in results])),
                    f"{last['check'][0]:,} jobs, {last['check'][1]:,} rows once, "
                    f"{last['check'][2]} due" + (" ✓" if once else " ✗"),
                    f"{sent / len(results):,.0f}",
                    f"{lost / len(results):,.0f} ({100 * lost / max(sent, 1):.2f} %)"
                    + (" (<=5 %)" if workers > 1 else ""),
                    "/".join(f"{d:,}" for d in last["per_process"]),
                    f"{seconds / base:.2f}x" + (" (<=1.10x)" if workers > 1 else ""),
                ]
            )
        if not args.no_aps and aps_url:
            aps_n = args.aps_rows or n
            progress(f"{db}: APScheduler, {aps_n:,} jobs")
            result = aps_burst(aps_url, aps_n, due)
            once = result["dispatched"] == aps_n and result["still"] == 0
            done(
                [
                    db,
                    "APScheduler 3.11" + (f" ({aps_n:,} jobs)" if aps_n != n else ""),
                    1,
                    fmt(result["seconds"]),
                    fmt(aps_n / result["seconds"]),
                    fmt(result["cpu"]),
                    f"{result['dispatched']:,} submitted, {result['still']} due"
                    + (" ✓" if once else " ✗"),
                    "-",
                    "-",
                    "-",
                    "-",
                ]
            )
    if bouncer is not None:
        bouncer.close()
    if not args.no_pg and not args.url:
        _bench.drop_pg_database(args.pg, "bench_burst_ours")
    if not args.no_pg and aps:
        _bench.drop_pg_database(args.pg, "bench_burst_aps")
    _bench.print_table(
        f"Burst: {n:,} rows due at the same instant, median of {args.reps}"
        f" ({_bench.machine()}; load average {load_before} before, {_bench.load()} after)",
        [
            "db",
            "system",
            "processes",
            "s",
            "rows/s",
            "CPU s (all processes)",
            "exactly once",
            "dispatch statements",
            "lost races",
            "dispatched per process",
            "vs 1 process",
        ],
        table,
    )


if __name__ == "__main__":
    main()
