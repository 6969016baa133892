"""A scheduler process over a database of 4 shards (``[database] shards = 4``), for the tests of
shards on Citus (``tests/store/test_citus_shards.py``).

Usage::

    python shard_process.py tick URL DIR INDEX PROCESSES STEPS BASE_ISO
    python shard_process.py work URL DIR INDEX TENANTS

``tick``: one of several tickers racing over the same rows, as ``tick_race_worker.py`` does (a
file barrier in DIR keeps them in step: every process ticks the simulated instant
``BASE + i minutes`` before any ticks the next, so all of them contend for every slot); each
dispatch it made (its ``job_dispatched`` signal: task, slot, job id) is appended to
``DIR/dispatched-INDEX.jsonl``.

``work``: a worker of every shard (two threads) whose handler ``count`` appends its job's id to
``DIR/ran-INDEX``, and a thread that enqueues ``count`` jobs for the tenants ``t0`` ..
``t{TENANTS-1}`` in turn (so over every shard), each id appended to ``DIR/enqueued-INDEX`` once
the enqueue returned, an enqueue that raised to ``DIR/failed-INDEX``, until ``DIR/stop`` exists;
then the worker drains what is left and stops once ``DIR/drain`` exists and no job is ready.
What the worker did with each job goes to ``DIR/evidence-INDEX.jsonl``, a JSON object a line
with its ``kind``: each job a claim returned (``claim``: its attempts, fence, lease owner as the
claim's ``RETURNING`` gave them, written before the claim's commit), taken over
(``take_over``), run (``run``: the attempt and fence the handler saw) and each outcome written
(``end``: ``won`` false when the write found the lease gone), with the wall time, the thread,
and for a claim or an outcome when its statement began and the node ports Citus sent it to
(``ports``); the scheduler's log lines (INFO and up) go to ``DIR/log-INDEX``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
import threading
import time
import traceback
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event
from tick_race_worker import wait_for_all, write_progress

from scheduler import Scheduler, signals
from scheduler._model.handlers import Registry
from scheduler._store import jobs as store_jobs
from scheduler._worker.shards import ShardedWorker
from scheduler.testing import ManualClock

SHARDS = 4


def append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def tick(url: str, directory: Path, index: int, processes: int, steps: int, base: datetime) -> None:
    clock = ManualClock(base)
    app = Scheduler(
        url, shards=SHARDS, registry=Registry(), clock=clock, worker_id=f"ticker-{index}"
    )
    app.handler("ok")(lambda job: None)
    out = directory / f"dispatched-{index}.jsonl"

    def on_dispatched(sender: str, **kw: Any) -> None:
        slot = kw["slot"].isoformat()
        append_line(out, json.dumps({"row": sender, "job_id": kw["job_id"], "slot": slot}))

    with signals.job_dispatched.connected_to(on_dispatched):
        app.check_schema()  # connect before the start line
        write_progress(directory, index, 0)
        for i in range(1, steps + 1):
            wait_for_all(directory, processes, i - 1)
            app.tick(now=clock.set(base + timedelta(minutes=i)))
            write_progress(directory, index, i)
    app.close()


class Routes:
    """The nodes the coordinator sent each connection's commands to (Citus's own account:
    ``citus.log_remote_commands``, a notice per command naming the server), as in
    ``helpers/citus_remote.py``: :meth:`since` gives the ports of the commands since a mark."""

    def __init__(self) -> None:
        self.ports: dict[int, list[int]] = {}

    def watch(self, engine: Any) -> None:
        engine.dispose()  # every connection from now on is one of ours

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.execute("SET citus.log_remote_commands TO on")
            dbapi_connection.execute("SET client_min_messages TO log")
            dbapi_connection.commit()
            ports = self.ports.setdefault(id(dbapi_connection), [])

            def on_notice(diag: Any) -> None:
                found = _SERVER.search(diag.message_detail or "")
                if found is not None:
                    ports.append(int(found.group(1)))

            dbapi_connection.add_notice_handler(on_notice)

        event.listen(engine, "connect", on_connect)

    def mark(self, conn: Any) -> tuple[list[int], int]:
        ports = self.ports.setdefault(id(conn.connection.driver_connection), [])
        return ports, len(ports)

    @staticmethod
    def since(mark: tuple[list[int], int]) -> list[int]:
        ports, start = mark
        found = sorted(set(ports[start:]))
        del ports[:]  # only the latest statement's are wanted
        return found


_SERVER = re.compile(r"on server \S+@[\d.]+:(\d+)")


def record_evidence(directory: Path, index: int, routes: Routes) -> Path:
    """Wrap the store's claim, takeover and outcome writes (the functions the runner calls) so
    that each job they return or write is appended to ``DIR/evidence-INDEX.jsonl``, with the
    node ports Citus sent the statement to; its path."""
    out = directory / f"evidence-{index}.jsonl"

    def note(kind: str, **fields: Any) -> None:
        fields.update(kind=kind, at=time.time(), thread=threading.current_thread().name)
        append_line(out, json.dumps(fields, default=str))

    claim = store_jobs.claim

    @functools.wraps(claim)
    def claimed(store: Any, conn: Any, **kwargs: Any) -> Any:
        began = time.time()
        mark = routes.mark(conn)
        found = claim(store, conn, **kwargs)
        ports = routes.since(mark)
        for job in found:
            note(
                "claim",
                id=job.id,
                attempts=job.attempts,
                fence=job.fence,
                owner=job.lease_owner,
                state=job.state,
                began=began,
                ports=ports,
            )
        return found

    take_over = store_jobs.take_over

    @functools.wraps(take_over)
    def took_over(conn: Any, job: Any, **kwargs: Any) -> bool:
        won = take_over(conn, job, **kwargs)
        note("take_over", id=job.id, won=won, attempts=job.attempts, owner=job.lease_owner)
        return won

    finish_many = store_jobs.finish_many

    @functools.wraps(finish_many)
    def finished(conn: Any, items: Any, **kwargs: Any) -> Any:
        began = time.time()
        mark = routes.mark(conn)
        views = finish_many(conn, items, **kwargs)
        ports = routes.since(mark)
        for item, view in zip(items, views, strict=True):
            note(
                "end",
                id=item.job.id,
                state=item.state,
                fence=item.job.fence,
                won=view is not None,
                began=began,
                ports=ports,
            )
        return views

    store_jobs.claim = claimed
    store_jobs.take_over = took_over
    store_jobs.finish_many = finished
    return out


def work(url: str, directory: Path, index: int, tenants: int) -> None:
    handler = logging.FileHandler(directory / f"log-{index}")
    handler.setFormatter(
        logging.Formatter("%(created).6f %(threadName)s %(levelname)s %(message)s")
    )
    logging.getLogger("scheduler").addHandler(handler)
    logging.getLogger("scheduler").setLevel(logging.INFO)
    routes = Routes()
    evidence = record_evidence(directory, index, routes)
    app = Scheduler(url, shards=SHARDS, registry=Registry(), worker_id=f"worker-{index}")
    for shard in app.shards:
        routes.watch(shard.store.engine)
    ran = directory / f"ran-{index}"

    @app.handler("count")
    def count(job: Any) -> None:
        append_line(ran, str(job.id))
        append_line(
            evidence,
            json.dumps(
                {
                    "kind": "run",
                    "id": job.id,
                    "attempt": job.attempt,
                    "fence": job.fence,
                    "worker": f"worker-{index}",
                    "at": time.time(),
                    "thread": threading.current_thread().name,
                }
            ),
        )

    def enqueue() -> None:
        n = 0
        while not (directory / "stop").exists():
            tenant = f"t{(n + index) % tenants}"
            n += 1
            try:
                job_id = app.enqueue("count", tenant=tenant)
            except Exception:
                append_line(
                    directory / f"failed-{index}", traceback.format_exc().replace("\n", " ")
                )
                continue
            append_line(directory / f"enqueued-{index}", str(job_id))
            time.sleep(0.002)

    worker = ShardedWorker(app, concurrency=2, serve_metrics=False)
    enqueuer = threading.Thread(target=enqueue, name="enqueuer")
    enqueuer.start()

    def stop_when_drained() -> None:
        while not (directory / "drain").exists():
            time.sleep(0.05)
        enqueuer.join()
        while any(shard.jobs(state="queued", limit=1) for shard in app.shards):
            time.sleep(0.1)
        worker.stop()

    threading.Thread(target=stop_when_drained, name="stopper", daemon=True).start()
    write_progress(directory, index, 1)
    worker.run()
    app.close()


if __name__ == "__main__":
    mode, url_arg, dir_arg, index_arg = sys.argv[1:5]
    if mode == "tick":
        procs_arg, steps_arg, base_arg = sys.argv[5:8]
        tick(
            url_arg,
            Path(dir_arg),
            int(index_arg),
            int(procs_arg),
            int(steps_arg),
            datetime.fromisoformat(base_arg),
        )
    else:
        work(url_arg, Path(dir_arg), int(index_arg), int(sys.argv[5]))
