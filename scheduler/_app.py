"""``Scheduler``: the facade users import. It wires the store, the handlers and the clock."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from . import signals
from ._config import (
    AppConfig,
    BrokerSettings,
    DashboardSettings,
    MetricsSettings,
    SchedulerSettings,
    WorkerSettings,
    broker_settings,
    load_config,
)
from ._errors import ConfigError, JobStateError, SchedulerError, SchemaOutdated, UnknownRow
from ._model import rules as _rules
from ._model.defaults import BACKFILL_MAX
from ._model.handlers import AbandonedHook, F, Registry, TenantContext
from ._model.job import Job, RecordedHook
from ._model.limits import Limit, LimitSet, check_limits
from ._model.rows import UNCHANGED, SyncPlan, TaskChange, TaskRow, TaskSpec
from ._model.time import Clock, as_utc, iso
from ._store import Connection, Engine, Store, make_engine
from ._store import audit as _audit
from ._store import clock as _clock
from ._store import decisions as _decisions
from ._store import handlers as _handlers
from ._store import jobs as _jobs
from ._store import limits as _limits
from ._store import migrate as _migrate
from ._store import partitions as _partitions
from ._store import queues as _queues
from ._store import reshard as _reshard
from ._store import rows as _rows
from ._store import shards as _shards
from ._store import wakeup as _wakeup
from ._store.audit import AuditEntry
from ._store.caller import CallerTransaction, adopt
from ._store.queues import PausedQueue
from ._store.retry import retry
from ._store.settings import (
    DatabaseSettings,
    database_settings,
    missing_database,
    missing_driver,
    normalize_database_url,
)
from ._store.status import health as _health

if TYPE_CHECKING:
    from ._model.report import TickReport
    from ._ops import backfill as _backfill
    from ._worker.background import BackgroundWorker
    from ._worker.events import EventLoop
    from ._worker.runner import Runner

# The tick, the runner, backfill and alerts (croniter, the dispatch paths) are imported by the
# methods that use them: `scheduler status` and the dashboard's pages never do.

#: Handlers registered with ``@app.handler`` land here unless a Scheduler gets its own
#: ``registry``, so a worker started by the CLI sees the handlers its imports registered.
default_registry = Registry()
log = logging.getLogger(__name__)


#: Seconds of the clock between two records of this Scheduler's ticks (``Scheduler.tick``).
TICK_RECORD_SECONDS = 5.0

_T = TypeVar("_T")


_BACKFILL_ATTEMPTS = 20


#: The keys of an ``enqueue_many`` item: ``enqueue``'s arguments.
ENQUEUE_KEYS = frozenset(
    ("handler", "payload", "run_at", "priority", "dedupe_key", "queue", "max_attempts", "tenant")
)


def _sync_detail(path: str | None, plan: SyncPlan) -> str:
    counts = ", ".join(
        f"{action} {len(names)}"
        for action, names in plan.as_dict().items()
        if action != "unchanged"
    )
    return f"{path or 'tasks'}: {counts}"


def _change_detail(change: TaskChange) -> str:
    if change.action == "created":
        return "created"
    return f"updated: {', '.join(change.changed)}" if change.changed else "updated"


def _backfill_detail(result: _backfill.BackfillResult) -> str:
    return (
        f"{len(result.enqueued)} job(s) for slots {iso(result.start)} to {iso(result.end)}"
        f" ({len(result.taken)} already had one); jobs {min(result.enqueued.values())}"
        f"-{max(result.enqueued.values())}"
    )


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
        clock: Clock | str | None = None,
        worker_id: str | None = None,
        config_path: str | None = None,
        metrics: MetricsSettings | None = None,
        database_source: str = "database_url",
        database: DatabaseSettings | None = None,
        broker: BrokerSettings | None = None,
        broker_url: str | None = None,
        limits: Iterable[Limit] = (),
        _shard: int | None = None,
        **overrides: Any,
    ) -> None:
        if engine is None and database_url is None:
            raise ConfigError("Scheduler needs a database_url (or an engine)")
        settings = settings or SchedulerSettings()
        worker = worker or WorkerSettings()
        # [database] keys given as keyword arguments (pool_size=..., pooler=...), checked as
        # the file's are; SCHEDULER_DATABASE_<KEY> wins over them, as over the file.
        keys = dataclasses.asdict(database or DatabaseSettings())
        keys.update({k: overrides.pop(k) for k in list(overrides) if k in keys})
        given = {key: value for key, value in keys.items() if value is not None}
        self.database_settings = database_settings(given, "Scheduler()")
        for key, value in overrides.items():
            if hasattr(settings, key):
                settings = dataclasses.replace(settings, **{key: value})
            elif hasattr(worker, key):
                worker = dataclasses.replace(worker, **{key: value})
            else:
                raise TypeError(f"Scheduler() got an unexpected keyword argument {key!r}")
        self.settings = settings
        self.worker_settings = worker
        self.metrics_settings = metrics or MetricsSettings()
        self.tasks = tuple(tasks)
        #: The limits every worker shares (``[[limits]]``); see :meth:`limit_set`.
        self.limits: tuple[Limit, ...] = tuple(limits)
        for limit in self.limits:
            if not isinstance(limit, Limit):
                raise TypeError(f"Scheduler(limits=...) takes Limit objects, got {limit!r}")
        check_limits(self.limits, {}, config_path or "", complete=False)
        self.config_path = config_path
        self.database_source = database_source  # where the URL came from, for messages
        if _shard is not None:  # one shard of several (SCHEDULER_DATABASE_SHARDS says N)
            self.database_settings = dataclasses.replace(self.database_settings, shards=1)
        count = self.database_settings.shards
        if count > 1 and engine is not None:
            raise ConfigError(
                f"{config_path or 'Scheduler()'}: [database] key 'shards': {count} shards need"
                " a database URL (each shard has an engine of its own), not an engine"
            )
        url = ""
        if engine is None:
            url = normalize_database_url(str(database_url), database_source)
            if count > 1 and not url.startswith("postgresql"):
                raise ConfigError(
                    f"{config_path or 'Scheduler()'}: [database] key 'shards': shards are"
                    " schemas of one PostgreSQL database (Citus included); this URL is"
                    f" {url.partition(':')[0].partition('+')[0]}"
                )
            schema = None if _shard is None else _shards.schema_name(_shard)
            try:
                engine = make_engine(url, self.database_settings, schema)
            except ImportError as exc:  # the URL's driver is not installed
                raise ConfigError(missing_driver(url, database_source, exc)) from None
        self.store = Store(engine, self.database_settings)
        #: This one's shard when it is one shard of a sharded scheduler (else None).
        self.shard_index = _shard
        self._shard_count = count if _shard is None else 0  # a shard's: set by its owner
        self.registry = registry if registry is not None else default_registry
        # The database's clock unless told otherwise (scheduler/_store/clock.py).
        chosen = _clock.choose(self.store, clock, settings.clock)
        self.clock_mode = chosen.mode
        self.clock: Clock = chosen.clock
        self._clock_meter = chosen.meter
        self.worker_id = worker_id or default_worker_id()
        self._worker_id_pid = None if worker_id else os.getpid()  # the pid a default id names
        # Wake-ups (scheduler/_store/wakeup/): how this process's transactions announce new jobs.
        if broker is None:
            given = {"url": broker_url} if broker_url is not None else {}
            broker = broker_settings(given, "Scheduler()")
        self.broker_settings = broker
        self._hub = _wakeup.configure(
            self.store,
            self.clock,
            enabled=settings.wakeups,
            broker_url=broker.url,
            prefix=broker.prefix,
        )
        self._schema_ok = False
        self._layout_refused = False  # _check_layout refused the database's shards
        self.dashboard_settings = DashboardSettings()  # the file's [dashboard], if any
        self._tick_recorded_at: datetime | None = None
        self._events: EventLoop | None = None  # app.work()'s loop for async handlers
        self._events_lock = threading.Lock()
        #: Told of every runner's committed outcomes: (the job as written, how it ended);
        #: ``scheduler.metrics`` adds its counter here.
        self.recorded_hooks: list[RecordedHook] = []
        #: The settings workers recorded for handlers this process has not registered.
        self.known_handlers = _handlers.Known(self.store)
        #: The shards (``[database] shards``): a Scheduler for each, over its schema; just
        #: this one when there is one shard.
        self.shards: tuple[Scheduler, ...] = (self,)
        if count > 1:
            one = dataclasses.replace(self.database_settings, shards=1)
            self.shards = tuple(
                Scheduler(
                    url,
                    settings=settings,
                    worker=worker,
                    registry=self.registry,
                    clock=clock,
                    worker_id=self.worker_id,
                    config_path=config_path,
                    metrics=metrics,
                    database_source=database_source,
                    database=_shard_listen(one, index),
                    broker=broker,
                    limits=self.limits,
                    _shard=index,
                )
                for index in range(count)
            )
            for shard in self.shards:
                shard.recorded_hooks = self.recorded_hooks  # one list: the metrics' counter
                shard._shard_count = count

    def clock_offset(self) -> float | None:
        """The database server's time minus this host's wall clock, in seconds (None on
        SQLite, with an injected clock, or while the server cannot be read)."""
        return self._clock_meter.offset() if self._clock_meter is not None else None

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **kwargs: Any) -> Scheduler:
        """Build from a TOML file (docs/reference/toml.md); ``SCHEDULER_DATABASE_URL`` overrides
        its url."""
        config = load_config(path)
        return cls.from_config(config, **kwargs)

    @classmethod
    def from_config(cls, config: AppConfig, **kwargs: Any) -> Scheduler:
        app = cls(
            config.database_url,
            tasks=config.tasks,
            settings=config.scheduler,
            worker=config.worker,
            config_path=config.path,
            metrics=config.metrics,
            database_source=config.database_source,
            database=config.database,
            broker=config.broker,
            limits=config.limits,
            **kwargs,
        )
        app.dashboard_settings = config.dashboard
        return app

    # -- handlers -----------------------------------------------------------------------
    def handler(
        self,
        name: str,
        *,
        retry_safe: bool = False,
        max_attempts: int = 3,
        abandoned: AbandonedHook | None = None,
        queue: str = "default",
        timeout: float | None = None,
        limits: Iterable[str] = (),
        isolation: str = "thread",
    ) -> Callable[[F], F]:
        """Register the decorated callable as the handler called ``name``.

        ``limits``: the names of limits (``Scheduler(limits=...)``, ``[[limits]]``) its jobs
        are under, beside those that name the handler or its queue themselves.
        ``isolation``: ``"thread"`` (the default) or ``"process"``: each attempt runs in a
        child process (a sync function at a module's top level), sent SIGTERM when stopped
        and killed after ``[worker] cancel_grace``; a bad value raises ``ValueError``.

        ``timeout``: seconds one attempt may run (None or 0: no limit). At the limit a worker
        asks the attempt to stop (an ``async def`` handler is cancelled; a sync one sees
        ``job.cancel_requested`` and ``job.check()`` raises :class:`Cancelled`); after
        ``[worker] cancel_grace`` the attempt is over anyway and ends with code ``timeout``."""
        return self.registry.handler(
            name,
            retry_safe=retry_safe,
            max_attempts=max_attempts,
            abandoned=abandoned,
            queue=queue,
            timeout=timeout,
            limits=limits,
            isolation=isolation,
        )

    def limit_set(self, *, check: bool = True) -> LimitSet:
        """The limits with the handlers registered naming them, checked together (``check``):
        a handler naming an unknown limit, or a limit that covers nothing, raises
        ConfigError. Unchecked for the reads (``job ID`` in a process that imports no
        handlers sees the file's limits only)."""
        named = {
            name: handler.limits
            for name in self.registry.names()
            if (handler := self.registry.get(name)) is not None and handler.limits
        }
        if check:
            check_limits(self.limits, named, self.config_path or "")
        return LimitSet(self.limits, named)

    def with_waiting(self, conn: Connection, found: list[Job]) -> list[Job]:
        """``found`` with the ``waiting_for`` of the ready jobs a limit holds back."""
        if not self.limits:
            return found
        sentences = _limits.waiting_for(conn, self.limit_set(check=False), found, self.clock())
        if not sentences:
            return found
        return [
            dataclasses.replace(job, waiting_for=sentences[job.id]) if job.id in sentences else job
            for job in found
        ]

    def tenant_context(self, factory: TenantContext) -> TenantContext:
        """Register ``factory``, ``(tenant) -> context manager`` (sync, or async for ``async
        def`` handlers), entered around every run of a job that has a tenant (a decorator).

        A context that fails to enter fails that run with code ``tenant_context_failed``; the
        handler does not start, and the attempt is retried while attempts remain."""
        return self.registry.set_tenant_context(factory)

    def _job_defaults(self, handler: str) -> tuple[int, str]:
        """For the tick, trigger, backfill and retry: this process's registration, else what
        this process keeps of a worker's record (read by its worker, never here), else the
        defaults."""
        found = self.registry.get(handler)
        if found is not None:
            return found.max_attempts, found.queue
        kept = self.known_handlers.peek(handler)
        return (kept.max_attempts, kept.queue) if kept is not None else (3, "default")

    def _enqueue_defaults(self, handler: str) -> tuple[int, str]:
        """A new job's ``max_attempts`` and queue: this process's registration, else what a
        worker recorded (read once per name, then kept: :class:`._store.handlers.Known`)."""
        found = self.registry.get(handler)
        if found is not None:
            return found.max_attempts, found.queue
        recorded = self.known_handlers.get(handler)
        return (recorded.max_attempts, recorded.queue) if recorded else (3, "default")

    # -- shards -------------------------------------------------------------------------
    @property
    def sharded(self) -> bool:
        """Whether the tables are in several shards (``[database] shards`` above 1)."""
        return len(self.shards) > 1

    def shard_for(self, tenant: str | None, name: str) -> Scheduler:
        """The shard of a task or job of `tenant`, else of `name` (the task's; for a job of
        no task, its handler's)."""
        key = _shards.routing_key(tenant, name)
        return self.shards[_shards.shard_of(key, len(self.shards))]

    def _from(self, first: Scheduler) -> tuple[Scheduler, ...]:
        """The shards, `first` first: where a lookup looks, in turn."""
        return (first, *(shard for shard in self.shards if shard is not first))

    def _row_in_shards(self, name: str) -> tuple[Scheduler, TaskRow | None]:
        """Task `name`'s shard and row: looked for first where its name routes it, then in
        the others; where its name routes it (and None) if no shard holds it."""
        first = self.shard_for(None, name)
        for shard in self._from(first):
            row = shard.get_row(name)
            if row is not None:
                return shard, row
        return first, None

    def _task_shard(self, name: str) -> Scheduler:
        """The shard that holds task `name` (:meth:`_row_in_shards`)."""
        return self._row_in_shards(name)[0]

    def _job_shard(self, job_id: int) -> Scheduler:
        """The shard that holds job `job_id`: first the one whose ids it is from, then the
        others (a reshard moves rows with their ids); that first one if none holds it."""
        first = self.shards[_shards.shard_of_id(job_id, len(self.shards))]
        for shard in self._from(first):
            with shard.store.read() as conn:
                if _jobs.job_exists(conn, job_id):
                    return shard
        return first

    def _one_transaction(self, connection: Any) -> None:
        """The caller's transaction is on the database's own schema, not a shard's."""
        if connection is not None and self.sharded:
            raise SchedulerError(
                "connection=: with [database] shards above 1 the scheduler's tables are in the"
                " shards' schemas, not in your transaction's: enqueue and change tasks without"
                " connection="
            )

    def _sync_shards(
        self,
        tasks: Iterable[TaskSpec] | None,
        *,
        dry_run: bool,
        reason: str | None,
        actor: str | None,
    ) -> SyncPlan:
        """``sync`` over the shards: each task to its shard, every shard's plan checked by a
        dry run before any shard is written (bad input changes nothing); then one
        transaction per shard."""
        self.check_schema()
        chosen = list(self.tasks if tasks is None else tasks)
        groups: dict[int, list[TaskSpec]] = {index: [] for index in range(len(self.shards))}
        for task in chosen:
            key = _shards.routing_key(task.tenant, task.name)
            groups[_shards.shard_of(key, len(self.shards))].append(task)
        merged = SyncPlan()
        for write in (False, True) if not dry_run else (False,):
            merged = SyncPlan()
            for index, group in groups.items():
                try:
                    plan = self.shards[index].sync(
                        group, dry_run=not write, reason=reason, actor=actor
                    )
                except ConfigError as exc:  # the file's task: the error names the file too
                    if tasks is None and self.config_path and not str(exc).startswith("/"):
                        raise ConfigError(f"{self.config_path}: {exc}") from None
                    raise
                for action in ("insert", "update", "unchanged", "disable", "paused", "remove"):
                    getattr(merged, action).extend(getattr(plan, action))
                merged.changes.extend(plan.changes)
        return merged

    def _put_in_shard(self, spec: TaskSpec) -> Scheduler:
        """The shard `spec` belongs in; a task of that name in another shard (its tenant
        changed, or another tenant's task has the name) is refused."""
        target = self.shard_for(spec.tenant, spec.name)
        holder = next((s for s in self._from(target) if s.get_row(spec.name) is not None), target)
        if holder is not target:
            raise SchedulerError(
                f"task {spec.name!r} is in shard {holder.shard_index}, its tenant"
                f" {spec.tenant!r} is in shard {target.shard_index}: remove the task and put it"
                " again to move it (with [database] shards above 1 a task lives in its"
                " tenant's shard)"
            )
        return target

    def _put_many(
        self,
        specs: Iterable[TaskSpec],
        *,
        group: str | None,
        replace: bool,
        dry_run: bool,
        reason: str | None,
        actor: str | None,
    ) -> SyncPlan:
        """``put_tasks`` over the shards: one transaction per shard; with ``replace`` every
        shard (the group's rows not given are removed from each)."""
        chosen: dict[int, list[TaskSpec]] = {}
        for spec in specs:
            index = self._put_in_shard(spec).shard_index or 0
            chosen.setdefault(index, []).append(spec)
        indexes = range(len(self.shards)) if replace else sorted(chosen)
        merged = SyncPlan()
        for index in indexes:
            plan = self.shards[index].put_tasks(
                chosen.get(index, []),
                group=group,
                replace=replace,
                dry_run=dry_run,
                reason=reason,
                actor=actor,
            )
            for action in ("insert", "update", "unchanged", "disable", "paused", "remove"):
                getattr(merged, action).extend(getattr(plan, action))
            merged.changes.extend(plan.changes)
        return merged

    def _enqueue_in_shards(self, items: list[Mapping[str, Any]]) -> list[int]:
        """``enqueue_many`` over the shards: every item checked first (as one shard would),
        then one transaction per shard; the ids in the items' order."""
        now = self.clock()
        for index, item in enumerate(items):
            self._item_values(index, item, now)  # raises for a bad item, before any write
        by_shard: dict[int, list[int]] = {}
        for position, item in enumerate(items):
            handler = str(item.get("handler", ""))
            shard = self.shard_for(item.get("tenant"), handler)
            by_shard.setdefault(shard.shard_index or 0, []).append(position)
        ids: list[int] = [0] * len(items)
        for index, positions in by_shard.items():
            written = self.shards[index].enqueue_many([items[p] for p in positions])
            for position, job_id in zip(positions, written, strict=True):
                ids[position] = job_id
        return ids

    # -- schema -------------------------------------------------------------------------
    def migrate(self, revision: str = "head") -> None:
        """Create or upgrade the schema (our own Alembic version table).

        An older ``revision`` (or ``"base"``) downgrades: that drops what later revisions
        added, data included. Take a backup first.
        """
        if self.sharded:
            self._check_layout()
            _shards.create_schemas(self.store.engine, len(self.shards))
            for shard in self.shards:
                shard.migrate(revision)
            self._schema_ok = False
            return
        if self.shard_index is None:
            self._check_layout()
        _migrate.migrate_to(self.store, revision)
        if self.shard_index is not None and revision != "base":
            with self.store.begin() as conn:  # ids no other shard gives
                _shards.start_sequences(conn, self.shard_index, self._shard_count)
        self._schema_ok = False

    def reshard(self) -> _reshard.Reshard:
        """Move every row to the ``[database] shards`` this Scheduler has, from the shards
        the database has (``scheduler migrate --reshard``; PostgreSQL, workers stopped): each
        task with its jobs, runs, decisions and audit entries to its routing key's shard, the
        shared tables merged into every shard; emptied shards dropped. Refused (nothing
        written) while a worker is alive or a job claimed. A failure leaves every row once,
        and the database refused until it runs again."""
        result = _reshard.reshard(
            self.store, [shard.store for shard in self.shards], now=self.clock()
        )
        for app in {self, *self.shards}:
            app._schema_ok = False
        return result

    def _check_layout(self) -> None:
        """Refuse a PostgreSQL database whose shard schemas do not fit ``[database] shards``
        (one read; nothing to check elsewhere, or in one shard of several)."""
        if self.store.caps.dialect != "postgresql" or self.shard_index is not None:
            return
        with self.store.read() as conn:
            if self.sharded:
                found, base, resharding = _shards.layout(conn)
            else:  # one read: only shard schemas would not fit
                found, base, resharding = _shards.found_shards(conn, but_own=True), True, False
        problem = _shards.layout_error(found, len(self.shards), base, resharding)
        if problem is not None:
            where = f"database {self.database_name} ({self.database_source})"
            self._layout_refused = True
            raise SchemaOutdated(f"{where}: {problem}")

    @property
    def database_name(self) -> str:
        """The database, for messages: a SQLite file's path, else the URL without password."""
        url = self.store.engine.url
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            return os.path.abspath(str(url.database))
        return url.render_as_string(hide_password=True)

    def _sqlite_file_missing(self) -> bool:
        url = self.store.engine.url
        database = url.database
        if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
            return False
        return not database.startswith("file:") and not os.path.exists(database)

    def check_schema(self) -> None:
        """Raise :class:`SchemaOutdated` unless the schema is current (checked once).

        Only :meth:`migrate` creates a database: a SQLite file that does not exist is
        refused here, before anything connects (a connection would create an empty file).
        """
        if self._schema_ok:
            return
        if self.sharded:
            self._check_layout()
            for shard in self.shards:
                shard.check_schema()
            self._schema_ok = True
            return
        where = f"database {self.database_name} ({self.database_source})"
        if self._sqlite_file_missing():
            raise SchemaOutdated(f"{where} does not exist: create it with `scheduler migrate`")
        try:
            self._check_layout()  # first: shard schemas where none are expected say so
            _migrate.check_schema(self.store)
        except SchemaOutdated as exc:
            if self._layout_refused:
                raise
            text = str(exc)
            raise SchemaOutdated(f"{where}: {text.removeprefix('database ')}") from None
        except Exception as exc:
            missing = missing_database(self.store.engine.url, exc)
            if missing is None:
                raise
            raise SchedulerError(f"{where} does not exist on the server: {missing}") from None
        self._schema_ok = True

    # -- rows -----------------------------------------------------------------------------
    def sync(
        self,
        tasks: Iterable[TaskSpec] | None = None,
        *,
        dry_run: bool = False,
        reason: str | None = None,
        actor: str | None = None,
    ) -> SyncPlan:
        """Make the rows match the TOML tasks atomically; ``dry_run`` only plans.

        A sync that changes rows writes one audit entry (``actor``, ``reason``) in its
        transaction; a dry run or a sync that changes nothing writes none.
        """
        if self.sharded:
            return self._sync_shards(tasks, dry_run=dry_run, reason=reason, actor=actor)
        self.check_schema()
        who, why = _audit.check(actor, reason)
        zone = self.settings.timezone  # a TaskSpec without one: as a task in the file
        chosen = tuple(
            task if task.timezone is not None else dataclasses.replace(task, timezone=zone)
            for task in (self.tasks if tasks is None else tasks)
        )

        def attempt() -> SyncPlan:  # one transaction: a deadlock rolled all of it back
            with self.store.begin() as conn:
                read: list[datetime] = []

                def clock() -> datetime:  # read once the rows are (see _rows.apply)
                    read.append(self.clock())
                    return read[-1]

                try:
                    plan = _rows.sync(
                        conn,
                        chosen,
                        now=clock,
                        payload_limit=self.settings.payload_limit_bytes,
                        dry_run=dry_run,
                        preview=dry_run,
                    )
                except ConfigError as exc:  # the file's task: the error names the file too
                    if tasks is None and self.config_path and not str(exc).startswith("/"):
                        raise ConfigError(f"{self.config_path}: {exc}") from None
                    raise
                if not dry_run and (plan.insert or plan.update or plan.disable):
                    _audit.record(
                        conn,
                        now=read[0],
                        actor=who,
                        action="sync",
                        target=None,
                        reason=why,
                        detail=_sync_detail(self.config_path, plan),
                    )
                return plan

        try:
            plan = retry("sync", attempt)
        except _rows.NameTaken as taken:  # its transaction is gone: say which name, then
            with self.store.read() as conn:
                name = _rows.taken_name(conn, taken.names, _rows.FILE)
            if name is None:
                raise
            error = _rows.name_taken_error(name)
            if tasks is None and self.config_path:
                raise ConfigError(f"{self.config_path}: {error}") from None
            raise error from None
        for name, slot, reason in plan.paused:  # after the commit (never for a rollback)
            signals.send(signals.slot_skipped, name, slot=slot, decision="paused", reason=reason)
        return plan

    def tick(self, now: datetime | None = None, *, record: bool = True) -> TickReport:
        """Dispatch, rerun, hold back or disable every due row (docs/explanation/tick.md).

        The tick is kept on record for ``status`` (any process that ticks counts as ticking),
        at most once every ``TICK_RECORD_SECONDS`` of the clock: the idle tick stays one
        statement in between. ``record=False`` leaves that to the caller (a running worker
        records its ticks itself, with its presence).
        """
        if self.sharded:
            self.check_schema()
            ticked_at = as_utc(now) if now is not None else self.clock()
            from ._model.report import TickReport as Report

            merged = Report()
            for shard in self.shards:
                merged.extend(shard.tick(ticked_at, record=record))
            return merged
        from . import _tick

        self.check_schema()  # first: the database's clock would fail less clearly
        ticked_at = as_utc(now) if now is not None else self.clock()
        report = _tick.tick(
            self.store,
            now=ticked_at,
            max_consecutive_failures=self.settings.max_consecutive_failures,
            batch_size=self.settings.batch_size,
            job_defaults=self._job_defaults,
            connections=self.settings.tick_connections,
        )
        if record:
            self._record_tick(ticked_at)
        return report

    def _record_tick(self, ticked_at: datetime) -> None:
        now = self.clock()
        last = self._tick_recorded_at
        if last is not None and last <= now < last + timedelta(seconds=TICK_RECORD_SECONDS):
            return
        try:
            _health.record_tick(self.store, now, ticked_at, clock_offset=self.clock_offset())
        except Exception as exc:  # the tick itself is done: worth a warning, no more
            log.warning("could not record the tick for `status`: %s", exc)
            return
        self._tick_recorded_at = now

    def enable(
        self,
        name: str,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: Any = None,
    ) -> bool:
        """Re-enable a disabled row (count reset, re-armed from now, its disable note cleared);
        False if it was enabled (nothing changed, nothing audited). The slots that passed while
        it was disabled are logged as ``paused``, and ``slot_skipped`` is sent for each after
        the commit (with ``connection``: after the caller's commit)."""
        if self.sharded:
            self._one_transaction(connection)
            return self._task_shard(name).enable(name, reason=reason, actor=actor)
        paused: list[tuple[datetime, str]] = []

        def change(conn: Any, row: str, now: datetime) -> bool:
            paused.clear()  # a retried transaction starts again
            return _rows.enable(conn, row, now, paused)

        def send() -> None:
            for slot, why in paused:  # after the commit (never for a rollback)
                signals.send(signals.slot_skipped, name, slot=slot, decision="paused", reason=why)

        return self._audited_row("enable", name, reason, actor, change, connection, send)

    def disable(
        self,
        name: str,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: Any = None,
    ) -> None:
        """Pause a row until :meth:`enable`; ``reason`` is kept as its ``disabled_note``."""
        if self.sharded:
            self._one_transaction(connection)
            return self._task_shard(name).disable(name, reason=reason, actor=actor)

        def change(conn: Any, row: str, now: datetime) -> None:
            _rows.disable(conn, row, now, note=_audit.check(actor, reason)[1])

        self._audited_row("disable", name, reason, actor, change, connection)

    def trigger(
        self,
        name: str,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: Any = None,
    ) -> None:
        """Make a row due now (the tick's gates still apply)."""
        if self.sharded:
            self._one_transaction(connection)
            return self._task_shard(name).trigger(name, reason=reason, actor=actor)
        self._audited_row("trigger", name, reason, actor, _rows.trigger, connection)

    def _audited_row(
        self,
        action: str,
        name: str,
        reason: str | None,
        actor: str | None,
        change: Callable[[Any, str, datetime], _T],
        connection: Any = None,
        committed: Callable[[], None] | None = None,
    ) -> _T:
        """``change`` and its audit entry in one transaction (none when it returned False:
        nothing changed): ours, or the caller's ``connection``; ``committed`` runs after the
        commit."""
        who, why = _audit.check(actor, reason)

        def write(conn: Any) -> _T:
            now = self.clock()
            result = change(conn, name, now)
            if result is not False:
                _audit.record(conn, now=now, actor=who, action=action, target=name, reason=why)
            return result

        return self._write(f"{action} {name}", write, connection, committed)

    def _write(
        self,
        what: str,
        write: Callable[[Any], _T],
        connection: Any,
        committed: Callable[[], None] | None = None,
    ) -> _T:
        """``write`` in a transaction of our own (run again after a deadlock), or on the
        caller's ``connection`` (its transaction: nothing committed, nothing retried);
        ``committed`` runs after the commit, ours or the caller's."""
        with self._caller(connection) as caller:
            if caller is not None:
                result = write(caller.conn)
                if committed is not None:
                    caller.on_commit(committed)
                return result

        def attempt() -> _T:
            with self.store.begin() as conn:
                return write(conn)

        result = retry(what, attempt)
        if committed is not None:
            committed()
        return result

    def _caller(self, connection: Any) -> AbstractContextManager[CallerTransaction | None]:
        """The caller's transaction to write in (``connection=``), checked; None: our own."""
        if connection is None:
            return self._ambient_transaction()
        self.check_schema()  # once per Scheduler, on our own connection
        return nullcontext(adopt(connection, self.store))

    def _ambient_transaction(self) -> AbstractContextManager[CallerTransaction | None]:
        """The transaction a write joins when no ``connection`` is given (None here: its own;
        ``scheduler.contrib.django`` joins Django's atomic block)."""
        return nullcontext(None)

    def get_row(self, name: str) -> TaskRow | None:
        if self.sharded:
            return self._row_in_shards(name)[1]
        with self.store.read() as conn:
            return _rows.get_row(conn, name)

    def rows(
        self,
        *,
        source: str | None = None,
        group: str | None = None,
        tenant: str | None = None,
        prefix: str | None = None,
        limit: int | None = 50,
        after: str | None = None,
    ) -> list[TaskRow]:
        """Rows by name, ``limit`` of them (``None``: all), each filter applied when given:
        ``source`` (``file`` or ``api``), ``group``, ``tenant``, a name ``prefix``; ``after`` is
        the last name of the previous page."""
        if self.sharded:
            chosen = self.shards if tenant is None else (self.shard_for(tenant, ""),)
            found = [
                row
                for shard in chosen
                for row in shard.rows(
                    source=source,
                    group=group,
                    tenant=tenant,
                    prefix=prefix,
                    limit=limit,
                    after=after,
                )
            ]
            found.sort(key=lambda row: row.name)
            return found if limit is None else found[:limit]
        if source is not None and source not in _rows.SOURCES:
            raise ValueError(f"source {source!r}: expected one of {', '.join(_rows.SOURCES)}")
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        with self.store.read() as conn:
            return _rows.list_rows(
                conn,
                source=source,
                group=group,
                tenant=tenant,
                prefix=prefix,
                limit=limit,
                after=after,
            )

    # -- tasks as data: the application's own rows ----------------------------------------
    def _owner(self) -> str:
        """Who owns the file's rows, for messages: the configuration file's name."""
        return os.path.basename(self.config_path) if self.config_path else "the file (sync)"

    def _zoned(self, spec: TaskSpec) -> TaskSpec:
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"expected a TaskSpec, got {type(spec).__name__}")
        if spec.timezone is not None:
            return spec
        return dataclasses.replace(spec, timezone=self.settings.timezone)

    def put_task(
        self,
        spec: TaskSpec,
        *,
        connection: Any = None,
        dry_run: bool = False,
        reason: str | None = None,
        actor: str | None = None,
    ) -> TaskChange:
        """Create the task ``spec`` describes, or update the task of that name; the row is the
        application's (``source`` ``api``), never the file's.

        The spec is checked as a task of the file is (a ``ConfigError`` naming the task and the
        key; nothing written). A name that belongs to a row of the file is a
        :class:`SchedulerError`. An update keeps the sync's rules: a changed cron, zone or
        jitter moves ``next_run_at`` to its first slot from now; a changed payload or handler
        is used by the next dispatch (a rerun in place included); the failure count and an
        automatic disable survive unless ``enabled`` changes. An unchanged spec writes nothing
        and no audit entry. ``connection``: the caller's transaction (docs/explanation/
        transactional-enqueue.md); ``dry_run`` writes nothing and returns the same change.
        """
        if self.sharded:
            self._one_transaction(connection)
            return self._put_in_shard(spec).put_task(
                spec, dry_run=dry_run, reason=reason, actor=actor
            )
        self.check_schema()
        who, why = _audit.check(actor, reason)
        chosen = self._zoned(spec)

        def write(conn: Any) -> TaskChange:
            read: list[datetime] = []

            def clock() -> datetime:  # read once the row is (see _rows.apply)
                read.append(self.clock())
                return read[-1]

            plan = _rows.apply(
                conn,
                [chosen],
                now=clock,
                payload_limit=self.settings.payload_limit_bytes,
                source=_rows.API,
                dry_run=dry_run,
                owner_name=self._owner(),
                preview=True,
            )
            now = read[0]
            row = _rows.get_row(conn, chosen.name)  # after the change (a dry run: before it)
            if plan.unchanged:
                fires = _rows.fires_of(row, now) if row is not None else ()
                return TaskChange(UNCHANGED, row, fires, fires, chosen.name)
            [found] = plan.changes
            change = dataclasses.replace(found, row=row)
            if not dry_run:
                _audit.record(
                    conn,
                    now=now,
                    actor=who,
                    action="put_task",
                    target=chosen.name,
                    reason=why,
                    detail=_change_detail(change),
                )
            return change

        return self._write(f"put_task {chosen.name}", write, connection)

    def put_tasks(
        self,
        specs: Iterable[TaskSpec],
        *,
        group: str | None = None,
        replace: bool = False,
        connection: Any = None,
        dry_run: bool = False,
        reason: str | None = None,
        actor: str | None = None,
    ) -> SyncPlan:
        """Every spec as :meth:`put_task` does, in one transaction: all or nothing. With
        ``group``, every spec gets that group; with ``replace=True`` the group's rows not in
        ``specs`` are removed as :meth:`remove_task` removes them ("this customer's schedules
        are exactly these"). Returns the plan: inserted, updated, unchanged and removed names
        (``insert``, ``update``, ``unchanged``, ``remove``); one audit entry when it changed
        anything."""
        if self.sharded:
            self._one_transaction(connection)
            return self._put_many(
                specs, group=group, replace=replace, dry_run=dry_run, reason=reason, actor=actor
            )
        if replace and group is None:
            raise ValueError("put_tasks(replace=True) needs a group: its rows not given go")
        self.check_schema()
        who, why = _audit.check(actor, reason)
        chosen = [self._zoned(spec) for spec in specs]

        def write(conn: Any) -> SyncPlan:
            read: list[datetime] = []

            def clock() -> datetime:  # read once the rows are (see _rows.apply)
                read.append(self.clock())
                return read[-1]

            plan = _rows.apply(
                conn,
                chosen,
                now=clock,
                payload_limit=self.settings.payload_limit_bytes,
                source=_rows.API,
                dry_run=dry_run,
                group=group,
                replace=replace,
                owner_name=self._owner(),
                preview=dry_run,
            )
            if not dry_run and (plan.insert or plan.update or plan.remove):
                _audit.record(
                    conn,
                    now=read[0],
                    actor=who,
                    action="put_tasks",
                    target=None,
                    reason=why,
                    detail=_sync_detail(f"group {group}" if group else "tasks", plan),
                )
            return plan

        return self._write("put_tasks", write, connection)

    def remove_task(
        self,
        name: str,
        *,
        connection: Any = None,
        reason: str | None = None,
        actor: str | None = None,
    ) -> bool:
        """Remove the application's task ``name``: no slot of it is dispatched once the removal
        commits (also by a tick running meanwhile elsewhere), its queued jobs are cancelled
        (code ``cancelled``), a running one finishes and is never rerun in place; its jobs, run
        history, decisions and audit entries stay until their retention, and the name is free
        at once. False if there is no such task; a task of the file is a
        :class:`SchedulerError`."""
        if self.sharded:
            self._one_transaction(connection)
            return self._task_shard(name).remove_task(name, reason=reason, actor=actor)
        self.check_schema()
        who, why = _audit.check(actor, reason)

        def write(conn: Any) -> bool:
            now = self.clock()
            if not _rows.remove(conn, name, now):
                if _rows.source_of(conn, name) == _rows.FILE:
                    raise SchedulerError(f"task {name!r} is managed by {self._owner()}")
                return False
            _audit.record(conn, now=now, actor=who, action="remove_task", target=name, reason=why)
            return True

        return self._write(f"remove_task {name}", write, connection)

    def deliver_pending_alerts(self, older_than: float = 30.0) -> int:
        """Deliver ``row_disabled`` alerts whose receivers never ran (a crash after commit)."""
        if self.sharded:
            return sum(shard.deliver_pending_alerts(older_than) for shard in self.shards)
        with self.store.engine.connect() as conn:
            from ._store import alerts as _alerts

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
        tenant: str | None = None,
        connection: Any = None,
    ) -> int:
        """Add a job; returns its id (with a ``dedupe_key``: the active job's id if any).

        ``tenant`` (1-63 ASCII letters, digits, ``_``, ``-``; a letter or digit first) is whose
        job it is: ``job.tenant``, and the ``@app.tenant_context`` is entered around its runs.

        ``connection``: a SQLAlchemy ``Connection`` or ``Session`` in a transaction on this
        scheduler's database; the job is written in that transaction and exists if and only if
        the caller commits it (docs/explanation/transactional-enqueue.md). Without it, the job
        is written and committed in a transaction of its own.

        Raises :class:`PayloadError` for a bad payload, ``ValueError`` for ``max_attempts``
        below 1, a bad ``tenant``, or a ``handler``, ``queue`` or ``dedupe_key`` longer than
        its column; :class:`SchedulerError` for a ``connection`` that is not in a transaction,
        in autocommit, or on another database.
        """
        if self.sharded:
            self._one_transaction(connection)
            return self.shard_for(tenant, handler).enqueue(
                handler,
                payload,
                run_at=run_at,
                priority=priority,
                dedupe_key=dedupe_key,
                queue=queue,
                max_attempts=max_attempts,
                tenant=tenant,
            )
        from ._observe import tracing as _tracing

        values = self._job_values(
            handler,
            payload,
            now=self.clock(),
            run_at=run_at,
            priority=priority,
            dedupe_key=dedupe_key,
            queue=queue,
            max_attempts=max_attempts,
            tenant=tenant,
        )
        with (
            self._caller(connection) as caller,
            _tracing.enqueue_span(handler, values["queue"]) as span,  # OpenTelemetry, if set
        ):
            values.update(span.fields)
            if caller is None:
                job_id = _jobs.enqueue(self.store, values)
            else:
                job_id = _jobs.enqueue_on(self.store, caller.conn, values)
            span.job_id(job_id)
        return job_id

    def _job_values(
        self,
        handler: str,
        payload: dict[str, Any] | None = None,
        *,
        now: datetime,
        run_at: datetime | None = None,
        priority: int = 0,
        dedupe_key: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """A new job's column values, every argument checked (nothing is written here)."""
        _rules.check_job(handler, run_at, priority, max_attempts, tenant)
        from ._model.payload import encode_payload

        text = encode_payload(payload, self.settings.payload_limit_bytes)
        if queue is not None and max_attempts is not None:
            default_attempts, default_queue = max_attempts, queue  # both given: nothing to read
        else:
            default_attempts, default_queue = self._enqueue_defaults(handler)
        queue = queue or default_queue
        _rules.check_text(handler=handler, queue=queue, dedupe_key=dedupe_key)
        return _jobs.new_job_values(
            handler=handler,
            payload=text,
            now=now,
            run_at=as_utc(run_at) if run_at is not None else None,
            priority=priority,
            dedupe_key=dedupe_key,
            queue=queue,
            max_attempts=max_attempts or default_attempts,
            tenant=tenant,
        )

    def enqueue_many(
        self, items: Iterable[Mapping[str, Any]], *, connection: Any = None
    ) -> list[int]:
        """Add many jobs at once; returns their ids, in the items' order.

        Each item is a mapping of :meth:`enqueue`'s keyword names: ``handler`` (required),
        ``payload``, ``run_at``, ``priority``, ``dedupe_key``, ``queue``, ``max_attempts``,
        ``tenant``. Every item is checked before anything is written (a bad one raises the
        error :meth:`enqueue` would, its message starting with ``item N``), and then all of
        them are written in one transaction, one statement per chunk of rows: all or nothing.

        A dedupe key whose job is active gives that job's id; two items with the same key give
        the same id (the first of them is the one enqueued, as two ``enqueue`` calls in a row
        would). ``connection``: as for :meth:`enqueue`, the caller's transaction.
        """
        if self.sharded:
            self._one_transaction(connection)
            return self._enqueue_in_shards(list(items))
        now = self.clock()
        values: list[dict[str, Any]] = []
        for index, item in enumerate(items):
            values.append(self._item_values(index, item, now))
        if not values:
            return []
        from ._observe import tracing as _tracing

        with (
            self._caller(connection) as caller,
            _tracing.enqueue_many_span(len(values)) as span,  # OpenTelemetry, if configured
        ):
            if span.fields:
                for one in values:
                    one.update(span.fields)
            if caller is not None:
                return _jobs.enqueue_many_on(self.store, caller.conn, values)

            def attempt() -> list[int]:
                with self.store.begin() as conn:
                    return _jobs.enqueue_many_on(self.store, conn, values)

            return retry("enqueue_many", attempt)

    def _item_values(self, index: int, item: Any, now: datetime) -> dict[str, Any]:
        """One item of :meth:`enqueue_many` as job values; errors name the item."""
        where = f"enqueue_many: item {index}"
        if not isinstance(item, Mapping):
            raise TypeError(f"{where}: expected a mapping, got {type(item).__name__}")
        if not ENQUEUE_KEYS.issuperset(item):
            unknown = sorted(str(key) for key in item if key not in ENQUEUE_KEYS)
            raise TypeError(
                f"{where}: unknown key(s) {', '.join(unknown)}; expected"
                f" {', '.join(sorted(ENQUEUE_KEYS))}"
            )
        if "handler" not in item:
            raise TypeError(f"{where}: 'handler' is required")
        try:
            return self._job_values(**item, now=now)
        except (ValueError, TypeError) as exc:  # PayloadError is a ValueError
            raise type(exc)(f"{where}: {exc}") from None

    def get_job(self, job_id: int) -> Job | None:
        """The job's view; a ready job a limit holds back says what it waits for
        (``waiting_for``)."""
        if self.sharded:
            first = self.shards[_shards.shard_of_id(job_id, len(self.shards))]
            for shard in self._from(first):  # where its id says first, one read each
                job = shard.get_job(job_id)
                if job is not None:
                    return job
            return None
        with self.store.read() as conn:
            job = _jobs.get_job(conn, job_id)
            return None if job is None else self.with_waiting(conn, [job])[0]

    def history(self, job_id: int) -> list[dict[str, Any]]:
        """Every finished attempt of a job, oldest first. Raises
        :class:`~scheduler.JobStateError` for a job that does not exist (or was purged)."""
        if self.sharded:
            return self._job_shard(job_id).history(job_id)
        with self.store.read() as conn:
            found = _jobs.history(conn, job_id)
            if not found and not _jobs.job_exists(conn, job_id):
                raise JobStateError(f"no job {job_id}")
            return found

    def retry_job(
        self,
        job_id: int,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: Any = None,
    ) -> Job:
        """Requeue an ``aborted`` job, attempts reset; a task's job becomes a fresh run of the
        task's current job. Raises :class:`~scheduler.JobStateError` in any other state."""
        if self.sharded:
            self._one_transaction(connection)
            return self._job_shard(job_id).retry_job(job_id, reason=reason, actor=actor)

        def change(conn: Any, now: datetime) -> Job:
            job = _jobs.requeue(
                conn,
                job_id,
                now=now,
                job_defaults=self._job_defaults,
                registered=self.registry.__contains__,
            )
            _wakeup.announce(self.store, conn, [(job.queue, job.run_at)])
            return job

        return self._audited_job("retry", job_id, reason, actor, change, connection)

    def cancel_job(
        self,
        job_id: int,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: Any = None,
    ) -> Job:
        """Abort a ``queued`` job with code ``cancelled``; for a ``claimed`` one, ask its
        worker to stop it (returned still ``claimed``: the worker ends it ``aborted`` with code
        ``cancelled``, within about 2 seconds, ``cancel_grace`` at most after it saw the
        request). Refused (:class:`~scheduler.JobStateError`) in any other state."""
        if self.sharded:
            self._one_transaction(connection)
            return self._job_shard(job_id).cancel_job(job_id, reason=reason, actor=actor)

        def change(conn: Any, now: datetime) -> Job:
            return _jobs.cancel(conn, job_id, now=now)

        return self._audited_job("cancel", job_id, reason, actor, change, connection)

    def _audited_job(
        self,
        action: str,
        job_id: int,
        reason: str | None,
        actor: str | None,
        change: Callable[[Any, datetime], Job],
        connection: Any = None,
    ) -> Job:
        """``change`` and its audit entry in one transaction (ours, or the caller's
        ``connection``). The target is the job's task (``audit NAME`` shows it), else
        ``job ID``; the detail names the job."""
        who, why = _audit.check(actor, reason)

        def write(conn: Any) -> Job:
            now = self.clock()
            job = change(conn, now)
            target = job.task_name if job.task_name is not None else f"job {job.id}"
            _audit.record(
                conn,
                now=now,
                actor=who,
                action=action,
                target=target,
                reason=why,
                detail=f"job {job.id}",
            )
            return job

        return self._write(f"{action}_job", write, connection)

    def pause_queue(
        self,
        queue: str,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: Any = None,
    ) -> bool:
        """Pause ``queue``: every worker stops claiming its jobs within a second (running jobs
        finish; the tick still dispatches into it) until :meth:`resume_queue`. Kept in the
        database; audited (target ``queue NAME``). False if it was paused already (nothing
        audited; a new ``reason`` replaces the old one)."""
        if self.sharded:  # every shard's workers claim from the queue: each shard says
            self._one_transaction(connection)
            return self._queue_change_in_shards("pause", queue, reason, actor)
        return self._queue_change("pause", queue, reason, actor, connection)

    def resume_queue(
        self,
        queue: str,
        *,
        reason: str | None = None,
        actor: str | None = None,
        connection: Any = None,
    ) -> bool:
        """Let workers claim from ``queue`` again (within a second); audited. False if it was
        not paused (nothing changed, nothing audited)."""
        if self.sharded:
            self._one_transaction(connection)
            return self._queue_change_in_shards("resume", queue, reason, actor)
        return self._queue_change("resume", queue, reason, actor, connection)

    def _queue_change(
        self,
        action: str,
        queue: str,
        reason: str | None,
        actor: str | None,
        connection: Any,
        audited: bool = True,
    ) -> bool:
        """Pause or resume ``queue``, audited when it changed (target ``queue NAME``) and
        ``audited``."""
        _check_queue(queue)
        who, why = _audit.check(actor, reason)

        def write(conn: Any) -> bool:
            now = self.clock()
            if action == "pause":
                changed = _queues.pause(conn, queue, now=now, actor=who, reason=why)
            else:
                changed = _queues.resume(conn, queue)
            if changed and audited:
                target = f"queue {queue}"
                _audit.record(conn, now=now, actor=who, action=action, target=target, reason=why)
            return changed

        return self._write(f"{action} {queue}", write, connection)

    def _queue_change_in_shards(
        self, action: str, queue: str, reason: str | None, actor: str | None
    ) -> bool:
        """Pause or resume ``queue`` in every shard (each shard's workers read their own),
        one transaction each; one audit entry, in the first shard where it changed."""
        changed = False
        for shard in self.shards:
            here = shard._queue_change(action, queue, reason, actor, None, audited=not changed)
            changed = changed or here
        return changed

    def paused_queues(self) -> list[PausedQueue]:
        """The paused queues, by name: each with ``paused_at``, ``paused_by`` and ``reason``."""
        if self.sharded:
            return self.shards[0].paused_queues()
        with self.store.read() as conn:
            return _queues.paused(conn)

    def jobs(
        self,
        *,
        state: str | None = None,
        task: str | None = None,
        handler: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = _jobs.LIST_LIMIT,
    ) -> list[Job]:
        """Jobs, newest first, ``limit`` of them (50 by default), filtered by each argument
        given. ``state`` must be one of queued, claimed, succeeded, aborted. A ``task`` that
        no row has and no kept job names raises :class:`~scheduler.UnknownRow`."""
        if self.sharded:
            if task is not None:
                chosen: tuple[Scheduler, ...] = (self._task_shard(task),)
            elif tenant is not None:
                chosen = (self.shard_for(tenant, ""),)
            else:
                chosen = self.shards
            found = [
                job
                for shard in chosen
                for job in shard.jobs(
                    state=state,
                    task=task,
                    handler=handler,
                    queue=queue,
                    tenant=tenant,
                    limit=limit,
                )
            ]
            found.sort(key=lambda job: (job.created_at, job.id), reverse=True)
            return found[:limit]
        if state is not None and state not in _rules.STATES:
            raise ValueError(f"state {state!r}: expected one of {', '.join(_rules.STATES)}")
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if tenant is not None and (problem := _rules.tenant_problem(tenant)) is not None:
            raise ValueError(f"tenant: {problem}")  # no job can have it: say so, not "no jobs"
        _rules.check_text(handler=handler, queue=queue)  # longer: no job can have it
        with self.store.read() as conn:
            found = _jobs.list_jobs(
                conn,
                state=state,
                task=task,
                handler=handler,
                queue=queue,
                tenant=tenant,
                limit=limit,
            )
            if not found and task is not None:
                _known_task(conn, task)
            return self.with_waiting(conn, found)

    def backfill(
        self,
        name: str,
        start: datetime,
        end: datetime,
        *,
        dry_run: bool = False,
        max_slots: int = BACKFILL_MAX,
        reason: str | None = None,
        actor: str | None = None,
    ) -> _backfill.BackfillResult:
        """One job per slot of task ``name`` in ``[start, end)`` that has none yet, each with
        its ``slot`` and a ``backfilled`` decision; the audit entry in the same transaction.

        A naive ``start`` or ``end`` is a wall-clock time in the task's zone. More slots than
        ``max_slots``, an empty or future range, or an unknown task are refused before anything
        is written; ``dry_run`` writes nothing. Running it twice enqueues nothing twice, also
        from two processes at once (docs/howto/operate.md).
        """
        if self.sharded:
            return self._task_shard(name).backfill(
                name, start, end, dry_run=dry_run, max_slots=max_slots, reason=reason, actor=actor
            )
        from ._ops import backfill as _backfill

        self.check_schema()
        who, why = _audit.check(actor, reason)

        def attempt() -> _backfill.BackfillResult:
            with self.store.begin() as conn:
                now = self.clock()
                result = _backfill.backfill(
                    conn,
                    name,
                    start,
                    end,
                    now=now,
                    max_slots=max_slots,
                    dry_run=dry_run,
                    job_defaults=self._job_defaults,
                )
                if not dry_run and result.enqueued:
                    queue = result.queue or "default"
                    _wakeup.announce(self.store, conn, [(queue, None)] * len(result.enqueued))
                    _audit.record(
                        conn,
                        now=now,
                        actor=who,
                        action="backfill",
                        target=name,
                        reason=why,
                        detail=_backfill_detail(result),
                    )
                return result

        for _ in range(_BACKFILL_ATTEMPTS):
            try:
                return retry(f"backfill {name}", attempt)
            except _backfill.VersionMoved:
                continue  # another writer changed the row: read the taken slots again
        raise SchedulerError(f"backfill {name!r}: the task kept changing meanwhile; try again")

    def audit(self, name: str | None = None, limit: int = _audit.DEFAULT_LIMIT) -> list[AuditEntry]:
        """The audit log, newest first: ``limit`` entries, of target ``name`` if given: a
        task's name, or ``job ID`` (the job's own entries, also those filed under its task).

        A ``name`` with no entries that names no task (no row, no kept job of it) raises
        :class:`~scheduler.UnknownRow`; a ``job ID`` of no job, :class:`~scheduler.JobStateError`.
        """
        if self.sharded:
            if name is not None:
                job_id = _job_target(name)
                holder = self._job_shard(job_id) if job_id is not None else self._task_shard(name)
                return holder.audit(name, limit)
            entries = [entry for shard in self.shards for entry in shard.audit(None, limit)]
            entries.sort(key=lambda entry: (entry.at, entry.id), reverse=True)
            return entries[:limit]
        with self.store.read() as conn:
            job_id = _job_target(name)
            job = _jobs.get_job(conn, job_id) if job_id is not None else None
            found = _audit.entries(
                conn, name, limit, job_task=job.task_name if job is not None else None
            )
            if found or name is None:
                return found
            if job_id is not None:
                if job is None:
                    raise JobStateError(f"no job {job_id}")
            else:
                _known_task(conn, name)
            return found

    def runner(self, settings: WorkerSettings | None = None) -> Runner:
        from ._worker.runner import Runner

        if self.sharded:
            raise SchedulerError(
                "a runner claims from one shard: use app.shards[K].runner() (the worker and"
                " app.work() serve every shard)"
            )
        w = settings or self.worker_settings
        return Runner(
            self.store,
            self.registry,
            owner=self.worker_id,
            clock=self.clock,
            lease=timedelta(seconds=w.lease_seconds),
            backoff_base=timedelta(seconds=self.settings.backoff_base_seconds),
            backoff_max=timedelta(seconds=self.settings.backoff_max_seconds),
            queues=w.queues,
            coroutine_runner=self._run_coroutine,
            recorded=self.recorded_hooks,
            error_messages=w.error_messages,
            limits=self.limit_set(),
            cancel_grace=w.cancel_grace,
        )

    def _run_coroutine(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on this Scheduler's own event loop, on a thread of its own (made at
        first use, kept until :meth:`close`, so clients an async handler keeps between runs
        stay on one loop): the worker's kind of loop, with its watchdog."""
        with self._events_lock:
            if self._events is None:
                from ._worker.events import EventLoop

                self._events = EventLoop()
            events = self._events
        return events.run(coro)

    def work(self, limit: int | None = None) -> int:
        """Run ready jobs in this thread until none is ready; returns how many were handled.

        ``async def`` handlers run on this Scheduler's own event loop. Called where an event
        loop is running (inside ``async def`` code) while async handlers are registered, it
        raises :class:`SchedulerError`: await :meth:`work_async` there instead.
        """
        if self.registry.async_names() and _loop_running():
            raise SchedulerError(
                "app.work() was called inside a running event loop and async handlers are"
                " registered: use `await app.work_async()` there (or call work() from a thread)"
            )
        self.check_schema()
        if self.sharded:  # each shard in turn, until none has a ready job
            handled = 0
            while limit is None or handled < limit:
                done = sum(
                    shard.work(None if limit is None else limit - handled) for shard in self.shards
                )
                if not done:
                    break
                handled += done
            return handled
        return self.runner().work(limit)

    async def work_async(self, limit: int | None = None) -> int:
        """:meth:`work` from ``async def`` code: async handlers run on the calling event loop
        (so they share its clients), sync ones and the database writes in threads."""
        import asyncio

        await asyncio.to_thread(self.check_schema)
        if self.sharded:
            handled = 0
            for shard in self.shards:
                handled += await shard.work_async(None if limit is None else limit - handled)
            return handled
        return await self.runner().work_async(limit)

    def background_worker(self, **worker_settings: Any) -> BackgroundWorker:
        """The worker on a thread of this process, for a web application: a context manager
        for ``with`` and ``async with`` (a FastAPI/Starlette lifespan), or ``.start()`` and
        ``.stop()``. Keyword arguments override ``[worker]`` settings (``concurrency``,
        ``queues``, ``shutdown_grace_seconds``, ...).

        It ticks and runs jobs as ``scheduler worker`` does, without installing signal
        handlers and without serving ``[metrics] port``; leaving the block stops it as SIGTERM
        stops the command (running jobs get ``shutdown_grace_seconds``). Every process of a
        server may run one (docs/howto/fastapi.md says what each costs).
        """
        from ._worker.background import BackgroundWorker
        from ._worker.background import worker_settings as chosen

        settings = chosen(self, worker_settings)
        if self._worker_id_pid is not None and self._worker_id_pid != os.getpid():
            # Built before a fork (gunicorn --preload): this process needs its own worker id
            # and its own connections (SQLAlchemy's recipe for a pool inherited over fork).
            self.worker_id = default_worker_id()
            self._worker_id_pid = os.getpid()
            self.store.engine.dispose(close=False)
        return BackgroundWorker(self, settings)

    def purge(self) -> int:
        """Delete old succeeded (and much older aborted) jobs and their history, the decision
        log as old as the older of the two, and audit entries older than
        ``purge_audit_after_days`` (0: none). Returns how many jobs. On PostgreSQL it then
        creates the history's day partitions ahead and drops those past retention."""
        if self.sharded:
            return sum(shard.purge() for shard in self.shards)
        w = self.worker_settings

        def attempt() -> int:
            with self.store.begin() as conn:
                now = self.clock()
                # The decision log is kept as long as the jobs it can name (the longer of the
                # two retentions).
                days = max(w.purge_succeeded_after_days, w.purge_aborted_after_days)
                _decisions.purge(conn, before=now - timedelta(days=days))
                if w.purge_audit_after_days > 0:  # 0: the audit log is kept for ever
                    _audit.purge(conn, before=now - timedelta(days=w.purge_audit_after_days))
                return _jobs.purge(
                    conn,
                    now=now,
                    succeeded_after=timedelta(days=w.purge_succeeded_after_days),
                    aborted_after=timedelta(days=w.purge_aborted_after_days),
                )

        purged = retry("purge", attempt)
        self._maintain_partitions()
        return purged

    def _maintain_partitions(self) -> None:
        """On PostgreSQL, the history's and the decision log's day partitions: create those
        ahead, drop those past retention (``_store/partitions.py``), in a transaction of its
        own. Nothing elsewhere."""
        if self.store.caps.dialect != "postgresql":
            return
        w = self.worker_settings
        now = self.clock()
        # The same instants as the DELETE purge's: the decisions' cut, and the jobs' shorter
        # retention for the runs (a run whose job is kept is moved, not dropped).
        days = max(w.purge_succeeded_after_days, w.purge_aborted_after_days)
        shortest = min(w.purge_succeeded_after_days, w.purge_aborted_after_days)
        done = _partitions.maintain(
            self.store,
            now=now,
            decisions_before=now - timedelta(days=days),
            runs_before=now - timedelta(days=shortest),
        )
        if done.created or done.dropped:
            log.info(
                "partitions: created %s, dropped %s (%s kept run(s) moved)",
                ", ".join(done.created) or "none",
                ", ".join(done.dropped) or "none",
                done.moved,
                extra={
                    "partitions_created": done.created,
                    "partitions_dropped": done.dropped,
                    "runs_moved": done.moved,
                },
            )
        if done.skipped:
            log.debug("partitions: skipped %s", ", ".join(done.skipped))

    def explain(self, name: str) -> dict[str, Any]:
        """Why the task ran or did not, and what comes next: the data of ``scheduler explain
        NAME --json`` (the state in one sentence, the policies, the next 10 fires, the last 20
        decisions, the last 10 runs). Raises :class:`~scheduler.UnknownRow` for an unknown name.
        """
        if self.sharded:
            return self._task_shard(name).explain(name)
        from ._ops import explain as _explain

        self.check_schema()
        return _explain.explain(
            self.store,
            name,
            self.clock(),
            self.settings.max_consecutive_failures,
            self.limit_set(check=False),
        )

    def status(self, *, rows: bool = True) -> dict[str, Any]:
        """Rows, job counts and health: the data of ``scheduler status --json``; without
        ``rows``, its ``rows`` list is empty (:meth:`status_rows` walks them). With shards,
        every shard's, merged (``health.shards``: each shard's own figures)."""
        self.check_schema()
        return _health.status(self._read_stores(), self.clock(), self.health_settings(), rows=rows)

    def status_summary(self, limit: int = 50) -> dict[str, Any] | None:
        """``status`` past 200 rows (None at 200 or fewer): the data of :meth:`status`
        without its ``rows``, plus ``rows_total``, ``rows_enabled``, ``rows_counted`` (per kind
        of row that needs attention: ``failing``, ``disabled_by_failures``, ``disabled``,
        ``overdue``, ``held_back``) and ``attention``: at most ``limit`` such rows, each
        ``{"name", "kind"}`` (``attention_more``: there are more). What ``scheduler status``
        prints at that size."""
        self.check_schema()
        return _health.summary(
            self._read_stores(), self.clock(), self.health_settings(), limit=limit
        )

    def status_rows(self) -> Iterator[dict[str, Any]]:
        """The ``rows`` of :meth:`status`, one at a time, read a page at a time: every row in
        flat memory (``scheduler status --json`` streams them)."""
        self.check_schema()
        return _health.status_rows(self._read_stores())

    def _read_stores(self) -> list[Store]:
        """The stores that hold the tables: each shard's (just this one's with one shard);
        the status reads merge theirs."""
        return [shard.store for shard in self.shards]

    def health_settings(self) -> _health.HealthSettings:
        """What ``status`` and the dashboard's health page need of this Scheduler's settings."""
        return _health.HealthSettings(
            max_consecutive_failures=self.settings.max_consecutive_failures,
            clock_mode=self.clock_mode,
            broker_url=self.broker_settings.url,
            wakeups=self.settings.wakeups,
        )

    def close(self) -> None:
        if self.sharded:
            for shard in self.shards:
                shard.close()
        with self._events_lock:
            if self._events is not None:
                self._events.close()
                self._events = None
        self._hub.close()
        self.store.dispose()


def _check_queue(queue: object) -> None:
    """``ValueError`` naming the queue when it cannot be one (before anything is written)."""
    if (problem := _rules.queue_problem(queue)) is not None:
        raise ValueError(f"queue {queue!r}: {problem}")


def _job_target(name: str | None) -> int | None:
    """N for an audit target ``job N``, else None."""
    if name is None or not name.startswith("job "):
        return None
    number = name.removeprefix("job ")
    return int(number) if number.isdigit() and number == str(int(number)) else None


def _known_task(conn: Any, name: str) -> None:
    """Raise :class:`UnknownRow` unless a row has ``name`` or a kept job names it (a task
    removed from the file stays a disabled row, so it is known)."""
    if _rows.get_row(conn, name) is None and not _jobs.task_has_jobs(conn, name):
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")


def _loop_running() -> bool:
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:  # not imported: no loop is running
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _shard_listen(database: DatabaseSettings, index: int) -> DatabaseSettings:
    """A shard's ``[database]`` settings: its ``listen_url`` (if any) on the shard's schema,
    so that its LISTEN connection hears the shard's channel."""
    if database.listen_url is None:
        return database
    listen = _shards.shard_url(database.listen_url, _shards.schema_name(index))
    return dataclasses.replace(database, listen_url=listen)
