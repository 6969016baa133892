"""A held MVCC horizon beside a steady queue: does the queue keep up (issue 25)?

    .venv/bin/python benchmarks/held_horizon.py [--minutes 10] [--hold 2:8] [--rate N]

First one worker's maximum throughput is measured (``--max-jobs`` no-op jobs drained by one
``Worker(concurrency=--concurrency)``), unless ``--rate`` is given. Then, for ``--minutes``,
a producer process enqueues no-op jobs at ``--fraction`` (default 60 %) of that rate, one
``enqueue()`` per job as an application would, while one worker process (the real
``Worker`` loop, ``--concurrency`` threads) runs them. From ``--hold`` minute A to minute B a
``REPEATABLE READ`` transaction that has taken its snapshot sits idle on the same database
(``application_name`` ``held-horizon-report``): the MVCC horizon is pinned, so no dead row
version younger than its snapshot can be vacuumed away.

Every ``--interval`` seconds (default 10) a line: the backlog (queued jobs ready to run), the
jobs enqueued and done per second, the claim statement's time as the worker saw it (p50 and
p99, in ms, timed around the cursor's execute in the worker process; the take-over's look for
expired leases likewise), the dead tuples of each scheduler table (``pg_stat_user_tables``,
``n_dead_tup``) and the load average. Then a summary against the targets: throughput during
the hold >= 90 % of the producer's rate, claim p99 during the hold <= 5x its value before,
and normal again within one minute of the release.

PostgreSQL only. By default on a cluster of the script's own (``initdb`` on a free port, the
server's defaults: autovacuum on, which the vacuum side of this needs), removed at the end;
``--pg URL`` creates the database ``bench_held_horizon`` (plus ``$SCHEDULER_BENCH_SUFFIX``) on
that server instead, ``--url`` uses a database as it is (its jobs are deleted).
``--statements`` (own cluster) loads ``pg_stat_statements`` and prints the costliest
statements of the time before the hold, the hold, and the minute after it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import _bench
from _bench import fmt, progress
from sqlalchemy import create_engine, event, text

from scheduler import Scheduler
from scheduler._worker.worker import Worker

HANDLER = "bench.noop"
TABLES = ("scheduler_jobs", "scheduler_runs", "scheduler_rows", "scheduler_decisions")
SHORT = {
    "scheduler_jobs": "jobs",
    "scheduler_runs": "runs",
    "scheduler_rows": "rows",
    "scheduler_decisions": "decisions",
}
HOLDER_NAME = "held-horizon-report"


def make_app(url: str) -> Scheduler:
    app = Scheduler(url)
    app.handler(HANDLER, retry_safe=True)(_bench.noop)
    return app


def _kind(statement: str) -> str | None:
    """Which of the worker's statements this is: the claim, the look for expired leases."""
    head = statement.lstrip()[:400]
    if "AS MATERIALIZED" in head and "UPDATE scheduler_jobs" in statement:
        return "cursor" if "p_after_id" in statement else "claim"
    if head.startswith("SELECT") and "scheduler_jobs.lease_expires_at <=" in statement:
        return "expired"
    return None


# -- the worker process -------------------------------------------------------------------------
def _worker(url: str, concurrency: int, stop: Any, timings: Any, ready: Any) -> None:
    """The real worker loop; every second, the statement times it measured go to `timings`."""
    app = make_app(url)
    times: dict[str, list[float]] = {"claim": [], "cursor": [], "expired": []}
    lock = threading.Lock()

    def before(conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        kind = _kind(statement)
        if kind is not None:
            conn.info["held_horizon_timer"] = (kind, time.perf_counter())

    def after(conn: Any, _cursor: Any, _statement: str, *_rest: Any) -> None:
        found = conn.info.pop("held_horizon_timer", None)
        if found is not None:
            kind, began = found
            with lock:
                times[kind].append(time.perf_counter() - began)

    event.listen(app.store.engine, "before_cursor_execute", before)
    event.listen(app.store.engine, "after_cursor_execute", after)
    worker = Worker(app, concurrency=concurrency)

    def report() -> None:
        while not stop.wait(1.0):
            with lock:
                taken = {k: v[:] for k, v in times.items()}
                for v in times.values():
                    v.clear()
            timings.put((time.monotonic(), taken))
        worker.stop()

    threading.Thread(target=report, daemon=True).start()
    ready.put(None)
    worker.run()
    app.close()


# -- the producer process -----------------------------------------------------------------------
def _producer(url: str, rate: float, threads: int, stop: Any, sent: Any, ready: Any) -> None:
    """Enqueue at `rate` jobs a second, one enqueue() each, paced on a 50 ms grid, from
    `threads` threads (an application's request handlers)."""
    app = make_app(url)
    app.check_schema()
    ready.put(None)
    began = time.monotonic()
    lock = threading.Lock()
    done = [0]

    def enqueue() -> None:
        while not stop.is_set():
            with lock:
                due = int((time.monotonic() - began) * rate)
                mine = done[0] < due
                if mine:
                    done[0] += 1
            if not mine:
                time.sleep(0.05)
                continue
            app.enqueue(HANDLER, {})
            with sent.get_lock():
                sent.value += 1

    workers = [threading.Thread(target=enqueue) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    app.close()


# -- measuring the worker's maximum -------------------------------------------------------------
def max_rate(url: str, jobs: int, concurrency: int) -> float:
    """Jobs a second one worker drains from a full queue (no producer)."""
    app = make_app(url)
    app.migrate()
    now = datetime.now(UTC) - timedelta(seconds=1)
    with app.store.begin() as conn:
        conn.execute(text("DELETE FROM scheduler_runs"))
        conn.execute(text("DELETE FROM scheduler_jobs"))
    from scheduler._store.jobs import new_job_values
    from scheduler._store.tables import jobs as jobs_table

    with app.store.begin() as conn:
        for start in range(0, jobs, 5000):
            conn.execute(
                jobs_table.insert(),
                [
                    new_job_values(handler=HANDLER, payload="{}", now=now)
                    for _ in range(min(5000, jobs - start))
                ],
            )
    vacuum(url)
    began = time.monotonic()
    handled = Worker(app, concurrency=concurrency).run(once=True).handled
    seconds = time.monotonic() - began
    app.close()
    return handled / seconds


def vacuum(url: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for table in TABLES:
            conn.execute(text(f"VACUUM ANALYZE {table}"))
    engine.dispose()


# -- the run ------------------------------------------------------------------------------------
def top_statements(engine: Any, phase: str) -> None:
    """The statements that took the most server time since the last call (then reset)."""
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT calls, total_exec_time, mean_exec_time, shared_blks_hit,"
                " regexp_replace(left(query, 110), '\\s+', ' ', 'g')"
                " FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8"
            )
        ).all()
        conn.execute(text("SELECT pg_stat_statements_reset()"))
    print(f"-- server time, {phase}: calls, total ms, mean ms, buffers/call, statement")
    for calls, total, mean, hits, query in found:
        print(f"   {calls:>8,} {total:>10,.0f} {mean:>8.2f} {hits / max(calls, 1):>8.0f}  {query}")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--pg",
        help="a server to create the database on (default: a cluster of the script's own,"
        " initdb'd on a free port with the defaults: autovacuum on)",
    )
    p.add_argument("--url", help="use this database as it is (its jobs are deleted)")
    p.add_argument("--minutes", type=float, default=10.0, help="length of the run (default 10)")
    p.add_argument(
        "--hold",
        default="",
        help="A:B: the horizon is held from minute A to minute B (default 2:8 of 10, scaled)",
    )
    p.add_argument("--rate", type=float, help="producer rate, jobs/s (default: measured)")
    p.add_argument("--fraction", type=float, default=0.6, help="of the measured maximum")
    p.add_argument("--max-jobs", type=int, default=20_000, help="jobs for the maximum")
    p.add_argument("--concurrency", type=int, default=4, help="the worker's threads")
    p.add_argument("--producer-threads", type=int, default=2, help="the producer's threads")
    p.add_argument("--interval", type=float, default=10.0, help="seconds per line")
    p.add_argument("--keep", action="store_true", help="keep the database")
    p.add_argument(
        "--statements",
        action="store_true",
        help="own cluster: load pg_stat_statements, print the costliest statements of the"
        " time before the hold, the hold, and after it",
    )
    args = p.parse_args()
    cluster = None
    if args.url is None and args.pg is None:
        progress("starting a PostgreSQL cluster of our own (initdb)")
        cluster = _bench.PgCluster(
            {"shared_preload_libraries": "pg_stat_statements"} if args.statements else None
        )
        args.pg = cluster.server
    try:
        run(args, cluster)
    finally:
        if cluster is not None:
            cluster.close()


def run(args: Any, cluster: Any) -> None:
    minutes = args.minutes
    if args.hold:
        hold_from, hold_to = (float(x) * 60 for x in args.hold.split(":"))
    else:
        hold_from, hold_to = minutes * 60 * 0.2, minutes * 60 * 0.8
    url = args.url or _bench.recreate_pg_database(args.pg, "bench_held_horizon")
    with create_engine(url).connect() as conn:
        autovacuum = conn.execute(text("SHOW autovacuum")).scalar()
        version = conn.execute(text("SHOW server_version")).scalar()
    args.server = (
        f"PostgreSQL {version}, {'own cluster' if cluster else 'given server'},"
        f" autovacuum {autovacuum}"
    )
    load_before = _bench.load()
    maximum = None
    if args.rate:
        rate = args.rate
    else:
        progress(f"measuring one worker's maximum ({args.max_jobs:,} jobs)")
        maximum = max_rate(url, args.max_jobs, args.concurrency)
        rate = maximum * args.fraction
        progress(f"maximum {maximum:.0f} jobs/s (load {_bench.load()}); producer at {rate:.0f}/s")
    app = make_app(url)
    app.migrate()
    with app.store.begin() as conn:
        conn.execute(text("DELETE FROM scheduler_runs"))
        conn.execute(text("DELETE FROM scheduler_jobs"))
    app.close()
    vacuum(url)
    engine = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=2)
    ctx = multiprocessing.get_context("spawn")
    stop, ready, timings = ctx.Event(), ctx.Queue(), ctx.Queue()
    sent = ctx.Value("q", 0)
    worker = ctx.Process(target=_worker, args=(url, args.concurrency, stop, timings, ready))
    producer = ctx.Process(
        target=_producer, args=(url, rate, args.producer_threads, stop, sent, ready)
    )
    worker.start()
    producer.start()
    for _ in range(2):
        ready.get(timeout=120)
    began = time.monotonic()
    holder: Any = None
    shown_after = False
    if args.statements:
        with engine.connect() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
            conn.execute(text("SELECT pg_stat_statements_reset()"))
    lines: list[dict[str, Any]] = []
    window: dict[str, list[float]] = {"claim": [], "cursor": [], "expired": []}
    last_done, last_sent, next_line = 0, 0, began + args.interval
    header = (
        f"{'t s':>5} {'phase':>6} {'backlog':>8} {'in/s':>6} {'done/s':>7} {'claim p50':>9}"
        f" {'p99 ms':>7} {'expired p99':>11} {'cursor':>7} "
        + " ".join(f"{SHORT[t] + ' dead':>10}" for t in TABLES)
        + "  load"
    )
    print(header, flush=True)
    try:
        while True:
            now = time.monotonic()
            elapsed = now - began
            if args.statements and holder is None and hold_from <= elapsed:
                top_statements(engine, "before the hold")
            if args.statements and holder is not None and not holder and not shown_after:
                if elapsed >= min(hold_to + 60, minutes * 60 - 1):
                    top_statements(engine, "the minute after the hold")
                    shown_after = True
            if holder is None and hold_from <= elapsed < hold_to:
                holder = engine.connect().execution_options(isolation_level="REPEATABLE READ")
                holder.execute(text(f"SET application_name = '{HOLDER_NAME}'"))
                holder.execute(text("SELECT count(*) FROM scheduler_jobs"))  # the snapshot
                progress(f"t={elapsed:.0f}s: horizon held (REPEATABLE READ, idle in transaction)")
            if holder and elapsed >= hold_to:
                if args.statements:
                    top_statements(engine, "the hold")
                holder.rollback()
                holder.close()
                holder = False
                progress(f"t={elapsed:.0f}s: horizon released")
            while not timings.empty():
                _, taken = timings.get()
                for kind, values in taken.items():
                    window[kind].extend(values)
            if now >= next_line:
                with engine.connect() as conn:
                    counts = dict(
                        conn.execute(
                            text(
                                "SELECT state, count(*) FROM scheduler_jobs"
                                " WHERE state IN ('queued', 'succeeded') GROUP BY state"
                            )
                        ).all()
                    )
                    dead = dict(
                        conn.execute(
                            text(
                                "SELECT relname, n_dead_tup FROM pg_stat_user_tables"
                                " WHERE relname LIKE 'scheduler%'"
                            )
                        ).all()
                    )
                done, total_sent = int(counts.get("succeeded", 0)), int(sent.value)
                claims = window["claim"] + window["cursor"]
                seconds = args.interval
                phase = (
                    "before" if elapsed < hold_from else "HELD" if elapsed < hold_to else "after"
                )
                line = {
                    "t": round(elapsed),
                    "phase": phase,
                    "backlog": int(counts.get("queued", 0)),
                    "in": (total_sent - last_sent) / seconds,
                    "done": (done - last_done) / seconds,
                    "claim50": pct(claims, 0.5) * 1000,
                    "claim99": pct(claims, 0.99) * 1000,
                    "cursor": len(window["cursor"]) / max(len(claims), 1),
                    "expired99": pct(window["expired"], 0.99) * 1000,
                    "dead": {t: int(dead.get(t, 0)) for t in TABLES},
                    "load": _bench.load(),
                    "claims": len(claims),
                }
                lines.append(line)
                print(
                    f"{line['t']:>5} {phase:>6} {line['backlog']:>8,} {line['in']:>6.0f}"
                    f" {line['done']:>7.0f} {line['claim50']:>9.2f} {line['claim99']:>7.2f}"
                    f" {line['expired99']:>11.2f} {line['cursor']:>7.0%} "
                    + " ".join(f"{line['dead'][t]:>10,}" for t in TABLES)
                    + f"  {line['load']}",
                    flush=True,
                )
                last_done, last_sent = done, total_sent
                window = {"claim": [], "cursor": [], "expired": []}
                next_line += args.interval
                if elapsed >= minutes * 60:
                    break
            time.sleep(0.2)
    finally:
        stop.set()
        producer.join(timeout=60)
        worker.join(timeout=120)
        for proc in (producer, worker):
            if proc.is_alive():
                proc.terminate()
        if holder:
            holder.close()
        engine.dispose()
    engine = create_engine(url)
    with engine.connect() as conn:
        args.table_stats = conn.execute(
            text(
                "SELECT n_tup_upd, n_tup_hot_upd, autovacuum_count, vacuum_count"
                " FROM pg_stat_user_tables WHERE relname = 'scheduler_jobs'"
            )
        ).one()
    engine.dispose()
    summary(lines, rate, maximum, args, hold_from, hold_to, load_before)
    if not args.url and not args.keep and cluster is None:
        _bench.drop_pg_database(args.pg, "bench_held_horizon")


def summary(
    lines: list[dict[str, Any]],
    rate: float,
    maximum: float | None,
    args: Any,
    hold_from: float,
    hold_to: float,
    load_before: str,
) -> None:
    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else float("nan")

    # "before": after a minute of warm-up (or the first third of the time before the hold)
    warm = min(60.0, hold_from / 3)
    before = [x for x in lines if warm <= x["t"] <= hold_from]
    held = [x for x in lines if hold_from < x["t"] <= hold_to]
    after = [x for x in lines if x["t"] > hold_to]
    p99_before = statistics.median([x["claim99"] for x in before]) if before else float("nan")
    produced = mean([x["in"] for x in held])
    done_held = mean([x["done"] for x in held])
    p99_held = max((x["claim99"] for x in held), default=float("nan"))
    backlog_before = max((x["backlog"] for x in before), default=0)
    backlog_end = held[-1]["backlog"] if held else 0
    normal_after = None
    for x in after:
        if x["claim99"] <= 2 * p99_before and x["backlog"] <= max(2 * backlog_before, 100):
            normal_after = x["t"] - hold_to
            break
    dead_peak = {t: max((x["dead"][t] for x in lines), default=0) for t in TABLES}
    title = (
        f"Held horizon: producer {rate:.0f} jobs/s"
        + (f" ({args.fraction:.0%} of one worker's {maximum:.0f}/s)" if maximum else "")
        + f", worker concurrency {args.concurrency}, {args.minutes:g} min, horizon held"
        f" {hold_from / 60:g}-{hold_to / 60:g} min ({args.server}; {_bench.machine()};"
        f" load average {load_before} before, {_bench.load()} after)"
    )
    _bench.print_table(
        title,
        ["target", "measured", "verdict"],
        [
            [
                "throughput during the hold >= 90 % of the producer's rate",
                f"{done_held:.0f} done/s of {produced:.0f} enqueued/s"
                f" ({100 * done_held / max(produced, 1e-9):.0f} %); backlog"
                f" {backlog_before:,} max before, {backlog_end:,} at the release",
                "met" if done_held >= 0.9 * produced else "NOT met",
            ],
            [
                "claim p99 during the hold <= 5x before",
                f"{fmt(p99_held)} ms worst 10 s vs {fmt(p99_before)} ms before"
                f" ({p99_held / p99_before:.1f}x)",
                "met" if p99_held <= 5 * p99_before else "NOT met",
            ],
            [
                "normal within 1 minute of the release",
                "never" if normal_after is None else f"after {normal_after:.0f} s",
                "met" if normal_after is not None and normal_after <= 60 else "NOT met",
            ],
            [
                "scheduler_jobs: HOT updates, autovacuum runs",
                f"{args.table_stats[1]:,} HOT of {args.table_stats[0]:,} updates;"
                f" autovacuum ran {args.table_stats[2]} time(s)",
                "shown",
            ],
            [
                "dead tuples, peak",
                ", ".join(f"{SHORT[t]} {dead_peak[t]:,}" for t in TABLES),
                "shown",
            ],
        ],
    )


if __name__ == "__main__":
    main()
