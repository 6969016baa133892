"""The shipped Alembic migrations: they build exactly the code's MetaData, keep to their own
version table, go down and up again, and ship inside the wheel (SPEC §5 ``migrate``).

Each test gets an empty namespace of its own (a SQLite file, a PostgreSQL schema, a MariaDB
database), because downgrading must not pull the tables from under the rest of the suite.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from conftest import MYSQL_SERVER, MYSQL_URL, PG_SERVER, PG_URL, require_server
from sqlalchemy import Engine, String, create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from scheduler import Scheduler, SchemaOutdated
from scheduler._model.handlers import Registry
from scheduler._store.migrate import VERSION_TABLE, current_revision, downgrade, head_revision
from scheduler._store.tables import PARTIAL_WHERE, UTCDateTime, jobs, metadata

ROOT = Path(__file__).resolve().parents[2]
OURS = {t.name for t in metadata.sorted_tables}
_names = itertools.count()


def _admin(server: str, ddl: str) -> None:
    engine = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(ddl))
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no tables at all, on each engine."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    name = f"sched_mig_{os.getpid()}_{next(_names)}"
    if request.param == "postgresql":
        require_server(PG_URL, "PostgreSQL")
        _admin(PG_SERVER, f"CREATE SCHEMA {name}")
        try:
            yield f"{PG_SERVER}?options=-csearch_path%3D{name}"
        finally:
            _admin(PG_SERVER, f"DROP SCHEMA IF EXISTS {name} CASCADE")
    else:
        require_server(MYSQL_URL, "MariaDB")
        _admin(MYSQL_SERVER, f"CREATE DATABASE {name}")
        try:
            yield MYSQL_SERVER.rsplit("/", 1)[0] + f"/{name}"
        finally:
            _admin(MYSQL_SERVER, f"DROP DATABASE IF EXISTS {name}")


@pytest.fixture
def app(empty_url: str) -> Iterator[Scheduler]:
    scheduler = Scheduler(empty_url, registry=Registry())
    yield scheduler
    scheduler.close()


def partition(name: str) -> bool:
    """A day or default partition of the history or the decision log (PostgreSQL, revision
    0015): a part of its table, not a table of the MetaData."""
    return re.search(r"_(p\d{8}|default)$", name) is not None


def tables(engine: Engine) -> set[str]:
    return {name for name in inspect(engine).get_table_names() if not partition(name)}


def schema_diff(engine: Engine) -> list[Any]:
    """What autogenerate would change to make the database match the MetaData."""
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "compare_type": True,
                "version_table": VERSION_TABLE,
                # The host application's own tables are none of our business.
                "include_name": lambda name, kind, parent: (
                    kind != "table" or (name.startswith("scheduler_") and not partition(name))
                ),
            },
        )
        return list(compare_metadata(context, metadata))


def declared_conditions(engine: Engine) -> dict[str, str | None]:
    """The job table's indexes with the conditions the MetaData declares for them, as
    `index_conditions` reports them, on an engine with partial indexes (MariaDB has none)."""
    partial = engine.dialect.name in ("sqlite", "postgresql")
    return {
        str(index.name): str(index.info[PARTIAL_WHERE]).upper()
        if partial and PARTIAL_WHERE in index.info
        else None
        for index in jobs.indexes
    }


def host_versions(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def test_migrated_schema_equals_the_metadata(app: Scheduler):
    engine = app.store.engine
    assert tables(engine) == set()
    app.migrate()
    assert tables(engine) == OURS | {VERSION_TABLE}
    assert schema_diff(engine) == []
    assert current_revision(app.store) == head_revision()
    app.migrate()  # idempotent
    assert schema_diff(engine) == []


def test_migrated_text_and_time_columns_have_the_declared_types(app: Scheduler):
    """Each text and time column's type as the engine spells it, reflected against declared:
    on MariaDB the keys' binary utf8mb4 collation, MEDIUMTEXT payloads and microsecond
    DATETIMEs, which Alembic's comparison above lets through when they differ."""
    engine = app.store.engine
    app.migrate()
    inspector = inspect(engine)
    checked = 0
    for table in metadata.sorted_tables:
        reflected = {column["name"]: column["type"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if isinstance(column.type, (String, UTCDateTime)):
                spelled = reflected[column.name].compile(dialect=engine.dialect)
                assert (table.name, column.name, spelled) == (
                    table.name,
                    column.name,
                    column.type.compile(dialect=engine.dialect),
                )
                checked += 1
    assert checked > 30


def test_migrated_partial_indexes_have_the_declared_conditions(app: Scheduler):
    """Alembic's comparison above does not look at an index's condition: this does, for every
    index of the job table. The MetaData declares the conditions in `Index.info` (tables.py
    says why) and the migrations write them."""
    engine = app.store.engine
    app.migrate()
    declared = declared_conditions(engine)
    partial = sum(1 for where in declared.values() if where)
    assert partial == (0 if engine.dialect.name == "mysql" else 3)
    found = index_conditions(engine, tuple(declared))
    assert {name: where and where.strip("()") for name, where in found.items()} == declared


def test_schema_diff_sees_a_difference(app: Scheduler):
    """The comparison is not blind: a missing index shows up."""
    app.migrate()
    with app.store.begin() as conn:
        conn.execute(
            text("DROP INDEX ix_scheduler_runs_job ON scheduler_runs")
            if app.store.caps.dialect == "mysql"
            else text("DROP INDEX ix_scheduler_runs_job")
        )
    diff = schema_diff(app.store.engine)
    assert [d[0] for d in diff] == ["add_index"]
    assert diff[0][1].name == "ix_scheduler_runs_job"


def test_host_alembic_version_is_untouched(app: Scheduler):
    engine = app.store.engine
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(text("INSERT INTO alembic_version VALUES ('host_0042')"))
    app.migrate()
    assert host_versions(engine) == ["host_0042"]
    downgrade(app.store, "base")
    assert host_versions(engine) == ["host_0042"]
    app.migrate()
    assert host_versions(engine) == ["host_0042"]
    with engine.connect() as conn:
        ours = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    assert ours == [head_revision()]


def test_downgrade_to_base_and_upgrade_again(app: Scheduler):
    engine = app.store.engine
    app.migrate()
    app.enqueue("h", {"n": 1})
    downgrade(app.store, "base")
    assert tables(engine) == {VERSION_TABLE}
    assert current_revision(app.store) is None
    app.migrate()
    assert schema_diff(engine) == []
    fresh = Scheduler(engine=engine, registry=Registry())
    job = fresh.get_job(fresh.enqueue("h", {"n": 2}))
    assert job is not None and job.payload == {"n": 2}


# -- revision 0002: partial lease and finished indexes ----------------------------------------
def index_conditions(
    engine: Engine,
    names: tuple[str, ...] = ("ix_scheduler_jobs_lease", "ix_scheduler_jobs_finished"),
) -> dict[str, str | None]:
    """The WHERE of each index in `names` as the database reports it (None: full); by default
    the lease and finished indexes."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            found = {
                name: sql
                for name, sql in conn.execute(
                    text("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
                )
            }
        elif engine.dialect.name == "postgresql":
            found = {
                name: sql
                for name, sql in conn.execute(
                    text(
                        "SELECT indexname, indexdef FROM pg_indexes"
                        " WHERE schemaname = current_schema()"
                    )
                )
            }
        else:  # MariaDB has no partial indexes: an index has no condition to report
            found = {
                name: ""
                for (name,) in conn.execute(
                    text(
                        "SELECT DISTINCT index_name FROM information_schema.statistics"
                        " WHERE table_schema = DATABASE() AND table_name = 'scheduler_jobs'"
                    )
                )
            }
    result: dict[str, str | None] = {}
    for name in names:
        sql = found[name]
        where = sql.upper().split(" WHERE ", 1)
        result[name] = where[1].strip() if len(where) == 2 else None
    return result


def test_lease_and_finished_indexes_are_partial_where_the_engine_can(app: Scheduler):
    engine = app.store.engine
    app.migrate()
    partial = engine.dialect.name in ("sqlite", "postgresql")
    conditions = index_conditions(engine)
    for name, column in (("lease", "LEASE_EXPIRES_AT"), ("finished", "FINISHED_AT")):
        condition = conditions[f"ix_scheduler_jobs_{name}"]
        if partial:
            assert condition is not None and column in condition and "NOT NULL" in condition
        else:
            assert condition is None
    downgrade(app.store, "0001")  # back to full indexes, then up again
    assert current_revision(app.store) == "0001"
    assert set(index_conditions(engine).values()) == {None}
    app.migrate()
    assert index_conditions(engine) == conditions
    assert schema_diff(engine) == []


def _explain_with_parameters(app: Scheduler, statement: Any, params: dict[str, Any]) -> str:
    """The plan the database picks for `statement` with its values as bound parameters (on
    PostgreSQL the generic plan a prepared statement ends up with, sequential scans off)."""
    from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg

    engine = app.store.engine
    if engine.dialect.name == "postgresql":
        dialect = pg_psycopg.dialect(paramstyle="numeric_dollar")
        sql = statement.compile(dialect=dialect).construct_expanded_state(params).statement
        with engine.connect() as conn:
            conn.execute(text("SET enable_seqscan = off"))
            conn.execute(text("SET plan_cache_mode = force_generic_plan"))
            conn.exec_driver_sql(f"PREPARE probe AS {sql}")
            args = ", ".join("NULL" for _ in range(sql.count("$")))
            plan = conn.exec_driver_sql(f"EXPLAIN EXECUTE probe({args})").scalars().all()
            conn.exec_driver_sql("DEALLOCATE probe")
        assert "$1" in sql  # the values really were parameters
        return "\n".join(plan)
    expanded = statement.compile(dialect=engine.dialect).construct_expanded_state(params)
    values = [expanded.parameters[name] for name in expanded.positiontup or ()]
    values = [v.replace(tzinfo=None).isoformat(" ") if hasattr(v, "tzinfo") else v for v in values]
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {expanded.statement}", tuple(values))
        plan = [str(r[-1]) for r in rows]
    assert "?" in expanded.statement
    return "\n".join(plan)


@pytest.mark.parametrize("query", ["expired leases", "purge"])
def test_the_partial_indexes_serve_their_queries_with_bound_parameters(app: Scheduler, query: str):
    from datetime import UTC, datetime

    from scheduler._store import jobs as _jobs

    app.migrate()
    now = datetime(2030, 1, 1, tzinfo=UTC)
    expired = {"p_now": now, "p_limit": 10, "p_queues": ["default"]}
    if app.store.engine.dialect.name not in ("sqlite", "postgresql"):
        # MariaDB keeps its full indexes (revision 0002 changes nothing there); the queries run.
        with app.store.read() as conn:
            assert (
                conn.execute(
                    _jobs.EXPIRED.params(p_now=now, p_limit=10, p_queues=["default"])
                ).all()
                == []
            )
            assert conn.execute(_jobs.purge_statement(now, now)).all() == []
        return
    if query == "expired leases":
        plan = _explain_with_parameters(app, _jobs.EXPIRED, expired)
        assert "ix_scheduler_jobs_lease" in plan, plan
    else:
        plan = _explain_with_parameters(app, _jobs.purge_statement(now, now), {})
        assert "ix_scheduler_jobs_finished" in plan, plan


# -- revision 0003: the dedupe key's unique index holds only the jobs with a key -------------
def dedupe_index_condition(engine: Engine) -> str | None:
    """The WHERE of the dedupe key's index (None: full), which must be unique on every engine."""
    [index] = [i for i in inspect(engine).get_indexes("scheduler_jobs") if i["name"] == DEDUPE]
    assert index["unique"] and index["column_names"] == ["dedupe_key"]
    return index_conditions(engine, (DEDUPE,))[DEDUPE]


DEDUPE = "ux_scheduler_jobs_dedupe"


def test_0003_keeps_the_jobs_and_the_one_active_job_per_key(app: Scheduler):
    """Up from 0002 with jobs in the table (SQLite rebuilds it), down again, up again: every
    row kept, the index partial where the engine can, a second active job per key refused."""
    from sqlalchemy import insert, select

    from scheduler._store.jobs import new_job_values
    from scheduler._store.tables import jobs

    engine = app.store.engine
    app.migrate()
    downgrade(app.store, "0002")
    from datetime import UTC, datetime

    now = datetime(2030, 1, 1, tzinfo=UTC)
    with app.store.begin() as conn:
        for key in ("a", None, "b", None):
            conn.execute(
                insert(jobs).values(
                    new_job_values(handler="h", payload="{}", now=now, dedupe_key=key)
                )
            )
    before = _job_rows(app)
    app.migrate()
    assert current_revision(app.store) == head_revision()
    assert _job_rows(app) == before
    partial = engine.dialect.name in ("sqlite", "postgresql")
    condition = dedupe_index_condition(engine)
    if partial:
        assert condition is not None and "DEDUPE_KEY IS NOT NULL" in condition
    else:
        assert condition is None
    with pytest.raises(IntegrityError), app.store.begin() as conn:
        conn.execute(
            insert(jobs).values(new_job_values(handler="h", payload="{}", now=now, dedupe_key="a"))
        )
    with app.store.begin() as conn:  # any number of jobs without a key
        conn.execute(insert(jobs).values(new_job_values(handler="h", payload="{}", now=now)))
    downgrade(app.store, "0002")
    assert len(_job_rows(app)) == 5
    with pytest.raises(IntegrityError), app.store.begin() as conn:  # the constraint is back
        conn.execute(
            insert(jobs).values(new_job_values(handler="h", payload="{}", now=now, dedupe_key="b"))
        )
    app.migrate()
    assert schema_diff(engine) == []
    assert dedupe_index_condition(engine) == condition
    with app.store.read() as conn:
        assert conn.execute(select(jobs.c.id).where(jobs.c.dedupe_key == "b")).all() != []


def _job_rows(app: Scheduler) -> list[tuple[Any, ...]]:
    from sqlalchemy import select

    from scheduler._store.tables import jobs

    later = ("traceparent", "slot", "tenant", "cancel_requested_at", "fence")
    before_0004 = [c for c in jobs.c if c.name not in later]  # 0001-0003
    with app.store.read() as conn:
        return [tuple(r) for r in conn.execute(select(*before_0004).order_by(jobs.c.id))]


# -- revision 0004: jobs carry the traceparent of their enqueue -------------------------------
def test_0004_adds_a_nullable_traceparent_and_keeps_the_jobs(app: Scheduler):
    """Up from 0003 with jobs in the table, down again, up again: every job kept, the new
    column NULL for the old jobs and writable, gone after the downgrade, the schema equal to
    the metadata at the end."""
    from datetime import UTC, datetime

    from sqlalchemy import insert, select, update

    from scheduler._store.jobs import new_job_values
    from scheduler._store.tables import jobs

    engine = app.store.engine
    app.migrate()
    downgrade(app.store, "0003")
    assert "traceparent" not in {c["name"] for c in inspect(engine).get_columns("scheduler_jobs")}
    now = datetime(2030, 1, 1, tzinfo=UTC)
    with app.store.begin() as conn:
        for key in ("a", None):
            values = new_job_values(handler="h", payload="{}", now=now, dedupe_key=key)
            conn.execute(insert(jobs).values(values))
    before = _job_rows(app)
    app.migrate()
    assert current_revision(app.store) == head_revision()
    assert _job_rows(app) == before
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with app.store.begin() as conn:
        assert conn.execute(select(jobs.c.traceparent)).scalars().all() == [None, None]
        conn.execute(update(jobs).where(jobs.c.dedupe_key == "a").values(traceparent=traceparent))
    assert app.get_job(before[0][0]).traceparent == traceparent
    downgrade(app.store, "0003")
    assert _job_rows(app) == before
    assert "traceparent" not in {c["name"] for c in inspect(engine).get_columns("scheduler_jobs")}
    app.migrate()
    assert schema_diff(engine) == []
    assert len(_job_rows(app)) == 2


def test_the_dedupe_lookup_uses_the_partial_index(app: Scheduler):
    from scheduler._store import jobs as _jobs

    app.migrate()
    app.enqueue("h", {}, dedupe_key="k")
    if app.store.engine.dialect.name in ("sqlite", "postgresql"):
        plan = _explain_with_parameters(app, _jobs._BY_KEY, {"p_key": "k"})
    else:  # MariaDB: the full unique index, under the same name
        with app.store.engine.connect() as conn:
            explained = conn.exec_driver_sql(
                "EXPLAIN SELECT id FROM scheduler_jobs WHERE dedupe_key = %s", ("k",)
            )
            plan = str([dict(r._mapping) for r in explained])
    assert "ux_scheduler_jobs_dedupe" in plan, plan


def test_outdated_schema_refuses_to_run_and_says_migrate(empty_url: str):
    never = Scheduler(empty_url, registry=Registry())
    for call in (never.tick, never.work):
        with pytest.raises(SchemaOutdated, match="scheduler migrate"):
            call()
    never.migrate()
    assert never.tick().dispatched == []
    assert never.work() == 0
    downgrade(never.store, "base")
    never.close()

    stale = Scheduler(empty_url, registry=Registry())
    for call in (stale.tick, stale.work):
        with pytest.raises(SchemaOutdated, match="scheduler migrate") as info:
            call()
        assert head_revision() in str(info.value)
    stale.close()


# -- the wheel ---------------------------------------------------------------------------------
def run(cmd: list[str], cwd: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(kwargs.pop("env", {}))
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.slow
def test_wheel_installs_and_migrates_outside_the_checkout(tmp_path: Path):
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist)]
    if importlib.util.find_spec("hatchling") is not None:
        build.append("--no-isolation")  # the build backend is here already: no download
    run([*build, str(ROOT)], cwd=tmp_path)
    [wheel] = dist.glob("rerun_scheduler-*.whl")

    venv = tmp_path / "venv"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], cwd=tmp_path)
    python, pip = venv / "bin" / "python", [str(venv / "bin" / "python"), "-m", "pip"]
    run([*pip, "install", "--quiet", "--disable-pip-version-check", str(wheel)], cwd=tmp_path)

    work = tmp_path / "elsewhere"
    work.mkdir()
    located = run([str(python), "-c", "import scheduler; print(scheduler.__file__)"], cwd=work)
    assert located.stdout.strip().startswith(str(venv)), located.stdout
    assert not located.stdout.strip().startswith(str(ROOT))

    (work / "app.toml").write_text('[database]\nurl = "sqlite:///fresh.db"\n')
    cli = venv / "bin" / "scheduler"
    migrated = run([str(cli), "--config", "app.toml", "migrate"], cwd=work)
    assert head_revision() in migrated.stdout
    with sqlite3.connect(work / "fresh.db") as conn:
        found = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        [(version,)] = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()
    conn.close()
    assert found == OURS | {VERSION_TABLE}
    assert version == head_revision()

    # The installed package runs a job on the schema its own migrations made.
    script = (
        "from scheduler import Scheduler\n"
        "app = Scheduler('sqlite:///fresh.db')\n"
        "@app.handler('hello')\n"
        "def hello(job): print('ran', job.payload['who'])\n"
        "app.enqueue('hello', {'who': 'wheel'})\n"
        "print('handled', app.work())\n"
    )
    ran = run([str(python), "-c", script], cwd=work)
    assert ran.stdout.split() == ["ran", "wheel", "handled", "1"]


def test_a_schema_newer_than_the_code_says_so(db_url: str) -> None:
    app = Scheduler(db_url, registry=Registry())
    try:
        with app.store.begin() as conn:
            conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = 'ffff_future'"))
        with pytest.raises(SchemaOutdated, match="newer than this version of scheduler"):
            app.tick()
    finally:
        with app.store.begin() as conn:
            conn.execute(
                text(f"UPDATE {VERSION_TABLE} SET version_num = :head"), {"head": head_revision()}
            )
        app.close()


# -- revision 0005: policies, decisions, audit, slots, tenants, clock offsets -----------------
def test_0005_keeps_rows_and_jobs_and_maps_concurrent_to_overlap_allow(app: Scheduler):
    """Up from 0004 with a concurrent and a plain row and a job, down again, up again: every
    row and job kept, ``concurrent`` rows become ``overlap = 'allow'``, the others ``hold``, the
    new tables there and gone after the downgrade, the schema equal to the metadata."""
    from datetime import UTC, datetime

    from sqlalchemy import insert, select

    from scheduler._store.jobs import new_job_values
    from scheduler._store.tables import jobs, rows

    engine = app.store.engine
    app.migrate()
    downgrade(app.store, "0004")
    assert "scheduler_decisions" not in tables(engine)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    old_rows = [
        c
        for c in rows.c
        if c.name in {c["name"] for c in inspect(engine).get_columns("scheduler_rows")}
    ]
    with app.store.begin() as conn:
        conn.execute(insert(jobs).values(new_job_values(handler="h", payload="{}", now=now)))
        for name, concurrent in (("plain", False), ("parallel", True)):
            conn.execute(
                insert(rows).values(
                    name=name,
                    handler="h",
                    payload="{}",
                    cron="* * * * *",
                    timezone="UTC",
                    concurrent=concurrent,
                    enabled=True,
                    next_run_at=now,
                    consecutive_failures=0,
                    version=1,
                    created_at=now,
                    updated_at=now,
                )
            )
    before = _job_rows(app)
    with app.store.read() as conn:
        rows_before = conn.execute(select(*old_rows).order_by(rows.c.id)).all()
    app.migrate()
    assert current_revision(app.store) == head_revision()
    assert _job_rows(app) == before
    with app.store.read() as conn:
        assert conn.execute(select(*old_rows).order_by(rows.c.id)).all() == rows_before
        overlap = dict(tuple(r) for r in conn.execute(select(rows.c.name, rows.c.overlap)))
        assert overlap == {"plain": "hold", "parallel": "allow"}
        assert [tuple(r) for r in conn.execute(select(rows.c.jitter, rows.c.catchup_window))] == [
            (0, 0),
            (0, 0),
        ]
        assert [tuple(r) for r in conn.execute(select(jobs.c.slot, jobs.c.tenant))] == [
            (None, None)
        ]
    assert {"scheduler_decisions", "scheduler_audit"} <= tables(engine)
    downgrade(app.store, "0004")
    assert _job_rows(app) == before
    with app.store.read() as conn:
        assert conn.execute(select(*old_rows).order_by(rows.c.id)).all() == rows_before
    assert not {"scheduler_decisions", "scheduler_audit"} & tables(engine)
    app.migrate()
    assert schema_diff(engine) == []


# -- revision 0006: the decision log without its index on decided_at --------------------------
def _decision_indexes(engine: Engine) -> set[str]:
    return {i["name"] for i in inspect(engine).get_indexes("scheduler_decisions") if i["name"]}


def test_0006_drops_the_decision_time_index_and_keeps_the_entries(app: Scheduler):
    """Up from 0005 with entries, down again, up again: the entries kept every time, the
    index on ``decided_at`` gone at 0006 and back at 0005, (task, id) there throughout."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import select

    from scheduler._store import decisions as _decisions
    from scheduler._store.tables import decisions

    engine = app.store.engine
    app.migrate()
    downgrade(app.store, "0005")
    assert _decision_indexes(engine) == {"ix_scheduler_decisions_task", "ix_scheduler_decisions_at"}
    now = datetime(2030, 1, 1, tzinfo=UTC)
    with app.store.begin() as conn:
        _decisions.write(
            conn,
            [
                _decisions.entry_params(f"t{i}", "dispatched", now, now + timedelta(seconds=i), i)
                for i in range(3)
            ],
        )

    def entries() -> list[tuple[Any, ...]]:
        with app.store.read() as conn:
            return [tuple(r) for r in conn.execute(select(decisions).order_by(decisions.c.id))]

    before = entries()
    assert len(before) == 3
    app.migrate("0006")
    assert current_revision(app.store) == "0006"
    assert _decision_indexes(engine) == {"ix_scheduler_decisions_task"}
    assert entries() == before
    downgrade(app.store, "0005")
    assert "ix_scheduler_decisions_at" in _decision_indexes(engine)
    assert entries() == before
    app.migrate()
    assert entries() == before
    assert schema_diff(engine) == []


def test_the_schema_check_reads_the_same_head_as_alembic() -> None:
    """`check_schema` skips Alembic when the database is at the head it reads from the shipped
    revision files: that head must be Alembic's own."""
    from scheduler._store.migrate import head_revision, shipped_head

    assert shipped_head() == head_revision()


# -- revision 0007: the due index in the due query's order -----------------------------------
def _due_index_columns(engine: Engine) -> list[str | None]:
    [found] = [
        i
        for i in inspect(engine).get_indexes("scheduler_rows")
        if i["name"] == "ix_scheduler_rows_due"
    ]
    return list(found["column_names"])


def test_0007_puts_id_in_the_due_index_and_back(app: Scheduler):
    """Up from 0006 with a row, down again, up again: the due index is (enabled, next_run_at)
    at 0006 and (enabled, next_run_at, id) at 0007; the row kept every time."""
    from datetime import UTC, datetime

    from sqlalchemy import insert, select

    from scheduler._store.tables import rows

    engine = app.store.engine
    app.migrate()
    downgrade(app.store, "0006")
    assert _due_index_columns(engine) == ["enabled", "next_run_at"]
    now = datetime(2030, 1, 1, tzinfo=UTC)
    with app.store.begin() as conn:
        conn.execute(
            insert(rows),
            {
                "name": "t",
                "handler": "h",
                "payload": "{}",
                "cron": "* * * * *",
                "timezone": "UTC",
                "concurrent": False,
                "enabled": True,
                "next_run_at": now,
                "consecutive_failures": 0,
                "version": 1,
                "created_at": now,
                "updated_at": now,
            },
        )

    def names() -> list[str]:
        with app.store.read() as conn:
            return list(conn.execute(select(rows.c.name)).scalars())

    app.migrate("0007")
    assert current_revision(app.store) == "0007"
    assert _due_index_columns(engine) == ["enabled", "next_run_at", "id"]
    assert names() == ["t"]
    downgrade(app.store, "0006")
    assert _due_index_columns(engine) == ["enabled", "next_run_at"]
    app.migrate()
    assert names() == ["t"]
    assert schema_diff(engine) == []
