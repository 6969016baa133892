"""The tick in a loop, for an A/B of two checkouts: client CPU and wall time per idle tick and per
dispatched row, in this interpreter's ``scheduler``.

    benchmarks/.venv/bin/python benchmarks/tick_loop.py sqlite:////tmp/a.db

Loads 1,000 rows (a yearly cron, so none is due), runs 300 idle ticks, then one tick
dispatching 100 of them; 5 times; prints the medians on one line. Run it with each checkout's
venv in turn (old, new, new, old): ``tick_cost.py`` measures a sub-millisecond idle tick once
per case, which a busy machine moves by 2x either way.
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, update

from scheduler import Scheduler, TaskSpec

try:
    from scheduler._store.tables import jobs, rows
except ImportError:  # the layout before the store became a package (an A/B run)
    from scheduler._tables import jobs, rows  # type: ignore[import-not-found,no-redef]

ROWS, DUE, IDLE_TICKS, REPS = 1000, 100, 300, 5


def loaded(url: str, n: int = ROWS) -> Scheduler:
    """An app on ``url`` with exactly ``n`` rows of a yearly cron (``t00000``...), no jobs."""
    app = Scheduler(url)
    app.migrate()
    app.handler("h", retry_safe=True)(lambda: None)
    with app.store.begin() as conn:
        conn.execute(update(rows).values(last_job_id=None))
        conn.execute(delete(jobs))
        conn.execute(delete(rows))
    app.sync(
        [
            TaskSpec(name=f"t{i:05d}", cron="0 0 1 1 *", handler="h", payload={}, timezone="UTC")
            for i in range(n)
        ]
    )
    return app


def main() -> None:
    app = loaded(sys.argv[1])
    far = datetime(2040, 1, 1, tzinfo=UTC)
    slot = datetime(2039, 1, 1, tzinfo=UTC)  # a slot of the yearly cron
    idle_now = datetime.now(UTC)

    def idle() -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(IDLE_TICKS):
            app.tick(now=idle_now)
        return (
            (time.process_time() - cpu) / IDLE_TICKS * 1e6,
            (time.perf_counter() - wall) / IDLE_TICKS * 1e6,
        )

    def dispatch() -> tuple[float, float]:
        with app.store.begin() as conn:
            conn.execute(update(rows).values(last_job_id=None))
            conn.execute(delete(jobs))
            conn.execute(update(rows).values(next_run_at=far + timedelta(days=400)))
            conn.execute(
                update(rows)
                .where(rows.c.name < f"t{DUE:05d}")
                .values(next_run_at=slot)  # a real slot, and no later one is due: no coalescing
            )
        cpu, wall = time.process_time(), time.perf_counter()
        report = app.tick(now=slot + timedelta(days=30))
        assert len(report.dispatched) == DUE, report
        return (
            (time.process_time() - cpu) / DUE * 1e6,
            (time.perf_counter() - wall) / DUE * 1e6,
        )

    idle()
    dispatch()  # warm-up
    runs = [idle() + dispatch() for _ in range(REPS)]
    m = [statistics.median(r[i] for r in runs) for i in range(4)]
    print(
        f"idle tick: {m[0]:.0f} us CPU, {m[1]:.0f} us wall; "
        f"per dispatched row: {m[2]:.0f} us CPU, {m[3]:.0f} us wall"
    )
    app.close()


if __name__ == "__main__":
    main()
