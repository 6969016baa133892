"""The tick's dispatch phase, for an instruction count under callgrind (an A/B of two checkouts
on a machine too busy for timings).

    PYTHONPATH=CHECKOUT valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python benchmarks/tick_instructions.py sqlite:////tmp/x.db tick 5
    (the same with ``prep`` instead of ``tick``)

Loads 1,000 rows of a yearly cron, then REPS rounds: make 100 of them due at a real slot with no
later slot passed, and in ``tick`` mode dispatch them (in ``prep`` mode tick while nothing is
due). (tick - prep) / (REPS * 100) is the instructions per dispatched row.

In ``idle`` mode it only ticks REPS times with nothing due (no resets between): the
difference of two REPS counts, divided by their difference, is one idle tick.

A fourth argument ``metrics`` turns Prometheus metrics on as a worker has them (issue 15):
the app's ``Metrics`` exists (its lateness receiver and outcome hook) and each tick is told
to it, as ``Worker._tick`` does; compare with the same run without it.

Set ``PYTHONHASHSEED`` (the same for both checkouts): with a random one, the count of the same
code moves by several per cent from run to run (the dicts' collisions); with a fixed one, by
about 0.5 %. docs/performance.md §12 gives the mean over seeds 0 to 3.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, update
from tick_loop import jobs, loaded, rows


def main(url: str, mode: str, reps: int, metrics: bool = False) -> None:
    app = loaded(url, 1000)
    told = None
    if metrics:
        from scheduler.metrics import metrics_for

        told = metrics_for(app)
    slot = datetime(2039, 1, 1, tzinfo=UTC)
    far = datetime(2040, 1, 1, tzinfo=UTC)
    if mode == "idle":
        for _ in range(reps):
            began = time.monotonic()
            report = app.tick(now=far - timedelta(days=800))
            if told is not None:
                told.ticked(time.monotonic() - began, report)
        app.close()
        return
    for _ in range(reps):
        with app.store.begin() as conn:
            conn.execute(update(rows).values(last_job_id=None))
            conn.execute(delete(jobs))
            conn.execute(update(rows).values(next_run_at=far + timedelta(days=400)))
            conn.execute(update(rows).where(rows.c.name < "t00100").values(next_run_at=slot))
        began = time.monotonic()
        if mode == "tick":
            report = app.tick(now=slot + timedelta(days=30))
            assert len(report.dispatched) == 100
        else:
            report = app.tick(now=far - timedelta(days=800))  # nothing due: the same connection use
        if told is not None:
            told.ticked(time.monotonic() - began, report)
    app.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["metrics"])
