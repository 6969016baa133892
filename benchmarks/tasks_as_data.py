"""Tasks as data at scale: N (default 1,000,000) application rows on PostgreSQL.

    python benchmarks/tasks_as_data.py [--rows 1000000] [--burst 100000] [--workers 4]

On its own database ``bench_tasks_data`` (plus ``$SCHEDULER_BENCH_SUFFIX``, dropped after),
measured in this order:

- ``put_tasks`` of all N ``api`` rows in one call (one transaction), from an empty table
  (target <= 60 s at 1,000,000);
- one ``put_task`` among them: a changed payload of an existing row, and a new row
  (p50, p95 of --samples calls; target p50 <= 5 ms);
- the idle tick: its SQL statements and wall time (target: one statement);
- ``rows(limit=50)`` plain and filtered by prefix, group and tenant, ``explain``, and the
  dashboard's Tasks page paged and filtered (served through its ASGI app, no socket)
  (p50, p95; target p95 <= 100 ms), and ``scheduler tasks list --limit 50`` as a fresh process;
- ``scheduler status`` and ``status --json`` as fresh processes: wall time, output size and
  peak RSS (``/usr/bin/time``), beside the same at --small (10,000) rows;
- the midnight burst: --burst of the N rows (every 10th has ``0 0 * * *``) due at one
  instant, dispatched by --workers ticking processes (benchmarks/burst.py's harness); then the
  same burst of --burst ``file`` rows on a table of those alone (burst.py's own load), and
  the control: that burst among N ``file`` rows (the api rows' table size without their
  payload, tenant and group), in the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _bench
import burst
from _bench import fmt, progress
from sqlalchemy import event, text, update

from scheduler import Scheduler, TaskSpec
from scheduler._store.tables import rows

MIDNIGHT = "0 0 * * *"
ZONES = ("UTC", "America/Chicago", "Europe/Berlin", "Asia/Kolkata")


def spec(i: int) -> TaskSpec:
    """Row i: a customer's task; every 10th fires at midnight UTC (the burst's rows)."""
    if i % 10 == 0:
        cron, zone = MIDNIGHT, "UTC"
    else:
        cron, zone = f"{i % 60} {6 + i % 12} * * 1-5", ZONES[i % len(ZONES)]
    return TaskSpec(
        name=f"customer-{i:07d}",
        cron=cron,
        handler=burst.HANDLER,
        payload={"customer": i},
        timezone=zone,
        tenant=f"tenant-{i % 1000}",
        group=f"customer-{i // 10}",
    )


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def timed(call: Any, samples: int) -> tuple[float, float]:
    found = []
    for _ in range(samples):
        began = time.perf_counter()
        call()
        found.append((time.perf_counter() - began) * 1000)
    return percentiles(found)


def put_all(url: str, n: int) -> float:
    app = burst.make_app(url)
    try:
        app.check_schema()
        specs = [spec(i) for i in range(n)]
        began = time.perf_counter()
        app.put_tasks(specs)
        return time.perf_counter() - began
    finally:
        app.close()


def cli(config: Path, *args: str) -> tuple[float, int, int]:
    """A fresh ``scheduler`` process: (wall s, stdout bytes, peak RSS KiB)."""
    env = {**os.environ, "SCHEDULER_CONFIG": str(config)}
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile() as rss:
        began = time.perf_counter()
        subprocess.run(
            [
                "/usr/bin/time",
                "-f",
                "%M",
                "-o",
                rss.name,
                sys.executable,
                "-m",
                "scheduler.cli",
                *args,
            ],
            env=env,
            stdout=out,
            check=True,
        )
        wall = time.perf_counter() - began
        size = out.seek(0, 2)
        return wall, size, int(Path(rss.name).read_text().split()[-1])


def dashboard_pages(n: int) -> dict[str, str]:
    """The dashboard's Tasks page, paged and filtered, at ``n`` rows."""
    return {
        "dashboard: Tasks": "/tasks",
        "dashboard: Tasks, deep page": f"/tasks?after=customer-{n // 2:07d}",
        "dashboard: Tasks, prefix": "/tasks?prefix=customer-04",
        "dashboard: Tasks, group": "/tasks?group=customer-4242",
        "dashboard: Tasks, tenant": "/tasks?tenant=tenant-42",
        "dashboard: Tasks, api source and tenant": "/tasks?source=api&tenant=tenant-42",
        "dashboard: Tasks, name contains": "/tasks?name=0424242",
        "dashboard: Tasks, failing": "/tasks?state=failing",
    }


def page_timer(app: Scheduler, path: str) -> Any:
    """A call that serves ``path`` through the dashboard's ASGI app (no socket: the page's own
    reads and rendering), checking the answer is 200."""
    import asyncio

    from dashboard_pages import _get

    from scheduler._config import DashboardSettings
    from scheduler.dashboard import create_app

    asgi = create_app(app, DashboardSettings())

    def call() -> None:
        status, _ms = asyncio.run(_get(asgi, path))
        assert status == 200, (path, status)

    return call


def vacuum_analyze(url: str) -> None:
    """``VACUUM ANALYZE`` the database of ``url`` (outside a transaction)."""
    app = burst.make_app(url)
    try:
        with app.store.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    finally:
        app.close()


def burst_figures(
    url: str, now: datetime, due: datetime, n: int, due_rows: int, workers: int
) -> str:
    """Tick ``url`` at ``now`` with ``workers`` processes; the burst's figures, and whether
    each of the ``due_rows`` rows of ``n`` ran exactly once."""
    result = burst.run_ticks(url, now, workers)
    jobs_made, once, still = burst.check(url, n, due)
    return (
        f"{fmt(result['seconds'])} s ({fmt(due_rows / result['seconds'])} rows/s), "
        f"{jobs_made:,} jobs, {once:,} rows once, {still} still due, "
        f"{result['lost']:,} lost races"
    )


def write_config(folder: Path, url: str, name: str) -> Path:
    config = folder / f"{name}.toml"
    config.write_text(f'[database]\nurl = "{url}"\n')
    return config


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=1)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--small", type=int, default=10_000, help="the status RSS comparison's size")
    p.add_argument("--burst", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--no-file-burst", action="store_true", help="skip burst.py's file rows")
    args = p.parse_args()
    n, table = args.rows, []
    scratch = _bench.scratch_dir()
    load_before = _bench.load()

    def done(*row: Any) -> None:
        table.append(list(row))
        progress("row: " + " | ".join(str(c) for c in row))

    url = _bench.recreate_pg_database(args.pg, "bench_tasks_data")
    small = _bench.recreate_pg_database(args.pg, "bench_tasks_small")
    for target in (url, small):
        app = Scheduler(target)
        app.migrate()
        app.close()

    progress(f"put_tasks of {n:,} api rows")
    seconds = put_all(url, n)
    done(f"put_tasks of {n:,} new api rows (one call)", fmt(seconds) + " s", "<= 60 s")
    vacuum_analyze(url)
    put_all(small, args.small)

    app = burst.make_app(url)
    try:
        counter = {"n": 0}
        k = iter(range(10**9))

        def changed() -> None:
            i = next(k) * 7919 % n
            app.put_task(TaskSpec(**{**spec(i).__dict__, "payload": {"customer": i, "v": 2}}))

        def created() -> None:
            app.put_task(TaskSpec(f"new-{next(k):07d}", "0 6 * * 1-5", burst.HANDLER))

        timed(changed, 10)  # warm-up
        p50, p95 = timed(changed, args.samples)
        done(
            "one put_task: a changed payload (p50 / p95)",
            f"{fmt(p50)} / {fmt(p95)} ms",
            "p50 <= 5 ms",
        )
        p50, p95 = timed(created, args.samples)
        done("one put_task: a new row (p50 / p95)", f"{fmt(p50)} / {fmt(p95)} ms", "p50 <= 5 ms")

        def count(*_a: Any) -> None:
            counter["n"] += 1

        idle_now = datetime.now(UTC) - timedelta(days=3650)  # nothing is due then
        app.tick(now=idle_now)
        event.listen(app.store.engine, "before_cursor_execute", count)
        counter["n"] = 0
        p50, p95 = timed(lambda: app.tick(now=idle_now, record=False), 50)
        event.remove(app.store.engine, "before_cursor_execute", count)
        done(
            f"idle tick at {n:,} rows: statements, p50 / p95",
            f"{counter['n'] / 50:g} per tick, {fmt(p50)} / {fmt(p95)} ms",
            "one statement",
        )

        cases = {
            "rows(limit=50)": lambda: app.rows(limit=50),
            "rows(limit=50, after=the middle)": lambda: app.rows(
                limit=50, after="customer-0500000"
            ),
            "rows(prefix='customer-04', limit=50)": lambda: app.rows(
                prefix="customer-04", limit=50
            ),
            "rows(group=G, limit=50)": lambda: app.rows(group="customer-4242", limit=50),
            "rows(tenant=T, limit=50)": lambda: app.rows(tenant="tenant-42", limit=50),
            "rows(source='api', tenant=T, after=X)": lambda: app.rows(
                source="api", tenant="tenant-42", after="customer-0500000", limit=50
            ),
            "explain(name)": lambda: app.explain(f"customer-{n // 2 + 1:07d}"),
        }
        for what, call in cases.items():
            timed(call, 5)
            p50, p95 = timed(call, args.samples // 2)
            done(what + " (p50 / p95)", f"{fmt(p50)} / {fmt(p95)} ms", "p95 <= 100 ms")
        for what, path in dashboard_pages(n).items():
            page_ms = page_timer(app, path)
            timed(page_ms, 3)
            p50, p95 = timed(page_ms, args.samples // 4)
            done(what + " (p50 / p95)", f"{fmt(p50)} / {fmt(p95)} ms", "p95 <= 100 ms")
    finally:
        app.close()

    big_config = write_config(scratch, url, "big")
    small_config = write_config(scratch, small, "small")
    walls = sorted(cli(big_config, "tasks", "list", "--limit", "50")[0] for _ in range(5))
    done(
        "`scheduler tasks list --limit 50` (fresh process, median of 5)", f"{fmt(walls[2])} s", "-"
    )
    for config, size in ((small_config, args.small), (big_config, n)):
        for command in (["status"], ["status", "--json"]):
            wall, out, rss = cli(config, *command)
            done(
                f"`scheduler {' '.join(command)}` at {size:,} rows",
                f"{fmt(wall)} s, {out / 1e6:.1f} MB out, peak RSS {rss / 1024:.0f} MiB",
                "flat memory" if command[-1] == "--json" else "summary past 200",
            )

    # the midnight burst: every 10th row (cron 0 0 * * *) due at one instant
    due = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    now = due + timedelta(seconds=30)
    app = burst.make_app(url)
    try:
        with app.store.begin() as conn:
            stmt = update(rows).where(
                rows.c.cron == MIDNIGHT, rows.c.name < f"customer-{args.burst * 10:07d}"
            )
            conn.execute(stmt.values(next_run_at=due))
    finally:
        app.close()
    vacuum_analyze(url)
    _bench.checkpoint_pg(url)
    progress(f"burst: {args.burst:,} api rows of {n:,} due at once, {args.workers} processes")
    done(
        f"midnight burst: {args.burst:,} api rows of {n:,}, {args.workers} tickers",
        burst_figures(url, now, due, n, args.burst, args.workers),
        "as fast as file rows",
    )
    _bench.drop_pg_database(args.pg, "bench_tasks_data")
    _bench.drop_pg_database(args.pg, "bench_tasks_small")
    if not args.no_file_burst:
        file_url = _bench.recreate_pg_database(args.pg, "bench_burst_ours")
        burst.load(file_url, args.burst, due)
        burst.reset(file_url, due)
        progress(f"burst: {args.burst:,} file rows (burst.py), {args.workers} processes")
        done(
            f"burst.py's burst: {args.burst:,} file rows alone, {args.workers} tickers",
            burst_figures(file_url, now, due, args.burst, args.burst, args.workers),
            "-",
        )
        _bench.drop_pg_database(args.pg, "bench_burst_ours")
        # The control: the same burst of file rows among n file rows (the api rows' table
        # size, without their payload, tenant and group), to tell the table's size apart.
        file_url = _bench.recreate_pg_database(args.pg, "bench_burst_ours")
        burst.load(file_url, n, due)
        burst.reset(file_url, due, vacuum=False)
        app = burst.make_app(file_url)
        try:
            with app.store.begin() as conn:
                later = due + timedelta(days=3650)
                stmt = update(rows).where(rows.c.name >= f"customer-{args.burst:07d}")
                conn.execute(stmt.values(next_run_at=later))
        finally:
            app.close()
        vacuum_analyze(file_url)
        _bench.checkpoint_pg(file_url)
        progress(f"burst: {args.burst:,} file rows of {n:,}, {args.workers} processes")
        done(
            f"control: {args.burst:,} file rows of {n:,} file rows, {args.workers} tickers",
            burst_figures(file_url, now, due, args.burst, args.burst, args.workers),
            "-",
        )
        _bench.drop_pg_database(args.pg, "bench_burst_ours")
    _bench.print_table(
        f"Tasks as data: {n:,} api rows on PostgreSQL {_bench.pg_version(args.pg)}"
        f" ({_bench.machine()}; load average {load_before} before, {_bench.load()} after;"
        f" {_bench.source_version()})",
        ["measure", "result", "target"],
        table,
    )


if __name__ == "__main__":
    main()
