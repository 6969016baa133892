"""Tenants (SPEC §13): enqueue(tenant=), a task's `tenant` key, @app.tenant_context around every
run (sync and async), tenant_context_failed, and scheduler.tenancy on a real PostgreSQL with two
schemas whose jobs run at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text

from scheduler import ConfigError, RunningJob, Scheduler, TaskSpec, current_job
from scheduler._config import parse_config
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs, rows
from scheduler._worker.worker import Worker
from scheduler.tenancy import SchemaPerTenant

GOOD = ["a", "Z", "7", "acme", "Acme-EU_2", "9lives", "a" * 63]
BAD: list[Any] = ["", "-acme", "_acme", "a" * 64, "ac me", "acmé", "a.b", "a/b", "a\n", 5]


def job_count(app: Scheduler) -> int:
    with app.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())


@pytest.mark.parametrize("tenant", GOOD)
def test_a_tenant_id_is_stored_with_the_job(app: Scheduler, tenant: str) -> None:
    job = app.enqueue("t.any", tenant=tenant)
    found = app.get_job(job)
    assert found is not None and found.tenant == tenant
    assert app.get_job(app.enqueue("t.any")).tenant is None  # type: ignore[union-attr]


@pytest.mark.parametrize("tenant", BAD)
def test_a_bad_tenant_id_is_refused_at_enqueue(app: Scheduler, tenant: Any) -> None:
    with pytest.raises(ValueError, match="tenant") as caught:
        app.enqueue("t.any", tenant=tenant)
    assert "\n" not in str(caught.value)
    assert job_count(app) == 0


def config(tenant: Any) -> dict[str, Any]:
    task = {"name": "nightly", "cron": "0 3 * * *", "handler": "t.any", "tenant": tenant}
    return {"tasks": [task]}


@pytest.mark.parametrize("tenant", BAD)
def test_a_bad_tenant_key_is_one_error_line_naming_file_task_and_key(tenant: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(tenant), "app.toml")
    message = str(caught.value)
    assert message.startswith("app.toml: task 'nightly': key 'tenant': "), message
    assert "\n" not in message


def test_the_tenant_key_reaches_the_row_and_a_change_is_synced(app: Scheduler) -> None:
    [task] = parse_config(config("acme"), "app.toml").tasks
    assert task.tenant == "acme"
    app.sync([task])
    app.sync([replace(task, tenant="globex")])
    app.sync([replace(task, tenant="globex")])  # unchanged now
    with app.store.read() as conn:
        assert conn.execute(select(rows.c.tenant)).scalars().all() == ["globex"]
    plan = app.sync([replace(task, tenant=None)])
    assert plan.update == ["nightly"]


def test_a_task_spec_with_a_bad_tenant_is_refused_at_sync_and_nothing_changes(
    app: Scheduler,
) -> None:
    good = TaskSpec(name="fine", cron="0 3 * * *", handler="t.any")
    bad = TaskSpec(name="nightly", cron="0 3 * * *", handler="t.any", tenant="-x")
    with pytest.raises(ConfigError, match=r"^task 'nightly': key 'tenant': "):
        app.sync([good, bad])
    assert app.rows(limit=None) == []
    app.sync([good, replace(bad, tenant="fine")])  # stored; a re-sync checks the tenant again
    with pytest.raises(ConfigError, match=r"^task 'nightly': key 'tenant': "):
        app.sync([good, bad])
    assert [r.name for r in app.rows(limit=None)] == ["fine", "nightly"]
    with app.store.read() as conn:
        assert conn.execute(select(rows.c.tenant).order_by(rows.c.name)).scalars().all() == [
            None,
            "fine",
        ]


def test_async_concurrency_is_validated_like_every_key() -> None:
    assert parse_config({"worker": {"async_concurrency": 7}}).worker.async_concurrency == 7
    assert parse_config({}).worker.async_concurrency == 100
    for value, why in (
        (0, "must be at least 1"),
        ("many", "expected an integer"),
        (1.5, "integer"),
    ):
        with pytest.raises(
            ConfigError, match=rf"app.toml: \[worker\]: key 'async_concurrency': .*{why}"
        ):
            parse_config({"worker": {"async_concurrency": value}}, "app.toml")


# -- the tenant context around every run --------------------------------------------------------
def test_the_sync_context_wraps_every_run_of_a_tenants_job(app: Scheduler) -> None:
    events: list[str] = []

    @app.tenant_context
    @contextlib.contextmanager
    def context(tenant: str) -> Iterator[None]:
        events.append(f"enter {tenant}")
        yield
        events.append(f"exit {tenant}")

    @app.handler("t.run")
    def run(job: RunningJob) -> None:
        found = current_job()
        assert found is not None
        events.append(f"run {found.tenant}")

    app.enqueue("t.run", tenant="acme")
    app.enqueue("t.run")  # no tenant: no context
    assert app.work() == 2
    assert events == ["enter acme", "run acme", "exit acme", "run None"]


def test_an_async_context_wraps_async_runs_and_a_sync_one_too(app: Scheduler) -> None:
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def async_context(tenant: str) -> AsyncIterator[None]:
        await asyncio.sleep(0)
        events.append(f"aenter {tenant}")
        yield
        events.append(f"aexit {tenant}")

    @app.handler("a.run")
    async def run(job: RunningJob) -> None:
        await asyncio.sleep(0)
        events.append(f"run {job.tenant}")

    app.tenant_context(async_context)
    app.enqueue("a.run", tenant="acme")
    assert app.work() == 1

    @app.tenant_context
    @contextlib.contextmanager
    def sync_context(tenant: str) -> Iterator[None]:
        events.append(f"enter {tenant}")
        yield

    app.enqueue("a.run", tenant="globex")
    assert app.work() == 1
    assert events == ["aenter acme", "run acme", "aexit acme", "enter globex", "run globex"]


def test_a_context_that_fails_to_enter_fails_only_that_tenants_run(app: Scheduler) -> None:
    ran: list[str | None] = []

    @app.tenant_context
    @contextlib.contextmanager
    def context(tenant: str) -> Iterator[None]:
        if tenant == "broken":
            raise LookupError("no such tenant")
        yield

    @app.handler("t.run", max_attempts=2)
    def run(job: RunningJob) -> None:
        ran.append(job.tenant)

    broken, fine = app.enqueue("t.run", tenant="broken"), app.enqueue("t.run", tenant="fine")
    assert app.work() == 2
    assert ran == ["fine"]  # the handler never started for the broken tenant
    first = app.get_job(broken)
    assert first is not None and (first.state, first.last_error_code) == (
        "queued",
        "tenant_context_failed",
    )  # retried even though the handler is not retry-safe: it never started
    assert app.get_job(fine).state == "succeeded"  # type: ignore[union-attr]
    app.clock = lambda: first.run_at  # the retry's time
    assert app.work() == 1
    last = app.get_job(broken)
    assert last is not None and (last.state, last.last_error_code) == (
        "aborted",
        "tenant_context_failed",
    )


def test_an_async_only_context_cannot_wrap_a_sync_handler(app: Scheduler) -> None:
    @app.tenant_context
    @contextlib.asynccontextmanager
    async def context(tenant: str) -> AsyncIterator[None]:
        yield

    @app.handler("t.sync", max_attempts=1)
    def sync(job: RunningJob) -> None:
        raise AssertionError("never runs")

    job = app.enqueue("t.sync", tenant="acme")
    assert app.work() == 1
    found = app.get_job(job)
    assert found is not None and found.last_error_code == "tenant_context_failed"


# -- scheduler.tenancy on a real PostgreSQL with two schemas -------------------------------------
@pytest.fixture
def tenant_schemas(pg_url: str) -> Iterator[tuple[str, str]]:
    """Two tenants, each with a schema holding table ``owner`` that names it."""
    names = (f"t{os.getpid()}-a", f"t{os.getpid()}-b")
    engine = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for name in names:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
            conn.execute(text(f'CREATE TABLE "{name}".owner (name text)'))
            conn.execute(text(f"INSERT INTO \"{name}\".owner VALUES ('{name}')"))
    yield names
    with engine.connect() as conn:
        for name in names:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
    engine.dispose()


class Overlap:
    """Holds each run until ``parties`` runs are inside at once (proof that they overlap)."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=20)

    def wait(self) -> None:
        self.barrier.wait()


def test_two_tenants_async_jobs_at_once_each_see_only_their_own_schema(
    pg_url: str, tenant_schemas: tuple[str, str]
) -> None:
    app = Scheduler(pg_url, registry=Registry(), async_concurrency=10)
    tenants = SchemaPerTenant(pg_url)
    app.tenant_context(tenants.context)
    seen: dict[str | None, list[tuple[str, list[str]]]] = {}
    inside: list[str | None] = []
    both = asyncio.Event()

    @app.handler("a.report")
    async def report(job: RunningJob) -> None:
        async with tenants.connect_async() as conn:
            for _ in range(2):
                path = (await (await conn.execute("SHOW search_path")).fetchone())[0]
                owners = [r[0] async for r in await conn.execute("SELECT name FROM owner")]
                seen.setdefault(job.tenant, []).append((path, owners))
                inside.append(job.tenant)
                if len(set(inside)) == 2:
                    both.set()
                await asyncio.wait_for(both.wait(), 20)  # the other tenant's run is mid-way

    @app.handler("a.public")
    async def public(job: RunningJob) -> None:
        assert tenants.schema() == "public"
        assert tenants.search_path() == '"public"'

    a, b = tenant_schemas
    ids = [app.enqueue("a.report", tenant=a), app.enqueue("a.report", tenant=b)]
    ids.append(app.enqueue("a.public"))
    Worker(app).run(once=True)
    assert [app.get_job(i).state for i in ids] == ["succeeded"] * 3  # type: ignore[union-attr]
    assert seen == {a: [(f'"{a}"', [a])] * 2, b: [(f'"{b}"', [b])] * 2}
    with app.store.engine.connect() as conn:  # nothing leaked into the pool's connections
        assert "t" + str(os.getpid()) not in conn.execute(text("SHOW search_path")).scalar_one()
    tenants.dispose()
    app.close()


def test_two_tenants_sync_jobs_on_threads_and_a_missing_schema(
    pg_url: str, tenant_schemas: tuple[str, str]
) -> None:
    app = Scheduler(pg_url, registry=Registry(), concurrency=3)
    tenants = SchemaPerTenant(pg_url)
    app.tenant_context(tenants.context)
    seen: dict[str | None, list[Any]] = {}
    overlap = Overlap(2)

    @app.handler("t.report", max_attempts=1)
    def report(job: RunningJob) -> None:
        with tenants.connect() as conn:
            path = conn.execute(text("SHOW search_path")).scalar_one()
            overlap.wait()  # both tenants' runs hold their connections now
            owners = conn.execute(text("SELECT name FROM owner")).scalars().all()
            seen[job.tenant] = [path, owners]

    a, b = tenant_schemas
    ids = [app.enqueue("t.report", tenant=t) for t in (a, b, "nobody-here")]
    began = time.monotonic()
    Worker(app).run(once=True)
    assert time.monotonic() - began < 60
    found = [app.get_job(i) for i in ids]
    assert [(j.state, j.last_error_code) for j in found if j] == [
        ("succeeded", None),
        ("succeeded", None),
        ("aborted", "tenant_context_failed"),  # its schema does not exist: only it fails
    ]
    assert seen == {a: [f'"{a}"', [a]], b: [f'"{b}"', [b]]}
    tenants.dispose()
    app.close()


def test_a_tenants_job_without_the_context_registered_is_refused_by_tenancy(
    pg_url: str, tmp_path: Path
) -> None:
    app = Scheduler(pg_url, registry=Registry())
    tenants = SchemaPerTenant(pg_url)  # its context never registered

    @app.handler("t.report", retry_safe=True, max_attempts=1)
    def report(job: RunningJob) -> None:
        tenants.schema()

    job = app.enqueue("t.report", tenant="acme")
    assert app.work() == 1
    assert app.get_job(job).state == "aborted"  # type: ignore[union-attr]
    assert app.get_job(job).last_error_code == "RuntimeError"  # type: ignore[union-attr]
    tenants.dispose()
    app.close()
