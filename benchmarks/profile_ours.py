"""Where our time goes: cProfile over one of our operations, grouped by package, with the SQL
each job (or due row) sends.

    benchmarks/.venv/bin/python benchmarks/profile_ours.py drain --db sqlite [--mode work]
    benchmarks/.venv/bin/python benchmarks/profile_ours.py enqueue --db pg
    benchmarks/.venv/bin/python benchmarks/profile_ours.py tick --db sqlite [--n 1000]

``drain`` runs N no-op jobs in this process (``--mode work``: ``Scheduler.work()``; ``run`` or
``record``: the Runner-batched loops of queue_throughput.py, ``--batch B``), ``enqueue`` makes N
``Scheduler.enqueue`` calls, ``tick`` dispatches N due rows out of N. Prints self time per
package (the driver's wait for the server shows under psycopg / sqlite3), the top functions,
and each distinct statement with its count per unit.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import _bench
from _bench import Counter, fmt

BUCKETS = (
    ("sqlite3 (C, incl. disk)", re.compile(r"sqlite3\.(Cursor|Connection)|_sqlite3")),
    ("psycopg (incl. server wait)", re.compile(r"/psycopg")),
    ("sqlalchemy", re.compile(r"/sqlalchemy/")),
    ("scheduler", re.compile(r"/scheduler/")),
    ("json", re.compile(r"/json/|json\.(dumps|loads)|_json")),
    ("logging", re.compile(r"/logging/")),
    ("blinker (signals)", re.compile(r"/blinker/")),
    ("croniter / zoneinfo / dateutil", re.compile(r"croniter|zoneinfo|dateutil")),
    ("dataclasses / datetime builtins", re.compile(r"dataclasses|datetime")),
)


def bucket(where: str) -> str:
    for name, pattern in BUCKETS:
        if pattern.search(where):
            return name
    return "other"


def report(profile: cProfile.Profile, counter: Counter, units: int, unit: str) -> None:
    stats = pstats.Stats(profile)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    groups: dict[str, float] = {}
    for (path, _line, func), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        name = bucket(f"{path}:{func}")
        groups[name] = groups.get(name, 0.0) + tottime
    rows = [
        [name, fmt(t * 1e6 / units), f"{100 * t / total:.0f}%"]
        for name, t in sorted(groups.items(), key=lambda kv: -kv[1])
    ]
    _bench.print_table(
        f"Self time by package: {total * 1e6 / units:.0f} us per {unit} under cProfile",
        ["package", f"us/{unit}", "share"],
        rows,
    )
    top = sorted(raw.items(), key=lambda kv: -kv[1][2])[:20]
    _bench.print_table(
        "Top 20 functions by self time",
        ["function", "calls/" + unit, f"self us/{unit}", f"cumulative us/{unit}"],
        [
            [
                f"{path.rsplit('site-packages/', 1)[-1].rsplit('/work/main/', 1)[-1]}:{line}"
                f" {func}",
                fmt(nc / units),
                fmt(tt * 1e6 / units),
                fmt(ct * 1e6 / units),
            ]
            for (path, line, func), (_cc, nc, tt, ct, _callers) in top
        ],
    )
    _bench.print_table(
        f"Statements per {unit} (BEGIN excluded)",
        ["per " + unit, "statement"],
        [
            [fmt(n / units), " ".join(text.split())[:150]]
            for text, n in sorted(counter.statements.items(), key=lambda kv: -kv[1])
        ],
    )
    counts = counter.counts
    print(
        f"per {unit}: {counts.statements / units:.2f} statements,"
        f" {counts.transactions / units:.2f} transactions,"
        f" {counts.checkouts / units:.2f} pool checkouts"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["drain", "enqueue", "tick"])
    p.add_argument("--db", choices=["sqlite", "pg"], default="sqlite")
    p.add_argument("--pg", default=_bench.DEFAULT_PG)
    p.add_argument("--n", type=int, default=2000, help="jobs or due rows (default 2000)")
    p.add_argument("--mode", choices=["work", "run", "record"], default="work")
    p.add_argument("--batch", type=int, default=10)
    args = p.parse_args()

    import queue_throughput as qt
    import tick_cost as tc

    if args.db == "pg":
        url = _bench.recreate_pg_database(args.pg, "bench_profile")
    else:
        url = f"sqlite:///{_bench.scratch_dir() / 'profile.db'}"
    try:
        profile = cProfile.Profile()
        if args.what == "tick":
            ours = tc.Ours(url)
            # cProfile sees only this thread: keep the tick's rows on it.
            ours.app.settings = dataclasses.replace(ours.app.settings, tick_connections=1)
            ours.load(args.n, datetime.now(UTC) + timedelta(days=2))
            ours.tick()
            ours.make_due(tc.due_ids(args.n, args.n), datetime.now(UTC) - timedelta(minutes=1))
            counter = ours.counter
            counter.keep_text = True
            counter.reset()
            profile.enable()
            ours.app.tick()
            profile.disable()
            ours.close()
            report(profile, counter, args.n, "due row")
            return
        from scheduler import Scheduler

        Scheduler(url).migrate()
        if args.what == "enqueue":
            app = qt._ours_app(url)
            counter = Counter(app.store.engine)
            counter.keep_text = True
            profile.enable()
            for _ in range(args.n):
                app.enqueue(qt.HANDLER, {})
            profile.disable()
            app.close()
            report(profile, counter, args.n, "job")
            return
        qt.ours_fill(url, args.n)
        app = qt._ours_app(url)
        counter = Counter(app.store.engine)
        counter.keep_text = True
        profile.enable()
        handled = qt.ours_drain(app, args.batch, args.mode)
        profile.disable()
        app.close()
        report(profile, counter, handled, "job")
    finally:
        if args.db == "pg":
            _bench.drop_pg_database(args.pg, "bench_profile")


if __name__ == "__main__":
    main()
