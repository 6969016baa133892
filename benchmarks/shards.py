"""Shards on Citus: jobs drained and slots dispatched per second with 1 shard and with 4, and
what each costs on each node (issue 36).

A Citus coordinator and two worker nodes of this script's own (``reliability/_citus.py``:
PostgreSQL 15's binaries, free loopback ports, ``pg_stat_statements`` preloaded), with two
databases:

- ``one``: ``[database] shards = 1``, the scheduler's tables in one Citus distributed schema
  (the connection's ``search_path``), so on one worker node;
- ``four``: ``[database] shards = 4``, ``citus.enable_schema_based_sharding`` on, the 4 shard
  schemas distributed schemas spread over the two worker nodes (2 each).

For each: **drain**: ``--processes`` worker processes (a ``ShardedWorker`` each, every shard,
``--concurrency`` threads for each shard) wait idle; ``--jobs`` no-op jobs are enqueued
(``enqueue_many``, 64 tenants, so over every shard) and the clock runs until all of them
succeeded. **tick**: ``--tasks`` tasks due every minute (64 tenants); one tick of all of them,
one thread per shard (``app.shards[k].tick``: each shard is ticked by its own worker), twice
(two instants), the faster kept.

Per node, over each phase: statements (``pg_stat_statements`` calls in the database: on the
coordinator the scheduler's own, on a worker node the commands Citus sent it), transactions
(``pg_stat_database.xact_commit``), and CPU seconds of the node's processes (its postmaster's
children, live and reaped, from ``/proc``), and the clients' CPU seconds (the worker processes
and this script's threads: the enqueue and the polls, the tick); the coordinator's client
connections and its connections to the workers during the drain.

    python benchmarks/shards.py                     # 4,000 jobs, 2,000 tasks
    python benchmarks/shards.py --jobs 10000 --tasks 5000

All three servers and the clients share this machine's cores: the figures are what one host
gives, not what k hosts would; the per-node costs are what the projection in
``docs/performance.md`` starts from.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "reliability")]

import _citus  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

TENANTS = 64
T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)
SINGLE_SCHEMA = "scheduler_one"  # the tables of the 1-shard database


def tenant(n: int) -> str:
    return f"tenant-{n % TENANTS}"


# -- a worker process (this script with --serve) ---------------------------------------------
def serve(url: str, shards: int, concurrency: int, ready: Path) -> None:
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry
    from scheduler._worker.shards import ShardedWorker

    app = Scheduler(url, shards=shards, registry=Registry())
    app.handler("noop")(lambda job: None)
    worker = ShardedWorker(app, concurrency=concurrency * shards, serve_metrics=False)

    def announce() -> None:
        worker.started.wait()
        ready.touch()

    threading.Thread(target=announce, daemon=True).start()
    worker.run(install_signals=True)
    app.close()


# -- what each node did ------------------------------------------------------------------------
def cpu_seconds(node: _citus.Node) -> float:
    """CPU seconds of `node`'s server: its postmaster's own and reaped children's, and its live
    children's (``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    master = node.pid
    assert master is not None
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        if pid == master:
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        elif ppid == master:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` so far, its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    statements: int
    commits: int
    cpu: float


@dataclass
class Usage:
    """Per node (coordinator, worker0, worker1): statements, commits, CPU seconds."""

    by_node: dict[str, Sample] = field(default_factory=dict)


def sample(cluster: _citus.Cluster, database: str) -> dict[str, Sample]:
    found: dict[str, Sample] = {}
    for node in cluster.nodes:
        statements = node.sql(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            database,
        )
        commits = node.sql(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            database,
        )
        found[node.name] = Sample(int(statements), int(commits), cpu_seconds(node))
    return found


def reset(cluster: _citus.Cluster, database: str) -> dict[str, Sample]:
    for node in cluster.nodes:
        node.sql("SELECT pg_stat_statements_reset()", database)
    return sample(cluster, database)


def delta(before: dict[str, Sample], after: dict[str, Sample]) -> dict[str, Sample]:
    return {
        name: Sample(
            after[name].statements - b.statements,
            after[name].commits - b.commits,
            after[name].cpu - b.cpu,
        )
        for name, b in before.items()
    }


# -- the phases ---------------------------------------------------------------------------------
@dataclass
class Layout:
    name: str
    shards: int
    database: str
    url: str


def make_layout(cluster: _citus.Cluster, name: str, shards: int) -> Layout:
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry

    database = f"bench_{name}"
    url = cluster.create_database(database, schema_sharding=shards > 1)
    cluster.coordinator.sql("CREATE EXTENSION pg_stat_statements", database)  # on every node
    if shards == 1:
        cluster.coordinator.sql(
            f"SET citus.enable_schema_based_sharding TO on; CREATE SCHEMA {SINGLE_SCHEMA}",
            database,
        )
        url = f"{url}?options=-csearch_path%3D{SINGLE_SCHEMA}"
    app = Scheduler(url, shards=shards, registry=Registry())
    app.migrate()
    app.close()
    return Layout(name, shards, database, url)


def placement(cluster: _citus.Cluster, layout: Layout) -> str:
    ports = {node.port: node.name for node in cluster.nodes}
    rows = cluster.coordinator.sql(
        "SELECT DISTINCT split_part(table_name::text, '.', 1), nodeport FROM citus_shards"
        " ORDER BY 1",
        layout.database,
    )
    return ", ".join(
        f"{schema} on {ports[int(port)]}"
        for schema, port in (line.split("|") for line in rows.splitlines())
    )


def succeeded(conn: Any, layout: Layout) -> int:
    """Jobs succeeded (one statement on a connection kept open: each poll costs each node a
    statement or two, a few dozen in a drain)."""
    schemas = (
        [SINGLE_SCHEMA]
        if layout.shards == 1
        else [f"scheduler_shard_{k}" for k in range(layout.shards)]
    )
    query = " + ".join(
        f"(SELECT count(*) FROM {s}.scheduler_jobs WHERE state = 'succeeded')" for s in schemas
    )
    return int(conn.exec_driver_sql(f"SELECT {query}").scalar())


def connections(cluster: _citus.Cluster, layout: Layout) -> str:
    clients = cluster.coordinator.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        layout.database,
    )
    listening = cluster.coordinator.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE '%listen%'",
        layout.database,
    )
    to_workers = [
        node.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'citus_internal%'",
            layout.database,
        )
        for node in cluster.workers
    ]
    return (
        f"{clients} client connections on the coordinator ({listening} of them listening),"
        f" {' + '.join(to_workers)} from it to the worker nodes"
    )


def drain(
    cluster: _citus.Cluster, layout: Layout, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry

    processes = []
    for i in range(args.processes):
        ready = tmp / f"ready-{layout.name}-{i}"
        command = [sys.executable, __file__, "--serve", layout.url, str(layout.shards)]
        command += [str(args.concurrency), str(ready)]
        processes.append((subprocess.Popen(command), ready))
    try:
        deadline = time.monotonic() + 120
        while not all(ready.exists() for _, ready in processes):
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # their first rounds (ticks, presence) done
        app = Scheduler(layout.url, shards=layout.shards, registry=Registry())
        app.handler("noop")(lambda job: None)
        before = reset(cluster, layout.database)
        clients = sum(process_cpu(p.pid) for p, _ in processes) + time.process_time()
        started = time.monotonic()
        for start in range(0, args.jobs, 500):
            chunk = range(start, min(args.jobs, start + 500))
            app.enqueue_many([{"handler": "noop", "tenant": tenant(n)} for n in chunk])
        enqueued = time.monotonic() - started
        seen = ""
        polls = create_engine(cluster.coordinator.url(layout.database), poolclass=NullPool)
        with polls.connect() as conn:
            conn.execute(text("SET search_path TO public"))
            conn.commit()
            while succeeded(conn, layout) < args.jobs:
                conn.rollback()
                if not seen and time.monotonic() - started > 0.5:
                    seen = connections(cluster, layout)
                time.sleep(0.2)
        took = time.monotonic() - started
        clients = sum(process_cpu(p.pid) for p, _ in processes) + time.process_time() - clients
        used = delta(before, sample(cluster, layout.database))
        used["clients"] = Sample(0, 0, clients)
        polls.dispose()
        app.close()
    finally:
        for process, _ready in processes:
            process.send_signal(signal.SIGTERM)
        for process, _ready in processes:
            process.wait(60)
    return {"took": took, "enqueued": enqueued, "used": used, "connections": seen}


def tick(cluster: _citus.Cluster, layout: Layout, args: argparse.Namespace) -> dict[str, Any]:
    from scheduler import Scheduler, TaskSpec
    from scheduler._model.handlers import Registry
    from scheduler.testing import ManualClock

    clock = ManualClock(T0)
    app = Scheduler(layout.url, shards=layout.shards, registry=Registry(), clock=clock)
    app.handler("noop")(lambda job: None)
    for start in range(0, args.tasks, 500):
        app.put_tasks(
            [
                TaskSpec(
                    name=f"every-{n}",
                    cron="* * * * *",
                    handler="noop",
                    tenant=tenant(n),
                    overlap="allow",
                )
                for n in range(start, min(args.tasks, start + 500))
            ]
        )
    best: dict[str, Any] = {}
    for minute in (1, 2):
        now = clock.set(T0 + timedelta(minutes=minute))
        dispatched = [0] * len(app.shards)

        def run(k: int, now: datetime = now, counts: list[int] = dispatched) -> None:
            counts[k] = len(app.shards[k].tick(now=now).dispatched)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(app.shards))]
        before = reset(cluster, layout.database)
        client = time.process_time()
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        took = time.monotonic() - started
        client = time.process_time() - client
        used = delta(before, sample(cluster, layout.database))
        used["clients"] = Sample(0, 0, client)
        assert sum(dispatched) == args.tasks, (dispatched, args.tasks)
        if not best or took < best["took"]:
            best = {"took": took, "used": used}
    app.close()
    return best


# -- the report -------------------------------------------------------------------------------
def per_node(used: dict[str, Sample], count: int, what: str) -> list[str]:
    out = []
    for name, s in used.items():
        if name == "clients":
            out.append(
                f"    {name:<12} {'':>37}  {s.cpu * 1e6 / count:7.0f} µs CPU/{what}"
                f"  ({s.cpu:.2f} s CPU in all)"
            )
            continue
        out.append(
            f"    {name:<12} {s.statements / count:6.2f} statements/{what}"
            f"  {s.commits / count:5.2f} commits/{what}"
            f"  {s.cpu * 1e6 / count:7.0f} µs CPU/{what}  ({s.cpu:.2f} s CPU in all)"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="threads per shard in each worker process (default 4)",
    )
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        url, shards, concurrency, ready = args.serve
        serve(url, int(shards), int(concurrency), Path(ready))
        return
    import tempfile

    cluster = _citus.Cluster(workers=2, preload=("pg_stat_statements",))
    with cluster, tempfile.TemporaryDirectory() as tmp:
        print(
            f"Citus coordinator + 2 workers (PostgreSQL {_citus.PG_VERSION}) started in"
            f" {cluster.started_in:.1f} s; {os.cpu_count()} CPUs shared by all nodes and"
            f" clients; load average {os.getloadavg()[0]:.1f}"
        )
        print(
            f"drain: {args.jobs} no-op jobs, {args.processes} worker processes,"
            f" {args.concurrency} threads a shard in each; tick: {args.tasks} due tasks,"
            " one thread per shard"
        )
        for name, shards in (("one", 1), ("four", 4)):
            layout = make_layout(cluster, name, shards)
            print(f"\n== {shards} shard(s): {placement(cluster, layout)}")
            drained = drain(cluster, layout, args, Path(tmp))
            print(
                f"  drain: {args.jobs / drained['took']:,.0f} jobs/s ({drained['took']:.2f} s"
                f" from the enqueue's start to the last job's end; the enqueue alone"
                f" {drained['enqueued']:.2f} s, {args.jobs / drained['enqueued']:,.0f} jobs/s)"
            )
            print("\n".join(per_node(drained["used"], args.jobs, "job")))
            print(f"  during it: {drained['connections']}")
            ticked = tick(cluster, layout, args)
            print(f"  tick: {args.tasks / ticked['took']:,.0f} slots/s ({ticked['took']:.2f} s)")
            print("\n".join(per_node(ticked["used"], args.tasks, "slot")))
        print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
