"""``[database] shards = 4`` on Citus (a coordinator and two workers of the session's own,
``tests/helpers/citus_cluster.py``, in a database of their own with schema-based sharding on):

- the 4 shard schemas ``migrate`` creates are Citus distributed schemas, every table of theirs
  distributed, spread over both worker nodes;
- every statement the scheduler sends for the tick, the claim, the enqueue, a heartbeat and an
  outcome in a shard runs on the one node that holds the shard (Citus's own log of the commands
  it sends, ``citus.log_remote_commands``), with no two-phase commit (``pg_dist_transaction``
  does not grow);
- ids are unique across shards, shard ``k``'s ids those with ``(id - 1) % 4 == k``;
- 4 ticker processes racing over tasks of every shard dispatch each slot once;
- a shard schema moved to the other worker node (``citus_move_shard_placement``) while worker
  processes enqueue and drain jobs loses and doubles none.

Without Citus these skip with the reason; with ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _citus
import pytest
from helpers import citus_cluster
from helpers.citus_remote import RemoteCommands, assert_router

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.shards import schema_name, shard_of
from scheduler._store.tables import metadata
from scheduler._worker.runner import RunningJob
from scheduler.testing import ManualClock

pytestmark = pytest.mark.citus

SHARDS = 4
DATABASE = citus_cluster.SHARDS_DATABASE
T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)
HELPER = Path(__file__).parent.parent / "helpers" / "shard_process.py"


def tenants_per_shard(per_shard: int = 1) -> list[list[str]]:
    """``per_shard`` tenants routed to each shard (``t0``, ``t1``, ... in their order)."""
    found: list[list[str]] = [[] for _ in range(SHARDS)]
    n = 0
    while min(len(f) for f in found) < per_shard:
        tenant = f"t{n}"
        n += 1
        if len(found[shard_of(tenant, SHARDS)]) < per_shard:
            found[shard_of(tenant, SHARDS)].append(tenant)
    return found


def sql(citus: _citus.Cluster, statement: str) -> str:
    return citus.coordinator.sql(statement, DATABASE)


def placement(citus: _citus.Cluster) -> dict[str, set[int]]:
    """Each shard schema's nodes (the ports of the nodes holding its tables)."""
    found: dict[str, set[int]] = {}
    rows = sql(
        citus,
        "SELECT split_part(table_name::text, '.', 1), nodeport FROM citus_shards"
        " WHERE table_name::text LIKE 'scheduler\\_shard\\_%'",
    )
    for line in rows.splitlines():
        schema, port = line.split("|")
        found.setdefault(schema, set()).add(int(port))
    return found


@pytest.fixture(scope="module")
def migrated() -> str:
    """The cluster's shards database, migrated with 4 shards once for the module (a migration
    of 4 distributed schemas takes seconds)."""
    url = citus_cluster.shards_url()
    app = Scheduler(url, shards=SHARDS, registry=Registry())
    app.migrate()
    app.close()
    return url


@pytest.fixture
def sharded(citus: _citus.Cluster, migrated: str) -> Iterator[tuple[str, Scheduler]]:
    """The shards database with every shard's tables emptied (their sequences go on), and a
    Scheduler over it."""
    for k in range(SHARDS):
        names = ", ".join(f"{schema_name(k)}.{t.name}" for t in metadata.sorted_tables)
        sql(citus, f"TRUNCATE {names}")
    app = Scheduler(migrated, shards=SHARDS, registry=Registry())
    yield migrated, app
    app.close()


def test_the_shard_schemas_are_distributed_schemas_spread_over_both_workers(
    citus: _citus.Cluster, sharded: tuple[str, Scheduler]
) -> None:
    schemas = sql(citus, "SELECT schema_name FROM citus_schemas ORDER BY 1").splitlines()
    assert schemas == [schema_name(k) for k in range(SHARDS)]
    where = placement(citus)
    assert sorted(where) == schemas
    workers = {w.port for w in citus.workers}
    for schema, ports in where.items():
        assert len(ports) == 1 and ports <= workers, (schema, ports)  # all its tables together
    assert set().union(*where.values()) == workers  # both workers hold shards
    # No table of a shard is left on the coordinator alone: every one is distributed.
    local = sql(
        citus,
        "SELECT string_agg(c.oid::regclass::text, ', ') FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname LIKE 'scheduler\\_shard\\_%' AND c.relkind IN ('r', 'p')"
        " AND c.oid NOT IN (SELECT logicalrelid FROM pg_dist_partition)",
    )
    assert local == ""


def test_every_statement_kind_in_each_shard_goes_to_its_node_without_two_phase_commit(
    citus: _citus.Cluster, sharded: tuple[str, Scheduler]
) -> None:
    url, _ = sharded
    clock = ManualClock(T0)
    app = Scheduler(
        url, shards=SHARDS, registry=Registry(), clock=clock, worker_id="A", lease_seconds=60
    )
    app.handler("ok")(lambda job: None)
    remote = [RemoteCommands(shard.store.engine) for shard in app.shards]
    central = RemoteCommands(app.store.engine)  # the facade's own (its layout check)
    nodes = {k: citus.node_of(schema_name(k), DATABASE).port for k in range(SHARDS)}
    before = two_phase_commits(citus)
    tenants = [found[0] for found in tenants_per_shard()]
    app.put_tasks(
        [
            TaskSpec(name=f"nightly-{k}", cron="0 3 * * *", handler="ok", tenant=tenants[k])
            for k in range(SHARDS)
        ]
    )
    try:
        for k, tenant in enumerate(tenants):
            shard = app.shards[k]
            with remote[k].during() as enqueue:
                job_id = app.enqueue("ok", tenant=tenant)
                app.enqueue("ok", tenant=tenant, dedupe_key="once")
                app.enqueue("ok", tenant=tenant, dedupe_key="once")  # its holder returned
                app.enqueue_many([{"handler": "ok", "tenant": tenant}] * 2)
            assert_router(enqueue, nodes[k], f"shard {k}: enqueue")
            runner = shard.runner()
            with remote[k].during() as claim:
                jobs = runner.claim()
            assert job_id in [j.id for j in jobs]
            assert_router(claim, nodes[k], f"shard {k}: claim")
            with remote[k].during() as heartbeat:
                RunningJob(jobs[0], runner).heartbeat()
            assert_router(heartbeat, nodes[k], f"shard {k}: heartbeat")
            with remote[k].during() as outcome:
                for job in jobs:
                    assert runner.run(job) == "succeeded"
            assert_router(outcome, nodes[k], f"shard {k}: outcome")
        with ExitStack() as during:
            ticks = [during.enter_context(remote[k].during()) for k in range(SHARDS)]
            assert sorted(app.tick(now=T0 + timedelta(days=1)).dispatched) == [
                f"nightly-{k}" for k in range(SHARDS)
            ]
            assert app.tick(now=T0 + timedelta(days=1, seconds=1)).dispatched == []
        for k in range(SHARDS):
            assert_router(ticks[k], nodes[k], f"shard {k}: tick")
        for sent in central.sent:  # the facade's own reads touch the coordinator's catalog only
            assert sent.remote == [], (sent.statement, sent.remote)
    finally:
        app.close()
    assert two_phase_commits(citus) == before


def two_phase_commits(citus: _citus.Cluster) -> int:
    return int(sql(citus, "SELECT count(*) FROM pg_dist_transaction"))


def ids_by_shard(citus: _citus.Cluster, table: str) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for k in range(SHARDS):
        rows = sql(citus, f"SELECT id FROM {schema_name(k)}.{table} ORDER BY id")
        found[k] = [int(i) for i in rows.split()]
    return found


def test_ids_are_unique_across_shards_and_name_their_shard(
    citus: _citus.Cluster, sharded: tuple[str, Scheduler]
) -> None:
    _, app = sharded
    clock = ManualClock(T0)
    app = Scheduler(sharded[0], shards=SHARDS, registry=Registry(), clock=clock)
    app.handler("ok")(lambda job: None)
    tenants = [t for found in tenants_per_shard(2) for t in found]
    try:
        app.put_tasks(
            [
                TaskSpec(name=f"hourly-{t}", cron="0 * * * *", handler="ok", tenant=t)
                for t in tenants
            ]
        )
        for tenant in tenants:
            app.enqueue("ok", tenant=tenant)
        app.enqueue_many([{"handler": "ok", "tenant": t} for t in tenants * 3])
        app.tick(now=T0 + timedelta(hours=1))
        app.work()
    finally:
        app.close()
    for table in ("scheduler_jobs", "scheduler_rows", "scheduler_runs", "scheduler_decisions"):
        found = ids_by_shard(citus, table)
        every = [i for ids in found.values() for i in ids]
        assert len(every) == len(set(every)), (table, found)
        for k, ids in found.items():
            assert ids, (table, k)
            assert [(i - 1) % SHARDS for i in ids] == [k] * len(ids), (table, k, ids)
    jobs = sum(len(ids) for ids in ids_by_shard(citus, "scheduler_jobs").values())
    assert jobs == 5 * len(tenants)  # 1 enqueued, 3 in bulk and 1 dispatched a tenant


def run_helper(*args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HELPER), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(processes: list[subprocess.Popen[str]], timeout: float = 120) -> None:
    for process in processes:
        _, stderr = process.communicate(timeout=timeout)
        assert process.returncode == 0, stderr[-3000:]


def test_four_tickers_dispatch_each_slot_once_over_the_shards(
    citus: _citus.Cluster, sharded: tuple[str, Scheduler], tmp_path: Path
) -> None:
    url, _ = sharded
    app = Scheduler(url, shards=SHARDS, registry=Registry(), clock=ManualClock(T0))
    tenants = [t for found in tenants_per_shard(3) for t in found]  # 12 tasks, 3 a shard
    app.put_tasks(
        [
            TaskSpec(name=f"every-{t}", cron="* * * * *", handler="ok", tenant=t, overlap="allow")
            for t in tenants
        ]
    )
    app.close()
    processes, steps = 4, 8
    racers = [
        run_helper("tick", url, tmp_path, i, processes, steps, T0.isoformat())
        for i in range(processes)
    ]
    finish(racers)
    dispatched = [
        json.loads(line)
        for i in range(processes)
        for line in (tmp_path / f"dispatched-{i}.jsonl").read_text().splitlines()
    ]
    slots = Counter((d["row"], d["slot"]) for d in dispatched)
    assert [key for key, n in slots.items() if n > 1] == []  # no slot dispatched twice
    wanted = {
        (f"every-{t}", (T0 + timedelta(minutes=i)).isoformat())
        for t in tenants
        for i in range(1, steps + 1)
    }
    assert set(slots) == wanted  # and none missed
    jobs = ids_by_shard(citus, "scheduler_jobs")
    assert sum(len(ids) for ids in jobs.values()) == len(wanted)  # one job per slot, no more
    assert sorted(d["job_id"] for d in dispatched) == sorted(
        i for ids in jobs.values() for i in ids
    )
    for k in range(SHARDS):
        assert len(jobs[k]) == 3 * steps


def lines(directory: Path, prefix: str) -> list[str]:
    return [
        line
        for path in directory.glob(f"{prefix}-*")
        for line in path.read_text().split("\n")
        if line
    ]


def wait_for(what: str, check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


MOVES = int(os.environ.get("SCHEDULER_TEST_SHARD_MOVES", "1"))
"""How many times the moving test moves the shard (to the other node, and back, ...): more
moves, more chances to catch a rare race (1 by default)."""

WORKERS_SYNCHRONOUS_COMMIT = os.environ.get("SCHEDULER_TEST_MOVE_SYNCHRONOUS_COMMIT", "on")
"""The worker nodes' ``synchronous_commit`` while the moving test runs (the cluster's own is
``off``). A ``force_logical`` move needs it on: Citus's last catch-up waits for the source's
WAL *write* position (``pg_current_wal_lsn()``), and a commit made with ``synchronous_commit =
off`` just before the shard's writes were blocked can lie past it, so the new placement never
gets it (``reliability/citus_move_lost_writes.py``). ``off`` reproduces that here."""


def evidence_of(directory: Path, job_ids: list[int]) -> list[dict[str, Any]]:
    """What the worker processes recorded of these jobs (``shard_process.py``: their claims,
    runs and outcomes, with the node each statement went to), in time order."""
    found = []
    for path in directory.glob("evidence-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("id") in job_ids:
                found.append({"process": path.stem, **record})
    return sorted(found, key=lambda r: r["at"])


@contextmanager
def workers_synchronous_commit(citus: _citus.Cluster, value: str) -> Iterator[None]:
    """The worker nodes' ``synchronous_commit`` set to `value` (``ALTER SYSTEM``, reloaded:
    every session takes it at its next statement) for the block, reset after it."""
    for node in citus.workers:
        node.sql(f"ALTER SYSTEM SET synchronous_commit = {value}", "postgres")
        node.sql("SELECT pg_reload_conf()", "postgres")
    try:
        yield
    finally:
        for node in citus.workers:
            node.sql("ALTER SYSTEM RESET synchronous_commit", "postgres")
            node.sql("SELECT pg_reload_conf()", "postgres")


@pytest.mark.parametrize("mode", ["force_logical", "block_writes"])
def test_a_shard_moved_to_the_other_node_under_load_loses_and_doubles_no_job(
    citus: _citus.Cluster, sharded: tuple[str, Scheduler], tmp_path: Path, mode: str
) -> None:
    """``force_logical``: the tables are copied while they are written, then logical
    replication catches up and the writes wait only for the switch (the worker nodes with
    ``synchronous_commit`` on: :data:`WORKERS_SYNCHRONOUS_COMMIT`); ``block_writes``: the
    shard's writes wait for the whole copy. The worker processes record each job's claims,
    runs and outcomes with the node each statement went to, and each move's old placement
    (kept for a deferred drop) is read right after the move: a job lost or run twice is told
    apart as a write that reached the old placement after the switch, or one that reached it
    before and that the new placement never got."""
    url, _ = sharded
    moved = schema_name(0)
    tenants = 8  # t0..t7: every shard has some (tenants_per_shard)
    assert {shard_of(f"t{n}", SHARDS) for n in range(tenants)} == set(range(SHARDS))
    sql(citus, "CALL citus_cleanup_orphaned_resources()")  # an earlier test's old placement
    shard = sql(
        citus,
        f"SELECT shardid FROM citus_shards WHERE table_name = '{moved}.scheduler_jobs'::regclass",
    )
    moves: list[dict[str, Any]] = []
    setting = WORKERS_SYNCHRONOUS_COMMIT if mode == "force_logical" else "off"
    with workers_synchronous_commit(citus, setting):
        workers = [run_helper("work", url, tmp_path, i, tenants) for i in range(2)]
        try:
            wait_for("both workers", lambda: len(list(tmp_path.glob("progress-*"))) == 2)
            wait_for("jobs run before the move", lambda: len(lines(tmp_path, "ran")) >= 40)
            for n in range(MOVES):
                if n:
                    sql(citus, "CALL citus_cleanup_orphaned_resources()")  # the last move's
                    done = len(lines(tmp_path, "ran"))
                    wait_for(
                        "jobs run between moves",
                        lambda done=done: len(lines(tmp_path, "ran")) >= done + 40,
                    )
                moves.append(move(citus, moved, shard, mode, tmp_path / f"old-placement-{n}"))
                before = len(lines(tmp_path, "enqueued"))
                wait_for(
                    "jobs enqueued after the move",
                    lambda before=before: len(lines(tmp_path, "enqueued")) >= before + 80,
                )
            (tmp_path / "moves.json").write_text(json.dumps(moves))
            (tmp_path / "stop").touch()
            (tmp_path / "drain").touch()
            finish(workers)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
    assert lines(tmp_path, "failed") == []
    enqueued = [int(i) for i in lines(tmp_path, "enqueued")]
    assert len(enqueued) == len(set(enqueued))
    ran = Counter(int(i) for i in lines(tmp_path, "ran"))
    lost = sorted(set(enqueued) - set(ran))
    doubled = sorted(i for i, n in ran.items() if n > 1)
    unfinished = {  # every job's state should be succeeded
        int(row.split("|")[0]): row
        for k in range(SHARDS)
        for row in sql(
            citus,
            f"SELECT j.id, j.state, j.attempts, j.fence, j.lease_owner, r.attempt, r.outcome,"
            f" r.worker FROM {schema_name(k)}.scheduler_jobs j"
            f" LEFT JOIN {schema_name(k)}.scheduler_runs r ON r.job_id = j.id"
            f" WHERE j.state <> 'succeeded' OR j.id IN ({','.join(map(str, [0, *doubled]))})",
        ).splitlines()
    }
    problems = sorted(set(lost) | set(doubled) | set(unfinished))
    if problems:  # everything recorded of them, kept with the test's directory
        report = {
            "lost": lost,
            "doubled": doubled,
            "rows": unfinished,
            "moves": moves,
            "old_placements": {
                path.name: [row for row in path.read_text().splitlines() if row_id(row) in problems]
                for path in sorted(tmp_path.glob("old-placement-*"))
            },
            "evidence": evidence_of(tmp_path, problems),
        }
        (tmp_path / "problems.json").write_text(json.dumps(report, indent=1))
    where = f"{tmp_path / 'problems.json'}"
    assert lost == [], f"jobs enqueued that never ran: {lost} ({where})"
    assert doubled == [], f"jobs run twice: {doubled}, {unfinished} ({where})"
    assert [row for i, row in unfinished.items() if i not in doubled] == [], where
    in_moved = [i for i in enqueued if (i - 1) % SHARDS == 0]
    assert in_moved and max(in_moved) > min(in_moved)
    total = sql(
        citus,
        "SELECT "
        + " + ".join(
            f"(SELECT count(*) FROM {schema_name(k)}.scheduler_jobs)" for k in range(SHARDS)
        ),
    )
    assert int(total) == len(enqueued)


def row_id(row: str) -> int | None:
    """The id of a row as psql prints it (``id|...``); None for a line that is not one."""
    head = row.split("|")[0]
    return int(head) if head.isdigit() else None


def move(citus: _citus.Cluster, schema: str, shard: str, mode: str, old: Path) -> dict[str, Any]:
    """Move `schema` to the other worker node; its old placement's jobs written to `old` right
    after (before the deferred drop removes it). The ports and the wall times of the move."""
    source = citus.node_of(schema, DATABASE)
    [target] = [w for w in citus.workers if w.port != source.port]
    began = time.time()
    sql(
        citus,
        f"SELECT citus_move_shard_placement({shard}, '127.0.0.1', {source.port},"
        f" '127.0.0.1', {target.port}, shard_transfer_mode => '{mode}')",
    )
    done = {"source": source.port, "target": target.port, "began": began, "ended": time.time()}
    try:
        rows = source.sql(
            f"SELECT id, state, attempts, fence, lease_owner FROM {schema}.scheduler_jobs_{shard}",
            DATABASE,
        )
    except RuntimeError as exc:  # dropped already
        rows = f"unread: {exc}"
    old.write_text(rows)
    assert citus.node_of(schema, DATABASE).port == target.port
    return done
