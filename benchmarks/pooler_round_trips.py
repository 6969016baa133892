"""Round trips per queue operation on PostgreSQL, directly and with ``pooler = "transaction"``.

    python benchmarks/pooler_round_trips.py [--pg URL] [--rows 40]

Behind a transaction pooler every transaction carries its own settings (``SET LOCAL``) instead
of the session's (``[database] pooler``; docs/howto/production-postgresql.md): this measures
what that costs, in the unit that matters across a network, the round trip. Every libpq
call that sends is counted (psycopg's pure-Python libpq wrapper, ``PSYCOPG_IMPL=python``): a
round trip is a query sent outside a pipeline (libpq follows it with a Sync) or a pipeline's
Sync (one per pipeline, however many statements it carries). Both modes run against the same
server directly (a pooler adds its own hop to each round trip, the same count). The
operations are those of ``benchmarks/query_counts.py``; "tick, N rows dispatched" is divided
by N.

Database ``scheduler_bench`` (created if missing), as query_counts uses.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

os.environ["PSYCOPG_IMPL"] = "python"  # before psycopg is imported: see Tracer

from scheduler import Scheduler, TaskSpec
from scheduler._app import TICK_RECORD_SECONDS
from scheduler._model.handlers import Registry

HERE = Path(__file__).resolve().parent
PG_URL = os.environ.get("SCHEDULER_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _query_counts() -> Any:
    spec = importlib.util.spec_from_file_location("query_counts", HERE / "query_counts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Tracer:
    """Round trips of every libpq connection in this process: psycopg's pure-Python libpq
    wrapper (``PSYCOPG_IMPL=python``, set before psycopg is imported) with its sending
    methods counted. A round trip is a query sent outside a pipeline (``send_query*``, which
    libpq ends with a Sync) or a pipeline's ``pipeline_sync``."""

    def __init__(self) -> None:
        from psycopg import pq
        from psycopg.pq import pq_ctypes

        assert pq.__impl__ == "python", "run with PSYCOPG_IMPL=python (main() sets it)"
        self.count = 0
        cls: Any = pq_ctypes.PGconn
        for name in ("send_query", "send_query_params", "send_query_prepared", "send_prepare"):
            self._wrap(cls, name, in_pipeline=False)
        for name in ("exec_", "exec_params", "prepare", "exec_prepared"):
            self._wrap(cls, name, in_pipeline=False)
        self._wrap(cls, "pipeline_sync", in_pipeline=True)

    def _wrap(self, cls: Any, name: str, *, in_pipeline: bool) -> None:
        from psycopg import pq

        original = getattr(cls, name)
        if getattr(original, "counted", False):
            return
        tracer = self

        def counted(conn: Any, *args: Any, **kwargs: Any) -> Any:
            piped = conn.pipeline_status != pq.PipelineStatus.OFF
            if in_pipeline or not piped:
                tracer.count += 1
            return original(conn, *args, **kwargs)

        counted.counted = True  # type: ignore[attr-defined]
        setattr(cls, name, counted)

    @contextmanager
    def counting(self, into: dict[str, float], name: str, per: int = 1) -> Iterator[None]:
        before = self.count
        yield
        into[name] = (self.count - before) / per


def measure(url: str, pooler: str, rows: int, tracer: Tracer) -> dict[str, float]:
    now = [datetime(2030, 1, 7, 12, 0, tzinfo=UTC)]
    app = Scheduler(
        url, registry=Registry(), clock=lambda: now[0], worker_id="bench", pooler=pooler
    )

    @app.handler("bench.ok", retry_safe=True)
    def ok(job: Any) -> None:
        pass

    found: dict[str, float] = {}
    count: Callable[..., Any] = tracer.counting
    try:
        app.check_schema()
        runner = app.runner()
        with count(found, "enqueue"):
            app.enqueue("bench.ok")
        with count(found, "claim"):
            [job] = runner.claim(1)
        with count(found, "complete (success)"):
            runner.run(job)
        with count(found, "work(), nothing ready"):
            app.work()
        app.tick()  # the process's first tick registers its record
        with count(found, "tick, idle"):
            app.tick()
        specs = [TaskSpec(f"bench-{n:03}", "0 3 * * *", "bench.ok", {}, "UTC") for n in range(rows)]
        app.sync(specs[:1])
        app.trigger("bench-000")
        with count(found, "tick, one row dispatched"):
            app.tick()
        app.sync(specs)
        for spec in specs:
            app.trigger(spec.name)
        now[0] += timedelta(seconds=TICK_RECORD_SECONDS / 10)
        with count(found, f"tick, {rows} rows dispatched, per row", rows):
            app.tick()
        with count(found, "work(), one job"):
            app.enqueue("bench.ok")
            runner.claim(1)  # not counted apart
    finally:
        app.close()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pg", default=PG_URL)
    parser.add_argument("--rows", type=int, default=40)
    args = parser.parse_args(argv)
    counts = _query_counts()
    tracer = Tracer()
    columns: dict[str, dict[str, float]] = {}
    with counts._server_db(args.pg) as url:
        if url is None:
            return 1
        for pooler in ("none", "transaction"):
            counts._prepare(url)
            columns[pooler] = measure(url, pooler, args.rows, tracer)
    operations = list(columns["none"])
    width = max(len(op) for op in operations)
    print("round trips per operation (queries sent outside a pipeline + pipeline Syncs)")
    print(f"| {'operation':<{width}} | pooler = none | pooler = transaction |")
    print(f"|{'-' * (width + 2)}|--------------:|---------------------:|")
    for op in operations:
        none, pooled = columns["none"][op], columns["transaction"][op]
        print(f"| {op:<{width}} | {none:>13g} | {pooled:>20g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
