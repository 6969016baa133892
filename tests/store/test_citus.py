"""On Citus (a coordinator and two workers of the session's own, ``tests/helpers/citus_cluster.py``;
the scheduler's tables in one distributed schema): every statement the scheduler sends for an
enqueue, a claim, a heartbeat, an outcome, a takeover and a tick is a single-node (router)
statement, and none of the tick, the claim and the enqueue needs a two-phase commit.

Read from Citus itself: with ``citus.log_remote_commands`` on, the coordinator tells the client
each command it sends to a node, and the node (a ``LOG`` notice, its ``DETAIL`` naming the
server); each of our statements' notices must name the one worker node that holds the schema,
and none may be a ``PREPARE TRANSACTION`` (a two-phase commit). ``pg_dist_transaction`` (where
the coordinator records two-phase commits until it recovers them, every minute by default)
must not grow. The ``EXPLAIN`` of the claim names one task on that node.

Without Citus these skip with the reason; with ``CI=true`` they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _citus
import pytest
from conftest import make_url
from helpers import citus_cluster
from helpers.citus_cluster import SCHEMA
from helpers.citus_remote import RemoteCommands, assert_router

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._worker.runner import RunningJob
from scheduler.testing import ManualClock

T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def citus_app(
    citus: _citus.Cluster, tmp_path: Path, sqlite_template: Path
) -> Iterator[tuple[Scheduler, RemoteCommands, ManualClock]]:
    url = make_url("citus", tmp_path, sqlite_template, shard=0)  # SCHEMA's
    clock = ManualClock(T0)
    app = Scheduler(url, registry=Registry(), clock=clock, worker_id="A", lease_seconds=60)
    remote = RemoteCommands(app.store.engine)
    app.handler("ok")(lambda job: None)

    @app.handler("flaky", max_attempts=3, retry_safe=True)
    def flaky(job: Any) -> None:
        raise RuntimeError("try again")

    yield app, remote, clock
    app.close()


def two_phase_commits(citus: _citus.Cluster) -> int:
    return int(citus.coordinator.sql("SELECT count(*) FROM pg_dist_transaction"))


def test_every_statement_kind_is_routed_to_one_node_without_two_phase_commit(
    citus: _citus.Cluster, citus_app: tuple[Scheduler, RemoteCommands, ManualClock]
) -> None:
    app, remote, clock = citus_app
    runner = app.runner()
    before = two_phase_commits(citus)
    node = citus.node_of(SCHEMA).port  # the schema's: every statement goes there alone

    with remote.during() as enqueue:
        job_id = app.enqueue("ok")
        app.enqueue("ok", dedupe_key="once")
        app.enqueue("ok", dedupe_key="once")  # the key is held: its holder is returned
    assert_router(enqueue, node, "enqueue")

    with remote.during() as claim:
        [job] = runner.claim()
    assert job.id == job_id
    assert_router(claim, node, "claim")

    with remote.during() as heartbeat:
        RunningJob(job, runner).heartbeat()
    assert_router(heartbeat, node, "heartbeat")

    with remote.during() as outcome:
        assert runner.run(job) == "succeeded"
    assert_router(outcome, node, "outcome (success)")

    app.enqueue("flaky")
    with remote.during() as retry:
        [other] = [j for j in runner.claim() if j.handler == "flaky"] or runner.claim()
        runner.run(other)
    found = app.get_job(other.id)
    assert found is not None and found.state == "queued"  # to be retried
    assert_router(retry, node, "claim and outcome (retry)")

    clock.advance(minutes=10)
    [stuck] = [j for j in runner.claim() if j.handler == "flaky"]  # its retry, then lost
    clock.advance(seconds=61)
    with remote.during() as takeover:
        [taken] = app.runner().take_over()
    assert taken.id == stuck.id
    assert_router(takeover, node, "takeover")

    app.sync([TaskSpec(name="nightly", cron="0 3 * * *", handler="ok", timezone="UTC")])
    with remote.during() as tick:
        assert app.tick(now=T0 + timedelta(days=1)).dispatched == ["nightly"]
        assert app.tick(now=T0 + timedelta(days=1, seconds=1)).dispatched == []
    assert_router(tick, node, "tick")

    assert two_phase_commits(citus) == before


def test_the_claim_s_plan_is_one_task_on_the_schema_s_node(
    citus: _citus.Cluster, citus_app: tuple[Scheduler, RemoteCommands, ManualClock]
) -> None:
    """``EXPLAIN`` of the claim as the scheduler sends it: Citus's router plan, one task on the
    node that holds the schema."""
    app, remote, _clock = citus_app
    app.enqueue("ok")
    with remote.during() as claim:
        [_job] = app.runner().claim()
    [sent] = [s for s in claim if "UPDATE scheduler_jobs" in s.statement]
    node = citus.node_of(SCHEMA)
    with app.store.engine.connect() as conn:  # its values too: EXPLAIN does not run it
        cursor = conn.connection.driver_connection.cursor()
        cursor.execute(f"EXPLAIN (COSTS OFF) {sent.statement}", sent.parameters)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        conn.rollback()
    assert "Task Count: 1" in plan, plan
    assert f"port={node.port}" in plan, plan


def test_the_engine_s_tests_take_turns_over_four_shards_on_both_nodes(
    citus: _citus.Cluster, tmp_path: Path, sqlite_template: Path
) -> None:
    """The ``citus`` engine's tests each work in one of the 4 shard schemas, in turn, and the
    4 are spread over both worker nodes: the suite's core runs in every shard, on every node."""
    schemas = {citus_cluster.schema_of(citus_cluster.url()) for _ in range(4)}
    assert schemas == set(citus_cluster.SCHEMAS)
    for shard in range(len(citus_cluster.SCHEMAS)):  # each migrated, as its first test does
        make_url("citus", tmp_path, sqlite_template, shard=shard)
    nodes = {citus.node_of(schema).port for schema in citus_cluster.SCHEMAS}
    assert nodes == {worker.port for worker in citus.workers}
