"""The queue's enqueue and drain on SQLite, for an instruction count under callgrind (an A/B of
two checkouts on a machine too busy for timings, e.g. wake-ups on and off). A PostgreSQL URL in
place of the file works too (the client's instructions only; ``prepare`` migrates it).

    PYTHONHASHSEED=0 PYTHONPATH=CHECKOUT valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python benchmarks/queue_instructions.py /tmp/x.db MODE N [off]

MODE ``base``: create the database (a copy of a migrated template made first, outside the
count, as ``prepare``); ``enqueue``: then N ``app.enqueue``; ``fill``: then insert N jobs in
one statement; ``drain``: fill, then run them with a worker (``Worker.run(once=True)``, 4
threads, no-op handler). (enqueue - base) / N and (drain - fill) / N are the instructions per
job. ``off`` builds the Scheduler with ``wakeups=False``.
"""

from __future__ import annotations

import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, insert

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.jobs import new_job_values
from scheduler._store.tables import jobs
from scheduler._worker.worker import Worker


def main(path: str, mode: str, n: int, off: bool) -> None:
    url = path if "://" in path else f"sqlite:///{path}"
    template = Path(path + ".template")
    if mode == "prepare":
        Scheduler(url if "://" in path else f"sqlite:///{template}", registry=Registry()).migrate()
        return
    if "://" not in path:
        for suffix in ("", "-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)
        shutil.copy(template, path)
    registry = Registry()
    registry.handler("noop", retry_safe=True)(lambda job: None)
    options = {"wakeups": False} if off else {}  # (a checkout before wake-ups has no such key)
    app = Scheduler(url, registry=registry, clock="local", **options)
    app.check_schema()
    if "://" in path:  # a server's database (its instructions are not counted): emptied
        with app.store.begin() as conn:
            conn.execute(delete(jobs))
    if mode == "enqueue":
        for _ in range(n):
            app.enqueue("noop")
    elif mode in ("fill", "drain"):
        now = datetime.now(UTC) - timedelta(seconds=1)
        with app.store.begin() as conn:
            conn.execute(insert(jobs), [new_job_values(handler="noop", payload="{}", now=now)] * n)
        if mode == "drain":
            handled = Worker(app, concurrency=4).run(once=True).handled
            assert handled == n, handled
    app.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["off"])
