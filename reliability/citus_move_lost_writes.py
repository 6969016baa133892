"""Does a ``force_logical`` Citus shard move lose writes that committed just before its switch?

A minimal reproduction, without the scheduler: a Citus cluster of its own (``_citus.py``), a
distributed schema ``moved`` with one table ``counter (id, n)``, and writer threads that each
send, through the coordinator and in autocommit, ``UPDATE moved.counter SET n = n + 1 WHERE id
= 1 RETURNING n`` and ``INSERT INTO moved.log VALUES (key)`` as fast as they can, while the
schema's shard is moved from one worker node to the other and back (``citus_move_shard_placement
(..., shard_transfer_mode => 'force_logical')``, the old placement cleaned up before the next
move).

Every update that returned committed; if the moves lost none, the ``n`` returned are all
different (each update saw the one before it) and the final ``n`` is their count, and every
inserted key is in ``moved.log``. An ``n`` returned twice is an update whose effect the new
placement never had: the next update there saw the value from before it, exactly what a claim
of the scheduler (``UPDATE ... SET state = 'claimed' ... RETURNING``) that ran a job twice
would be.

Run with the worker nodes' ``synchronous_commit`` at ``off`` (what the test clusters use) and at
``on``::

    python reliability/citus_move_lost_writes.py --moves 20 --sync off
    python reliability/citus_move_lost_writes.py --moves 20 --sync on

It prints one JSON line per arm: updates and inserts committed, ``n`` values returned twice,
keys missing, and for each move that lost something, which.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import psycopg
from _citus import Cluster

DATABASE = "lost_writes"


def node_port(cluster: Cluster) -> int:
    return int(
        cluster.coordinator.sql(
            "SELECT nodeport FROM citus_shards WHERE table_name = 'moved.counter'::regclass",
            DATABASE,
        )
    )


def shard_id(cluster: Cluster) -> int:
    return int(
        cluster.coordinator.sql(
            "SELECT shardid FROM citus_shards WHERE table_name = 'moved.counter'::regclass",
            DATABASE,
        )
    )


class Writer(threading.Thread):
    def __init__(
        self, conninfo: str, index: int, stop: threading.Event, schema: str = "moved"
    ) -> None:
        super().__init__(name=f"writer-{index}", daemon=True)
        self.conninfo = conninfo
        self.index = index
        self.stop = stop
        self.schema = schema
        self.returned: list[tuple[int, float]] = []  # (n, monotonic time of the return)
        self.keys: list[int] = []
        self.errors: Counter[str] = Counter()

    def run(self) -> None:
        conn = psycopg.connect(self.conninfo, autocommit=True)
        i = 0
        while not self.stop.is_set():
            i += 1
            key = self.index * 1_000_000_000 + i
            try:
                with conn.transaction():  # BEGIN ... COMMIT, as the scheduler's
                    row = conn.execute(
                        f"UPDATE {self.schema}.counter SET n = n + 1 WHERE id = 1 RETURNING n"
                    ).fetchone()
                    assert row is not None
                    conn.execute(f"INSERT INTO {self.schema}.log (k) VALUES (%s)", (key,))
                self.returned.append((int(row[0]), time.monotonic()))
                self.keys.append(key)
            except psycopg.Error as exc:
                self.errors[type(exc).__name__ + ": " + str(exc).split("\n")[0][:120]] += 1
                if conn.closed or conn.broken:
                    conn = psycopg.connect(self.conninfo, autocommit=True)
        conn.close()


def write_behind_commit(port: int, sync: str, tries: int = 200) -> int:
    """How many of `tries` commits (``synchronous_commit = sync``) on the node at `port` are
    still past its WAL *write* position (``pg_current_wal_lsn()``, what Citus's catch-up waits
    for) when the session asks right after the commit returned."""
    with psycopg.connect(
        f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True
    ) as conn:
        conn.execute(f"SET synchronous_commit = {sync}")
        conn.execute("CREATE TABLE IF NOT EXISTS probe (x int)")
        behind = 0
        for _ in range(tries):
            # one transaction: the WAL insert position just after its row went in, then
            # (the commit returned) whether the write position has passed even that
            inserted = conn.execute(
                "INSERT INTO probe VALUES (1) RETURNING pg_current_wal_insert_lsn()"
            ).fetchone()
            assert inserted is not None
            row = conn.execute("SELECT pg_current_wal_lsn() < %s::pg_lsn", inserted).fetchone()
            behind += bool(row and row[0])
        conn.execute("DROP TABLE probe")
    return behind


def arm(
    cluster: Cluster, sync: str, moves: int, writers: int, settle: float, delay: int
) -> dict[str, Any]:
    coordinator = cluster.coordinator
    for worker in cluster.workers:
        worker.sql(f"ALTER SYSTEM SET synchronous_commit = '{sync}'", "postgres")
        worker.sql(f"ALTER SYSTEM SET wal_writer_delay = {delay}", "postgres")
        worker.sql("SELECT pg_reload_conf()", "postgres")
    # `moved`, and a neighbour schema on each worker node, written all along as well (the
    # scheduler's other shards on the moved shard's nodes)
    for schema in ("moved", "stays_0", "stays_1"):
        coordinator.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE", DATABASE)
        coordinator.sql(
            f"SET citus.enable_schema_based_sharding TO on; CREATE SCHEMA {schema};"
            f" CREATE TABLE {schema}.counter (id int PRIMARY KEY, n bigint NOT NULL);"
            f" CREATE TABLE {schema}.log (k bigint PRIMARY KEY);"
            f" INSERT INTO {schema}.counter VALUES (1, 0)",
            DATABASE,
        )
    for k, worker in enumerate(cluster.workers):
        table = f"stays_{k}.counter"
        shard, port = coordinator.sql(
            f"SELECT shardid, nodeport FROM citus_shards WHERE table_name = '{table}'::regclass",
            DATABASE,
        ).split("|")
        if int(port) != worker.port:
            coordinator.sql(
                f"SELECT citus_move_shard_placement({shard}, '127.0.0.1', {port}, '127.0.0.1',"
                f" {worker.port}, shard_transfer_mode => 'block_writes')",
                DATABASE,
            )
            coordinator.sql("CALL citus_cleanup_orphaned_resources()", DATABASE)
    conninfo = f"host=127.0.0.1 port={coordinator.port} user=postgres dbname={DATABASE}"
    stop = threading.Event()
    threads = [Writer(conninfo, i, stop) for i in range(writers)]
    neighbours = [Writer(conninfo, 100 + k, stop, f"stays_{k}") for k in range(2)]
    for thread in threads + neighbours:
        thread.start()
    windows: list[tuple[float, float]] = []
    ports = [w.port for w in cluster.workers]
    try:
        time.sleep(settle)
        for _ in range(moves):
            source = node_port(cluster)
            target = next(p for p in ports if p != source)
            began = time.monotonic()
            coordinator.sql(
                f"SELECT citus_move_shard_placement({shard_id(cluster)}, '127.0.0.1', {source},"
                f" '127.0.0.1', {target}, shard_transfer_mode => 'force_logical')",
                DATABASE,
            )
            windows.append((began, time.monotonic()))
            coordinator.sql("CALL citus_cleanup_orphaned_resources()", DATABASE)
            time.sleep(settle)
    finally:
        stop.set()
        for thread in threads + neighbours:
            thread.join(timeout=60)
    returned = [r for t in threads for r in t.returned]
    counts = Counter(n for n, _ in returned)
    twice = sorted(n for n, c in counts.items() if c > 1)
    final = int(coordinator.sql("SELECT n FROM moved.counter WHERE id = 1", DATABASE))
    present = {int(k) for k in coordinator.sql("SELECT k FROM moved.log", DATABASE).split()}
    keys = [k for t in threads for k in t.keys]
    missing = sorted(set(keys) - present)
    lossy = []  # the moves during which a value returned twice was first returned
    for index, (began, ended) in enumerate(windows):
        hits = [n for n, at in returned if n in twice and began <= at <= ended + 1.0]
        if hits:
            lossy.append({"move": index, "n": sorted(set(hits))})
    errors: Counter[str] = Counter()
    for thread in threads:
        errors.update(thread.errors)
    return {
        "synchronous_commit": sync,
        "commits_past_write_position_of_200": write_behind_commit(cluster.workers[0].port, sync),
        "wal_writer_delay_ms": delay,
        "moves": moves,
        "updates": len(returned),
        "final_n": final,
        "n_returned_twice": len(twice),
        "first_twice": twice[:10],
        "inserts": len(keys),
        "keys_missing": len(missing),
        "lossy_moves": lossy,
        "errors": dict(errors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moves", type=int, default=10)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--settle", type=float, default=1.0, help="seconds between moves")
    parser.add_argument("--sync", choices=["off", "on", "both"], default="both")
    parser.add_argument(
        "--wal-writer-delay",
        type=int,
        default=200,
        help="the worker nodes' wal_writer_delay, ms (200: PostgreSQL's default)",
    )
    args = parser.parse_args()
    with Cluster(workers=2) as cluster:
        cluster.create_database(DATABASE)
        for sync in ["off", "on"] if args.sync == "both" else [args.sync]:
            result = arm(
                cluster, sync, args.moves, args.writers, args.settle, args.wal_writer_delay
            )
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
