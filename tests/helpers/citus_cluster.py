"""The ``citus`` engine of the contract suite: a Citus coordinator and two worker nodes of this
pytest process's own (``reliability/_citus.py``), started on first use on free ports and stopped
at the end of the session, and the 4 shard schemas of a sharded scheduler in its database, each
a Citus distributed schema (schema-based sharding: a schema's tables live on one worker node,
and every statement that stays inside it is routed there), 2 on each worker node. Each test of
the engine works in one of them, in turn (:func:`url`).

Without Citus (``../shared/tools/install-citus.sh`` builds and installs it for PostgreSQL 15) the
``citus`` cases skip with the reason; with ``CI=true`` they fail.

A test runs on it when it takes ``db_url`` or ``pg_url`` and is marked ``citus`` (the core of
the suite: the queue, the tick, rows, the runtime task API, wake-ups); the others' ``citus``
cases are deselected (``tests/conftest.py``).
"""

from __future__ import annotations

import atexit
import os

import _citus
import pytest

SHARDS = 4
SCHEMAS = tuple(f"scheduler_shard_{index}" for index in range(SHARDS))
"""The distributed schemas of the cluster's database: the 4 shards of a sharded scheduler,
placed by Citus over both worker nodes. The ``citus`` engine's tests take turns over them
(:func:`url`): each test works in one shard, as one shard's Scheduler of ``shards = 4`` does."""
SCHEMA = SCHEMAS[0]
"""Shard 0's schema."""

_IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_started: list[_citus.Cluster] = []
_problem: list[str] = []


def cluster() -> _citus.Cluster:
    """This pytest process's cluster, started on first use (about 3 s) and stopped at the end
    of the session (or at exit); skips (fails under CI) when it cannot be started."""
    if not _started and not _problem:
        try:
            made = _citus.Cluster(workers=2)
        except FileNotFoundError as exc:
            _problem.append(str(exc))
        else:
            atexit.register(made.stop)  # also if the session never finishes cleanly
            try:
                _started.append(made.start())
            except BaseException:
                made.stop()
                raise
            for schema in SCHEMAS:
                made.distributed_schema(schema)
    if _problem:
        if _IN_CI:
            pytest.fail(f"Citus: {_problem[0]}; CI requires it", pytrace=False)
        pytest.skip(f"Citus: {_problem[0]}")
    return _started[0]


_turn = [0]


def url(shard: int | None = None) -> str:
    """The coordinator's URL with ``search_path`` on a shard's schema: `shard`'s, else the next
    in turn (so that the tests spread over every shard, and both worker nodes)."""
    if shard is None:
        shard, _turn[0] = _turn[0] % SHARDS, _turn[0] + 1
    return cluster().url(SCHEMAS[shard])


def schema_of(address: str) -> str:
    """The shard schema a URL of :func:`url` works in."""
    for schema in SCHEMAS:
        if address.endswith(f"search_path%3D{schema}"):
            return schema
    raise ValueError(f"not a shard's URL: {address}")


SHARDS_DATABASE = "scheduler_shards"
"""The cluster's database for the tests of ``[database] shards`` on Citus (schema-based
sharding on in it: the shard schemas ``migrate`` creates are distributed schemas)."""

_shards_made: list[str] = []


def shards_url() -> str:
    """The coordinator's URL of :data:`SHARDS_DATABASE`: created on first use (on every node,
    about a second), then emptied of the shard schemas before each use (what a database is
    before ``scheduler migrate``)."""
    made = cluster()
    if not _shards_made:
        _shards_made.append(made.create_database(SHARDS_DATABASE))
        return _shards_made[0]
    schemas = made.coordinator.sql(
        "SELECT string_agg(nspname, ',') FROM pg_namespace"
        " WHERE nspname LIKE 'scheduler\\_shard\\_%'",
        SHARDS_DATABASE,
    )
    if schemas:
        made.coordinator.sql(f"DROP SCHEMA {schemas} CASCADE", SHARDS_DATABASE)
    return _shards_made[0]


def stop() -> None:
    _shards_made.clear()
    while _started:
        _started.pop().stop()
