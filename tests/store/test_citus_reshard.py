"""``scheduler migrate --reshard`` on Citus (the session's cluster, a database of this test's
own with schema-based sharding on): from 2 distributed shard schemas to 3, to the tables
without shards, and back to 2, every job, run and task kept once, each in its routed shard,
new ids fresh. Skipped without Citus; required with ``CI=true``."""

from __future__ import annotations

import os

import _citus
import pytest

from scheduler import ConfigError, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.shards import schema_name, shard_of

pytestmark = pytest.mark.citus


def _app(url: str, shards: int) -> Scheduler:
    registry = Registry()

    @registry.handler("t.ok")
    def ok(job: object) -> None:
        pass

    return Scheduler(url, shards=shards, registry=registry)


def _where(citus: _citus.Cluster, database: str, shards: int) -> dict[int, int]:
    """Each job id -> the shard schema holding it (the tables in ``public`` for one shard)."""
    schemas = [schema_name(i) for i in range(shards)] if shards > 1 else ["public"]
    found: dict[int, int] = {}
    for index, schema in enumerate(schemas):
        out = citus.coordinator.sql(f"SELECT id FROM {schema}.scheduler_jobs", database)
        for line in out.split():
            assert int(line) not in found, f"job {line} in two shards"
            found[int(line)] = index
    return found


def test_reshard_on_citus_moves_every_row_once(citus: _citus.Cluster) -> None:
    database = f"reshard_{os.getpid()}"
    url = citus.create_database(database)
    app = _app(url, 2)
    app.migrate()
    tenants = [f"t{i}" for i in range(24)]
    app.put_tasks(
        [TaskSpec(name=f"nightly-{t}", cron="0 3 * * *", handler="t.ok", tenant=t) for t in tenants]
    )
    owner = {app.enqueue("t.ok", tenant=t): t for t in tenants}
    assert app.work() == len(owner)
    owner.update({app.enqueue("t.ok", tenant=t): t for t in tenants[:8]})  # still queued
    app.close()
    for shards in (3, 1, 2):
        app = _app(url, shards)
        done = app.reshard()
        assert not done.fitted
        where = _where(citus, database, shards)
        assert sorted(where) == sorted(owner)  # none lost, none doubled
        for job_id, tenant in owner.items():
            assert where[job_id] == shard_of(tenant, shards), (job_id, tenant)
        assert len(app.rows(limit=None)) == len(tenants)
        assert sum(1 for job in app.jobs(limit=500) if job.state == "succeeded") == 24
        first = min(owner)
        assert app.history(first)[0]["outcome"] == "succeeded"
        fresh = app.enqueue("t.ok", tenant="new")
        assert fresh > max(owner)  # the sequences restarted above every kept id
        owner[fresh] = "new"
        app.close()


def test_shards_on_citus_without_schema_based_sharding_are_refused(citus: _citus.Cluster) -> None:
    database = f"unsharded_{os.getpid()}"
    url = citus.create_database(database, schema_sharding=False)
    app = _app(url, 2)
    with pytest.raises(ConfigError) as refused:
        app.migrate()
    message = str(refused.value)
    assert "citus.enable_schema_based_sharding" in message
    assert "\n" not in message and "shards = 2" in message
    schemas = citus.coordinator.sql(
        "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'scheduler\\_shard\\_%'", database
    )
    assert schemas.strip() == "0"  # nothing written
    app.close()
