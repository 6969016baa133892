"""Shards (``[database] shards = N``, PostgreSQL): the tables once per shard, in schemas
``scheduler_shard_0`` … of one database; every task, job, run and decision in the shard its
tenant (else its name) routes it to; ids unique across shards; bad input refused, nothing
written. Directly and through PgBouncer (``shards_url``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from scheduler import ConfigError, Scheduler, SchedulerError, TaskSpec
from scheduler._errors import SchemaOutdated
from scheduler._model.handlers import Registry
from scheduler._store import shards as _shards
from scheduler.testing import ManualClock

SHARDS = 4
START = datetime(2030, 1, 7, 9, 0, 30, tzinfo=UTC)


def _sharded(url: str, clock: ManualClock | None = None, shards: int = SHARDS) -> Scheduler:
    registry = Registry()
    app = Scheduler(url, shards=shards, registry=registry, clock=clock)

    @registry.handler("t.ok")
    def ok(job: object) -> None:
        pass

    return app


def _direct(url: str) -> str:
    """The database itself (not through the pooler) for the checks' own reads."""
    import os

    return os.environ.get("SCHEDULER_DATABASE_LISTEN_URL") or url


def _count(url: str, sql: str) -> int:
    engine = create_engine(_direct(url))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(sql)).scalar() or 0)
    finally:
        engine.dispose()


def _shard_column(url: str, table: str, column: str) -> dict[str, int]:
    """``column`` of every row of ``table`` in every shard -> the shard holding it."""
    engine = create_engine(_direct(url))
    found: dict[str, int] = {}
    try:
        with engine.connect() as conn:
            for index in range(SHARDS):
                schema = _shards.schema_name(index)
                for value in conn.execute(text(f"SELECT {column} FROM {schema}.{table}")).scalars():
                    assert str(value) not in found, f"{value} in two shards"
                    found[str(value)] = index
    finally:
        engine.dispose()
    return found


def test_migrate_creates_every_shard_with_its_tables(shards_url: str) -> None:
    app = _sharded(shards_url)
    app.migrate()
    assert len(app.shards) == SHARDS and app.sharded
    for index in range(SHARDS):
        schema = _shards.schema_name(index)
        tables = _count(
            shards_url,
            f"SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}'"
            " AND tablename = 'scheduler_jobs'",
        )
        assert tables == 1, schema
    # the URL's own schema holds none of the scheduler's tables
    assert _count(shards_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
    app.check_schema()
    app.migrate()  # again: nothing to do, nothing refused
    app.close()


def test_tasks_jobs_runs_and_decisions_live_in_the_shard_their_tenant_routes_to(
    sharded_url: str,
) -> None:
    clock = ManualClock(START)
    app = _sharded(sharded_url, clock)
    tenants = [f"tenant-{i}" for i in range(12)]
    specs = [
        TaskSpec(name=f"report-{t}", cron="* * * * *", handler="t.ok", tenant=t) for t in tenants
    ]
    specs += [TaskSpec(name=f"plain-{i}", cron="* * * * *", handler="t.ok") for i in range(6)]
    app.sync(specs)
    clock.set(START + timedelta(minutes=1))
    report = app.tick()
    assert sorted(report.dispatched) == sorted(spec.name for spec in specs)
    assert app.work() == len(specs)

    rows = _shard_column(sharded_url, "scheduler_rows", "name")
    for spec in specs:
        expected = _shards.shard_of(_shards.routing_key(spec.tenant, spec.name), SHARDS)
        assert rows[spec.name] == expected, spec.name
    assert len(set(rows.values())) == SHARDS  # 18 tasks: every shard holds some
    jobs = _shard_column(sharded_url, "scheduler_jobs", "id || ':' || task_name")
    for key, shard in jobs.items():
        job_id, name = key.split(":", 1)
        assert shard == rows[name]  # a task's jobs in its shard
        assert _shards.shard_of_id(int(job_id), SHARDS) == shard  # ids name their shard
    runs = _shard_column(sharded_url, "scheduler_runs", "job_id")
    assert {job_id: shard for job_id, shard in runs.items()} == {
        key.split(":")[0]: shard for key, shard in jobs.items()
    }
    decisions = _shard_column(sharded_url, "scheduler_decisions", "id || ':' || task_name")
    assert decisions
    for key, shard in decisions.items():
        assert shard == rows[key.split(":", 1)[1]]  # a task's decisions in its shard
    for spec in specs[:3]:
        explained = app.explain(spec.name)
        assert explained["runs"], spec.name
    app.close()


def test_ids_are_unique_across_shards_and_name_their_shard(sharded_url: str) -> None:
    app = _sharded(sharded_url)
    ids = [app.enqueue("t.ok", {"n": i}, tenant=f"t{i}") for i in range(40)]
    ids += app.enqueue_many([{"handler": "t.ok", "tenant": f"u{i}"} for i in range(40)])
    assert len(set(ids)) == len(ids)
    for position, job_id in enumerate(ids):
        tenant = f"t{position}" if position < 40 else f"u{position - 40}"
        assert _shards.shard_of_id(job_id, SHARDS) == _shards.shard_of(tenant, SHARDS)
        job = app.get_job(job_id)
        assert job is not None and job.tenant == tenant
    listed = app.jobs(limit=500)
    assert sorted(job.id for job in listed) == sorted(ids)
    assert [job.id for job in app.jobs(tenant="t3")] == [ids[3]]
    assert app.work() == len(ids)
    assert all(job.state == "succeeded" for job in app.jobs(limit=500))
    assert app.history(ids[7])[0]["outcome"] == "succeeded"
    app.close()


def test_one_shard_is_the_layout_without_shard_schemas(shards_url: str) -> None:
    app = Scheduler(shards_url, registry=Registry())
    app.migrate()
    assert app.shards == (app,) and not app.sharded
    assert (
        _count(
            shards_url, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'scheduler_shard%'"
        )
        == 0
    )
    assert (
        _count(
            shards_url,
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename = 'scheduler_jobs'",
        )
        == 1
    )
    app.close()


@pytest.mark.parametrize("asked", [1, 3])
def test_a_database_of_4_shards_is_refused_to_a_file_of_another_count(
    sharded_url: str, asked: int
) -> None:
    _refused(sharded_url, SHARDS, asked)


def test_a_database_without_shards_is_refused_to_a_file_of_4(shards_url: str) -> None:
    first = _sharded(shards_url, shards=1)
    first.migrate()
    first.close()
    _refused(shards_url, 1, SHARDS)


def _refused(url: str, made: int, asked: int) -> None:
    """A file of `asked` shards on a database of `made` (migrated) is refused by check_schema
    and by migrate, in one line, and nothing is written."""
    first = _sharded(url, shards=made)
    job = first.enqueue("t.ok", tenant="acme")
    first.close()
    other = _sharded(url, shards=asked)
    with pytest.raises(SchemaOutdated) as refused:
        other.check_schema()
    message = str(refused.value)
    assert "migrate --reshard" in message and "\n" not in message
    with pytest.raises(SchemaOutdated):
        other.migrate()  # not without --reshard
    other.close()
    again = _sharded(url, shards=made)
    found = again.get_job(job)  # nothing was written
    assert found is not None and found.state == "queued"
    assert _count(
        url, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'scheduler_shard%'"
    ) == (made if made > 1 else 0)
    again.close()


def test_a_task_keeps_its_shard_and_names_stay_unique(sharded_url: str) -> None:
    app = _sharded(sharded_url)
    tenants = [f"c{i}" for i in range(8)]
    spec = TaskSpec(name="nightly", cron="0 3 * * *", handler="t.ok", tenant=tenants[0])
    app.put_task(spec)
    moved = next(
        t for t in tenants if _shards.shard_of(t, SHARDS) != _shards.shard_of(tenants[0], SHARDS)
    )
    with pytest.raises(SchedulerError, match="remove the task and put it again"):
        app.put_task(TaskSpec(name="nightly", cron="0 3 * * *", handler="t.ok", tenant=moved))
    row = app.get_row("nightly")
    assert row is not None and row.tenant == tenants[0]
    app.disable("nightly")
    assert app.get_row("nightly").enabled is False  # type: ignore[union-attr]
    assert app.remove_task("nightly") is True
    app.put_task(TaskSpec(name="nightly", cron="0 3 * * *", handler="t.ok", tenant=moved))
    rows = _shard_column(sharded_url, "scheduler_rows", "name")
    assert rows == {"nightly": _shards.shard_of(moved, SHARDS)}
    app.close()


def test_a_sync_refused_in_one_shard_writes_no_shard(sharded_url: str) -> None:
    app = _sharded(sharded_url)
    # A task of the application's own (source api) takes a name in its shard ...
    app.put_task(TaskSpec(name="taken", cron="0 3 * * *", handler="t.ok"))
    taken_shard = _shards.shard_of("taken", SHARDS)
    # ... and the file has it too, beside tasks that go to every other shard.
    others = []
    for i in range(200):
        name = f"file-{i}"
        if _shards.shard_of(name, SHARDS) != taken_shard:
            others.append(TaskSpec(name=name, cron="0 3 * * *", handler="t.ok"))
        if len({_shards.shard_of(s.name, SHARDS) for s in others}) == SHARDS - 1:
            break
    with pytest.raises(ConfigError, match="taken"):
        app.sync([*others, TaskSpec(name="taken", cron="0 4 * * *", handler="t.ok")])
    assert [row.name for row in app.rows()] == ["taken"]  # no shard written
    app.close()


def test_the_callers_transaction_is_refused_with_shards(sharded_url: str) -> None:
    app = _sharded(sharded_url)
    engine = create_engine(_direct(sharded_url))
    with engine.begin() as conn, pytest.raises(SchedulerError, match="connection="):
        app.enqueue("t.ok", connection=conn)
    engine.dispose()
    assert app.jobs() == []
    app.close()


def test_bad_shards_values_are_one_line_naming_the_file_and_key(tmp_path: Path) -> None:
    from scheduler._config import load_config

    for value, expected in (("0", "at least 1"), ('"four"', "integer"), ("-2", "at least 1")):
        path = tmp_path / "app.toml"
        path.write_text(f'[database]\nurl = "postgresql://u@127.0.0.1/x"\nshards = {value}\n')
        with pytest.raises(ConfigError) as refused:
            load_config(path)
        message = str(refused.value)
        assert str(path) in message and "'shards'" in message and expected in message
        assert "\n" not in message
    db = tmp_path / "s.db"
    path = tmp_path / "sqlite.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{db}"\nshards = 2\n')
    with pytest.raises(ConfigError) as refused:
        Scheduler.from_toml(path)
    message = str(refused.value)
    assert str(path) in message and "'shards'" in message and "PostgreSQL" in message
    assert not db.exists()  # nothing written


def test_worker_shards_range_is_checked() -> None:
    assert _shards.parse_range("0-3", 4) == (0, 1, 2, 3)
    assert _shards.parse_range("2,0", 4) == (2, 0)
    assert _shards.parse_range("1", 4) == (1,)
    for bad in ("4", "0-4", "3-1", "x", "1,,2", "-1"):
        with pytest.raises(ConfigError) as refused:
            _shards.parse_range(bad, 4)
        assert "worker --shards" in str(refused.value)


def test_routing_is_stable_and_spread() -> None:
    # CRC-32: the same in every process and on every host (a changed hash would strand rows).
    import zlib

    assert _shards.shard_of("acme", 4) == zlib.crc32(b"acme") % 4
    counts = [0] * 4
    for i in range(4000):
        counts[_shards.shard_of(f"tenant-{i}", 4)] += 1
    assert min(counts) > 800  # about a quarter each
    assert _shards.shard_of("anything", 1) == 0
    assert _shards.routing_key(None, "name") == "name"
    assert _shards.routing_key("acme", "name") == "acme"


@pytest.mark.direct  # its engine is the database's own: through PgBouncer the same case again
def test_shards_need_a_url_not_an_engine(shards_url: str) -> None:
    engine = create_engine(_direct(shards_url))
    with pytest.raises(ConfigError, match=r"'shards'.*need a database URL"):
        Scheduler(engine=engine, shards=2, registry=Registry())
    engine.dispose()


@pytest.mark.direct  # no statement: the URL's pooler changes nothing it reads
def test_the_shards_key_from_the_environment_wins(
    shards_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDULER_DATABASE_SHARDS", "3")
    app = Scheduler(shards_url, registry=Registry())
    assert len(app.shards) == 3
    app.close()
    monkeypatch.setenv("SCHEDULER_DATABASE_SHARDS", "none")
    with pytest.raises(ConfigError, match="SCHEDULER_DATABASE_SHARDS"):
        Scheduler(shards_url, registry=Registry())


def test_a_pause_holds_in_every_shard_and_is_audited_once(sharded_url: str) -> None:
    app = _sharded(sharded_url)
    assert app.pause_queue("default", reason="maintenance") is True
    for shard in app.shards:
        assert [p.queue for p in shard.paused_queues()] == ["default"]
    assert app.pause_queue("default") is False
    assert app.resume_queue("default") is True
    assert all(shard.paused_queues() == [] for shard in app.shards)
    entries = [(e.action, e.target) for e in app.audit()]
    assert entries == [("resume", "queue default"), ("pause", "queue default")]
    app.close()
