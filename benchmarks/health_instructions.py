"""Workers & health's live refresh on SQLite, for an instruction count under callgrind (an A/B of
two checkouts on a machine too busy for timings).

    .venv/bin/python benchmarks/health_instructions.py make /tmp/health.db     # once, ~15 s
    PYTHONPATH=CHECKOUT valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python benchmarks/health_instructions.py page /tmp/health.db 5
    (the same with ``prep`` instead of ``page``; ``count``: the background count alone)

``make`` loads ``dashboard_pages.py``'s data (10,000 tasks, 1,000,000 jobs) into a SQLite file.
Then both modes open the dashboard on it and request Workers & health three times (warming the
caches; the first starts the background count of the finished states where there is one, and
it is waited for); ``page`` then requests it REPS times more, its shared cache emptied before
each, as ``dashboard_pages.py`` does. (page - prep) / REPS is the instructions of one refresh
in this process: Python's and SQLite's (the background count is not in it; ``count`` does
REPS of those instead, where the checkout has ``_health.finished_counts``).
"""

from __future__ import annotations

import asyncio
import sys

from dashboard_pages import T0, _get, populate

from scheduler import Scheduler
from scheduler._config import DashboardSettings
from scheduler._model.handlers import Registry
from scheduler._store.status import health as _health
from scheduler.dashboard import create_app


def main(mode: str, path: str, reps: int) -> None:
    app = Scheduler(f"sqlite:///{path}", registry=Registry(), clock=lambda: T0)
    if mode == "make":
        app.migrate()
        populate(app, 10_000, 1_000_000)
        app.close()
        return
    asgi = create_app(app, DashboardSettings())
    dash = asgi.state.dashboard
    loop = asyncio.new_event_loop()
    for _ in range(3):
        assert loop.run_until_complete(_get(asgi, "/health"))[0] == 200
    finished = getattr(dash, "finished", None)  # the background count, where there is one
    if finished is not None:
        finished.wait()
    for _ in range(reps if mode == "page" else 0):
        dash._status = None
        assert loop.run_until_complete(_get(asgi, "/health"))[0] == 200
    for _ in range(reps if mode == "count" else 0):  # what one background count costs
        with app.store.read() as conn:
            _health.finished_counts(conn)
    loop.close()
    app.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
