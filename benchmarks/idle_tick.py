"""Idle tick against table size: ours with R = 1k, 100k (and 1M) rows loaded at once, the sizes'
ticks interleaved.

    benchmarks/.venv/bin/python benchmarks/idle_tick.py [--max-rows 1000000] [--reps 300]

No row is due, so a tick is the due-row query alone. Each repetition ticks every size once, one
after another (each size going first in turn), so a slow spell of the machine lands on all
sizes alike; ``tick_cost.py``
measures its sizes minutes apart, and there a spell of a second can double one size's median
(one run had ours, the raw loop and APScheduler all twice as slow at R = 100k as at R = 1k,
another the reverse). Prints the median, the 10th percentile and the statements of one tick
per size, and each size's median against R = 1k (the target: at most 1.5x at R = 1M).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import _bench
from _bench import fmt, median, progress
from tick_cost import Ours

SIZES = (1000, 100_000, 1_000_000)


def main() -> None:
    p = _bench.parser(__doc__.splitlines()[0], reps=300)
    p.add_argument("--max-rows", type=int, default=1_000_000, help="largest R (default 1000000)")
    args = p.parse_args()
    sizes = [r for r in SIZES if r <= args.max_rows]
    scratch = _bench.scratch_dir()
    load_before = _bench.load()
    loaded: dict[str, dict[int, Ours]] = {}
    for r in sizes:
        urls = {}
        if not args.no_sqlite:
            urls["SQLite"] = f"sqlite:///{scratch / f'idle-{r}.db'}"
        if not args.no_pg:
            urls["PostgreSQL"] = _bench.recreate_pg_database(args.pg, f"bench_idle_{r}")
        for db, url in urls.items():
            progress(f"{db}: loading {r:,} rows")
            ours = Ours(url)
            ours.load(r, datetime.now(UTC) + timedelta(days=2))
            ours.tick()  # warm-up: connections, statement caches, schema check
            loaded.setdefault(db, {})[r] = ours
    if not args.no_pg:
        _bench.checkpoint_pg(args.pg)
    seconds: dict[tuple[str, int], list[float]] = {}
    statements: dict[tuple[str, int], int] = {}
    progress(f"ticking every size in turn, {args.reps} times")
    cases = [(db, r, ours) for db, by_size in loaded.items() for r, ours in by_size.items()]
    for rep in range(args.reps):
        turn = rep % len(cases)  # each case takes its turn at going first (after the others)
        for db, r, ours in cases[turn:] + cases[:turn]:
            began = time.perf_counter()
            dispatched, count = ours.tick()
            seconds.setdefault((db, r), []).append(time.perf_counter() - began)
            statements[(db, r)] = count
            if dispatched:
                raise RuntimeError(f"{db} R={r}: {dispatched} dispatched by an idle tick")
    rows = []
    for db, by_size in loaded.items():
        base = median(seconds[(db, sizes[0])])
        for r in by_size:
            times = sorted(seconds[(db, r)])
            rows.append(
                [
                    db,
                    f"{r:,}",
                    fmt(median(times) * 1000),
                    fmt(times[len(times) // 10] * 1000),
                    statements[(db, r)],
                    f"{median(times) / base:.2f}x" + (" (<=1.5x)" if r != sizes[0] else ""),
                ]
            )
        for ours in by_size.values():
            ours.close()
    if not args.no_pg:
        for r in sizes:
            _bench.drop_pg_database(args.pg, f"bench_idle_{r}")
    _bench.print_table(
        f"Idle tick, sizes interleaved, {args.reps} ticks each ({_bench.machine()};"
        f" load average {load_before} before, {_bench.load()} after)",
        ["db", "R", "median ms", "p10 ms", "SQL per tick", f"vs R={sizes[0]:,}"],
        rows,
    )


if __name__ == "__main__":
    main()
