"""PostgreSQL schema-per-tenant: every run's queries go to its tenant's schema.

Each tenant's tables live in a schema of their own (named after the tenant, or as ``schema=``
maps it); a job without a tenant uses ``public``. :class:`SchemaPerTenant` is both the
``@app.tenant_context`` factory and where handlers get their connections::

    from scheduler import Scheduler
    from scheduler.tenancy import SchemaPerTenant

    app = Scheduler.from_toml("app.toml")
    tenants = SchemaPerTenant("postgresql+psycopg://app@db/app")
    app.tenant_context(tenants.context)

    @app.handler("reports.daily")
    def daily(job):
        with tenants.connect() as conn:          # SQLAlchemy Connection, in a transaction
            conn.execute(text("SELECT count(*) FROM invoices"))   # the tenant's invoices

    @app.handler("reports.async")
    async def daily_async(job):
        async with tenants.connect_async() as conn:   # psycopg AsyncConnection, in a transaction
            await conn.execute("SELECT count(*) FROM invoices")

"The connection the handler uses" is the one these two open: each is a transaction whose
``search_path`` is set with ``SET LOCAL`` (``set_config(..., true)``), so it ends with the
transaction and never leaks into a pooled connection that another tenant's run gets next.
A program with a pool of its own sets it itself, with :meth:`SchemaPerTenant.search_path`.
Behind a transaction pooler (PgBouncer; ``pooler="transaction"``, or
``SCHEDULER_DATABASE_POOLER=transaction`` in the environment) this is the only way that
works, and these connections make no server-side prepared statements either.

Entering the context checks that the tenant's schema exists: a missing schema fails that run
with code ``tenant_context_failed`` (the handler never starts), and no other tenant's run.
The current run's schema is held in a context variable: concurrent runs (threads, asyncio
tasks) each see their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text

from .._worker.runner import current_job

__all__ = ["SchemaPerTenant", "TenantSchemaMissing"]

_SCHEMA: ContextVar[str | None] = ContextVar("scheduler_tenant_schema", default=None)
_EXISTS = text("SELECT 1 FROM pg_namespace WHERE nspname = :name")
_SET_LOCAL = "SELECT set_config('search_path', %s, true)"


class TenantSchemaMissing(LookupError):
    """The tenant's schema does not exist."""


def quote(name: str) -> str:
    """``name`` as a PostgreSQL identifier (tenant ids may hold ``-`` or start with a digit)."""
    return '"' + name.replace('"', '""') + '"'


class _Entered:
    """The context of one run of a tenant's job (sync and async protocols both)."""

    def __init__(self, owner: SchemaPerTenant, tenant: str) -> None:
        self.owner = owner
        self.schema = owner.schema_for(tenant)
        self._token: Token[str | None] | None = None

    def __enter__(self) -> str:
        self.owner.check(self.schema)
        self._token = _SCHEMA.set(self.schema)
        return self.schema

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _SCHEMA.reset(self._token)
            self._token = None

    async def __aenter__(self) -> str:
        await asyncio.to_thread(self.owner.check, self.schema)
        self._token = _SCHEMA.set(self.schema)
        return self.schema

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(kind, exc, tb)


class SchemaPerTenant:
    """A PostgreSQL database with one schema per tenant.

    ``database``: a SQLAlchemy URL or ``Engine`` (``postgresql+psycopg://...``) for
    :meth:`connect` and the schema check; :meth:`connect_async` opens psycopg's
    ``AsyncConnection`` to the same database (or to ``async_conninfo``). ``schema`` maps a
    tenant id to its schema's name (default: the id itself); ``default`` is the schema of a
    run without a tenant; ``shared`` schemas are searched after the tenant's (e.g.
    ``("public",)`` for tables every tenant shares). ``pooler``: ``"transaction"`` when
    ``database`` is a transaction-mode pooler (PgBouncer): no server-side prepared statements
    on the connections made here (default: ``SCHEDULER_DATABASE_POOLER``, else ``"none"``;
    an ``Engine`` given is used as it is).
    """

    def __init__(
        self,
        database: str | Engine,
        *,
        schema: Callable[[str], str] | None = None,
        default: str = "public",
        shared: tuple[str, ...] = (),
        async_conninfo: str | None = None,
        pooler: str | None = None,
    ) -> None:
        if pooler is None:
            pooler = os.environ.get("SCHEDULER_DATABASE_POOLER", "").strip() or "none"
        if pooler not in ("none", "transaction"):
            raise ValueError(f"pooler must be 'none' or 'transaction', not {pooler!r}")
        #: No server-side prepared statements (psycopg's ``prepare_threshold=None``).
        self.unprepared = pooler == "transaction"
        if isinstance(database, str):
            unprepared = {"prepare_threshold": None} if self.unprepared else {}
            is_psycopg = database.startswith("postgresql+psycopg:")
            self.engine = create_engine(database, connect_args=unprepared if is_psycopg else {})
        else:
            self.engine = database
        self.schema_for: Callable[[str], str] = schema or (lambda tenant: tenant)
        self.default = default
        self.shared = shared
        url = self.engine.url.set(drivername="postgresql")
        self.async_conninfo = async_conninfo or url.render_as_string(hide_password=False)

    # -- the tenant context ----------------------------------------------------------------
    def context(self, tenant: str) -> _Entered:
        """The ``@app.tenant_context`` factory: the run of ``tenant``'s job uses its schema."""
        return _Entered(self, tenant)

    def check(self, schema: str) -> None:
        """Raise :class:`TenantSchemaMissing` unless ``schema`` exists."""
        with self.engine.connect() as conn:
            if conn.execute(_EXISTS, {"name": schema}).first() is None:
                raise TenantSchemaMissing(f"schema {schema!r} does not exist")

    # -- what the current run uses -----------------------------------------------------------
    def schema(self) -> str:
        """The current run's schema: its tenant's, or ``default`` (no tenant, or no run)."""
        found = _SCHEMA.get()
        if found is not None:
            return found
        job = current_job()
        if job is not None and job.tenant is not None:
            raise RuntimeError(
                f"job {job.id} has tenant {job.tenant!r} but no schema was set for its run:"
                " register this SchemaPerTenant's context with app.tenant_context(...)"
            )
        return self.default

    def search_path(self) -> str:
        """The ``search_path`` value for the current run (quoted identifiers)."""
        return ", ".join(quote(name) for name in (self.schema(), *self.shared))

    @contextlib.contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection in a transaction (committed at the end of the block, rolled back on
        an exception) whose ``search_path`` is the current run's."""
        path = self.search_path()
        with self.engine.begin() as conn:
            conn.exec_driver_sql(_SET_LOCAL, (path,))
            yield conn

    @contextlib.asynccontextmanager
    async def connect_async(self) -> AsyncIterator[Any]:
        """A psycopg ``AsyncConnection`` in a transaction whose ``search_path`` is the
        current run's (closed at the end of the block)."""
        import psycopg

        path = self.search_path()
        if self.unprepared:  # behind a transaction pooler
            connect = psycopg.AsyncConnection.connect(self.async_conninfo, prepare_threshold=None)
        else:
            connect = psycopg.AsyncConnection.connect(self.async_conninfo)
        async with await connect as conn:
            async with conn.transaction():
                await conn.execute(_SET_LOCAL, (path,))
                yield conn

    def dispose(self) -> None:
        self.engine.dispose()
