"""``Scheduler``: the facade users import. It wires the store, the handlers and the clock."""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine

from . import _alerts, _jobs, _migrate, _rows, _tick
from ._config import AppConfig, SchedulerSettings, TaskSpec, WorkerSettings, load_config
from ._errors import ConfigError
from ._handlers import AbandonedHook, F, Registry
from ._jobs import Job
from ._payload import encode_payload
from ._retry import retry
from ._rows import SyncPlan, TaskRow
from ._runner import Runner
from ._store import Store
from ._tick import TickReport
from ._time import Clock, as_utc, utcnow

#: Handlers registered with ``@app.handler`` land here unless a Scheduler gets its own
#: ``registry``, so a worker started by the CLI sees the handlers its imports registered.
default_registry = Registry()

_T = TypeVar("_T")


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Scheduler:
    """A recurring-task scheduler on a durable SQL job queue."""

    def __init__(
        self,
        database_url: str | None = None,
        *,
        engine: Engine | None = None,
        tasks: Iterable[TaskSpec] = (),
        settings: SchedulerSettings | None = None,
        worker: WorkerSettings | None = None,
        registry: Registry | None = None,
        clock: Clock | None = None,
        worker_id: str | None = None,
        config_path: str | None = None,
        **overrides: Any,
    ) -> None:
        if engine is None and database_url is None:
            raise ConfigError("Scheduler needs a database_url (or an engine)")
        settings = settings or SchedulerSettings()
        worker = worker or WorkerSettings()
        for key, value in overrides.items():
            if hasattr(settings, key):
                settings = dataclasses.replace(settings, **{key: value})
            elif hasattr(worker, key):
                worker = dataclasses.replace(worker, **{key: value})
            else:
                raise TypeError(f"Scheduler() got an unexpected keyword argument {key!r}")
        self.settings = settings
        self.worker_settings = worker
        self.tasks = tuple(tasks)
        self.config_path = config_path
        self.store = Store(engine if engine is not None else str(database_url))
        self.registry = registry if registry is not None else default_registry
        self.clock: Clock = clock or utcnow
        self.worker_id = worker_id or default_worker_id()
        self._schema_ok = False

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **kwargs: Any) -> Scheduler:
        """Build from a TOML file (SPEC §3); ``SCHEDULER_DATABASE_URL`` overrides its url."""
        config = load_config(path)
        return cls.from_config(config, **kwargs)

    @classmethod
    def from_config(cls, config: AppConfig, **kwargs: Any) -> Scheduler:
        return cls(
            config.database_url,
            tasks=config.tasks,
            settings=config.scheduler,
            worker=config.worker,
            config_path=config.path,
            **kwargs,
        )

    # -- handlers -----------------------------------------------------------------------
    def handler(
        self,
        name: str,
        *,
        retry_safe: bool = False,
        max_attempts: int = 3,
        abandoned: AbandonedHook | None = None,
        queue: str = "default",
    ) -> Callable[[F], F]:
        """Register the decorated callable as the handler called ``name``."""
        return self.registry.handler(
            name, retry_safe=retry_safe, max_attempts=max_attempts, abandoned=abandoned, queue=queue
        )

    def _job_defaults(self, handler: str) -> tuple[int, str]:
        found = self.registry.get(handler)
        return (found.max_attempts, found.queue) if found else (3, "default")

    # -- schema -------------------------------------------------------------------------
    def migrate(self, revision: str = "head") -> None:
        """Create or upgrade the schema (our own Alembic version table).

        An older ``revision`` (or ``"base"``) downgrades: that drops what later revisions
        added, data included. Take a backup first.
        """
        _migrate.migrate_to(self.store, revision)
        self._schema_ok = False

    def check_schema(self) -> None:
        """Raise :class:`SchemaOutdated` unless the schema is current (checked once)."""
        if not self._schema_ok:
            _migrate.check_schema(self.store)
            self._schema_ok = True

    # -- rows -----------------------------------------------------------------------------
    def sync(self, tasks: Iterable[TaskSpec] | None = None, *, dry_run: bool = False) -> SyncPlan:
        """Make the rows match the TOML tasks atomically; ``dry_run`` only plans."""
        self.check_schema()
        chosen = self.tasks if tasks is None else tuple(tasks)

        def attempt() -> SyncPlan:  # one transaction: a deadlock rolled all of it back
            with self.store.begin() as conn:
                return _rows.sync(
                    conn,
                    chosen,
                    now=self.clock(),
                    payload_limit=self.settings.payload_limit_bytes,
                    dry_run=dry_run,
                )

        return retry("sync", attempt)

    def tick(self, now: datetime | None = None) -> TickReport:
        """Dispatch, rerun, hold back or disable every due row; see SPEC §2."""
        self.check_schema()
        return _tick.tick(
            self.store,
            now=as_utc(now) if now is not None else self.clock(),
            max_consecutive_failures=self.settings.max_consecutive_failures,
            batch_size=self.settings.batch_size,
            job_defaults=self._job_defaults,
            connections=self.settings.tick_connections,
        )

    def enable(self, name: str) -> bool:
        """Re-enable a disabled row (count reset, re-armed from now); False if it was enabled."""
        return retry(f"enable {name}", lambda: self._in_transaction(_rows.enable, name))

    def disable(self, name: str) -> None:
        retry(f"disable {name}", lambda: self._in_transaction(_rows.disable, name))

    def trigger(self, name: str) -> None:
        retry(f"trigger {name}", lambda: self._in_transaction(_rows.trigger, name))

    def _in_transaction(self, change: Callable[[Any, str, datetime], _T], name: str) -> _T:
        with self.store.begin() as conn:
            return change(conn, name, self.clock())

    def get_row(self, name: str) -> TaskRow | None:
        with self.store.read() as conn:
            return _rows.get_row(conn, name)

    def rows(self) -> list[TaskRow]:
        with self.store.read() as conn:
            return _rows.all_rows(conn)

    def deliver_pending_alerts(self, older_than: float = 30.0) -> int:
        """Deliver ``row_disabled`` alerts whose receivers never ran (a crash after commit)."""
        with self.store.engine.connect() as conn:
            return _alerts.deliver_pending(
                conn, now=self.clock(), older_than=timedelta(seconds=older_than)
            )

    # -- jobs -----------------------------------------------------------------------------
    def enqueue(
        self,
        handler: str,
        payload: dict[str, Any] | None = None,
        *,
        run_at: datetime | None = None,
        priority: int = 0,
        dedupe_key: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
    ) -> int:
        """Add a job; returns its id (with a ``dedupe_key``: the active job's id if any).

        Raises :class:`PayloadError` for a bad payload, ``ValueError`` for ``max_attempts``
        below 1 or a ``handler``, ``queue`` or ``dedupe_key`` longer than its column.
        """
        text = encode_payload(payload, self.settings.payload_limit_bytes)
        default_attempts, default_queue = self._job_defaults(handler)
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        queue = queue or default_queue
        _jobs.check_text(handler=handler, queue=queue, dedupe_key=dedupe_key)
        values = _jobs.new_job_values(
            handler=handler,
            payload=text,
            now=self.clock(),
            run_at=as_utc(run_at) if run_at is not None else None,
            priority=priority,
            dedupe_key=dedupe_key,
            queue=queue,
            max_attempts=max_attempts or default_attempts,
        )
        return _jobs.enqueue(self.store, values)

    def get_job(self, job_id: int) -> Job | None:
        with self.store.read() as conn:
            return _jobs.get_job(conn, job_id)

    def history(self, job_id: int) -> list[dict[str, Any]]:
        """Every finished attempt of a job, oldest first."""
        with self.store.read() as conn:
            return _jobs.history(conn, job_id)

    def runner(self) -> Runner:
        w = self.worker_settings
        return Runner(
            self.store,
            self.registry,
            owner=self.worker_id,
            clock=self.clock,
            lease=timedelta(seconds=w.lease_seconds),
            backoff_base=timedelta(seconds=self.settings.backoff_base_seconds),
            backoff_max=timedelta(seconds=self.settings.backoff_max_seconds),
            queues=w.queues,
        )

    def work(self, limit: int | None = None) -> int:
        """Run ready jobs in this thread until none is ready; returns how many were handled."""
        self.check_schema()
        return self.runner().work(limit)

    def purge(self) -> int:
        """Delete old succeeded (and much older aborted) jobs and their history."""
        w = self.worker_settings

        def attempt() -> int:
            with self.store.begin() as conn:
                return _jobs.purge(
                    conn,
                    now=self.clock(),
                    succeeded_after=timedelta(days=w.purge_succeeded_after_days),
                    aborted_after=timedelta(days=w.purge_aborted_after_days),
                )

        return retry("purge", attempt)

    def status(self) -> dict[str, Any]:
        """Rows, job counts and health: the data of ``scheduler status --json`` (SPEC §5)."""
        from . import _health

        return _health.status(self)

    def close(self) -> None:
        self.store.dispose()
