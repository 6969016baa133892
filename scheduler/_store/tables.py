"""All tables, in one MetaData. The migrations must produce exactly this schema."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Double,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.ext.compiler import compiles

from .._model.rules import TEXT_LIMITS
from .._model.time import as_utc

metadata = MetaData()


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC (microseconds kept on every engine), returns aware UTC."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in ("mysql", "mariadb"):  # (importing it here keeps it unloaded elsewhere)
            from sqlalchemy.dialects.mysql import DATETIME

            return dialect.type_descriptor(DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return as_utc(value).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC)


# SQLite only auto-increments an INTEGER PRIMARY KEY; elsewhere ids are 64-bit.
Id = BigInteger().with_variant(Integer(), "sqlite")

# The two types below are spelled differently on MariaDB/MySQL: by a compilation rule for
# that dialect rather than `with_variant(mysql.X(), ...)`, which would import SQLAlchemy's
# MySQL dialect (~25 ms of every command's start-up on another engine), and as subclasses of
# the generic types rather than `TypeDecorator`s, which cost every statement that binds them.


class _UniqueKey(String):
    """A unique text key that compares exactly on every engine. MariaDB/MySQL's default
    collations ignore case and accents, which would make "Report" and "report" (or "café" and
    "cafe") one key: there it is binary-collated utf8mb4."""


class _Payload(Text):
    """A job's JSON payload. MariaDB/MySQL's TEXT holds 65,535 bytes, one short of the default
    64 KiB payload limit: there it is MEDIUMTEXT."""


@compiles(_UniqueKey, "mysql", "mariadb")
def _unique_key_on_mysql(kind: _UniqueKey, compiler: Any, **kw: Any) -> str:
    return f"VARCHAR({kind.length}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"


@compiles(_Payload, "mysql", "mariadb")
def _payload_on_mysql(kind: _Payload, compiler: Any, **kw: Any) -> str:
    return "MEDIUMTEXT"


UniqueKey = _UniqueKey(TEXT_LIMITS["dedupe_key"])
Payload = _Payload()

# A partial index's condition, on the engines that have partial indexes (SQLite, PostgreSQL;
# MariaDB indexes every row). The migrations write it (`sqlite_where=`, `postgresql_where=`);
# here it is declared in `Index.info` rather than by those arguments, because SQLAlchemy
# imports a dialect's whole package to check an argument named after it: PostgreSQL's, ~20 ms
# of every command on SQLite. tests/store/test_migrations.py checks that each engine's migrated
# indexes have exactly these conditions (alembic's comparison does not look at them).
PARTIAL_WHERE = "where"


def _where(column: str) -> dict[str, Any]:
    return {"info": {PARTIAL_WHERE: f"{column} IS NOT NULL"}}


jobs = Table(
    "scheduler_jobs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("handler", String(TEXT_LIMITS["handler"]), nullable=False),
    Column("payload", Payload, nullable=False),
    Column("queue", String(TEXT_LIMITS["queue"]), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("run_at", UTCDateTime, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("lease_owner", String(200)),
    Column("lease_expires_at", UTCDateTime),
    Column("started_at", UTCDateTime),
    Column("last_error_code", String(200)),
    # Set only while the job is active (queued or claimed), so the unique index below is "at
    # most one active job per key" on every engine.
    Column("dedupe_key", UniqueKey),
    Column("task_name", String(200)),
    Column("created_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
    # The W3C traceparent of the span that enqueued the job (revision 0004), when traced.
    Column("traceparent", String(64)),
    # The nominal cron instant (before jitter) a dispatched job stands for (revision 0005).
    Column("slot", UTCDateTime),
    Column("tenant", String(63)),
    # An operator asked to cancel the claimed job at this time (revision 0011): its worker
    # stops the attempt (a request older than the attempt's started_at is a past run's).
    Column("cancel_requested_at", UTCDateTime),
    # The attempt's fence (revision 0013): every claim, takeover and rerun in place bumps it,
    # so it only grows for the job; an attempt whose fence is no longer the job's is over.
    Column("fence", Integer, nullable=False, server_default="0"),
    # The claim's scan: lower priority values first (as in Oban), then oldest run_at.
    Index("ix_scheduler_jobs_ready", "state", "queue", "priority", "run_at", "id"),
    # Only jobs with a lease (claimed) or an end (finished) are in these two (revision 0002), so
    # an enqueue or a dispatch writes no entry in them. MariaDB has no partial indexes.
    Index("ix_scheduler_jobs_lease", "state", "lease_expires_at", **_where("lease_expires_at")),
    Index("ix_scheduler_jobs_finished", "state", "finished_at", **_where("finished_at")),
    # Only jobs with a key are in it (revision 0003): most jobs have none, a dispatch never.
    Index("ux_scheduler_jobs_dedupe", "dedupe_key", unique=True, **_where("dedupe_key")),
    # A task's jobs, newest first (revision 0005): explain, `jobs --task`, the dashboard.
    Index("ix_scheduler_jobs_task", "task_name", "id"),
)

runs = Table(
    "scheduler_runs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("started_at", UTCDateTime),
    Column("finished_at", UTCDateTime, nullable=False),
    Column("outcome", String(32), nullable=False),
    Column("error_code", String(200)),
    Column("worker", String(200)),
    Column("slot", UTCDateTime),
    # The exception's first line, redacted (revision 0009): [worker] error_messages.
    Column("error_message", String(300)),
    Index("ix_scheduler_runs_job", "job_id"),
    # The run history by time (revision 0009): the dashboard's chart of runs over time.
    Index("ix_scheduler_runs_finished", "finished_at", "outcome"),
)
"""Each attempt's outcome. On PostgreSQL partitioned by day on ``finished_at`` (revision 0015,
``_store/partitions.py``), its primary key ``(id, finished_at)`` there."""

rows = Table(
    "scheduler_rows",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", UniqueKey, nullable=False, unique=True),
    Column("handler", String(200), nullable=False),
    Column("payload", Payload, nullable=False),
    Column("cron", String(200), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("concurrent", Boolean, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("next_run_at", UTCDateTime),
    Column("last_job_id", Id),
    Column("consecutive_failures", Integer, nullable=False),
    Column("max_consecutive_failures", Integer),
    Column("disabled_reason", String(64)),
    Column("disabled_at", UTCDateTime),
    # Outbox: set with a disable in the same transaction, cleared once the receivers ran.
    Column("alert_id", String(64)),
    # The compare-and-swap token: every write to a row bumps it.
    Column("version", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # Run policies (revision 0005): overlap is hold, skip, allow or replace (``concurrent`` is
    # kept in step: true exactly when overlap is allow); catchup_window and jitter in seconds,
    # 0 = off.
    Column("overlap", String(8), nullable=False, server_default="hold"),
    Column("catchup_window", Integer, nullable=False, server_default="0"),
    Column("jitter", Integer, nullable=False, server_default="0"),
    # The slot whose held_back decision is logged: a held-back row writes once per slot.
    Column("held_slot", UTCDateTime),
    # The operator's words with a disable (``disable --reason``).
    Column("disabled_note", String(500)),
    Column("tenant", String(63)),
    # Who owns the row (revision 0008): "file" (sync) or "api" (put_task); an api row's group.
    Column("source", String(8), nullable=False, server_default="file"),
    Column("task_group", UniqueKey),
    # Recovery (revision 0013): "manual" or "probe"; the probe intervals (JSON, NULL: the
    # defaults); while a row disabled by the failure limit probes, when its next probe runs and
    # how many ran; the row_recovered alert's outbox (JSON), cleared once the receivers ran.
    Column("recovery", String(8), nullable=False, server_default="manual"),
    Column("probe_intervals", String(200)),
    Column("probe_at", UTCDateTime),
    Column("probes", Integer, nullable=False, server_default="0"),
    Column("recovery_alert", String(500)),
    # Seconds one attempt of the task's jobs may run, over its handler's (revision 0012):
    # NULL: the handler's; 0: no limit.
    Column("timeout", Double),
    # The due query's order, id included (revision 0007): a burst's rows share one
    # next_run_at, and its keyset pagination goes on from (next_run_at, id).
    Index("ix_scheduler_rows_due", "enabled", "next_run_at", "id"),
    # A sync reads the file's rows alone; rows(group=/tenant=) page by name (revision 0008).
    Index("ix_scheduler_rows_source", "source", "name"),
    Index("ix_scheduler_rows_group", "task_group", "name"),
    Index("ix_scheduler_rows_tenant", "tenant", "name"),
    # The probing rows, found by the tick (revision 0013).
    Index("ix_scheduler_rows_probe", "probe_at"),
)

decisions = Table(
    "scheduler_decisions",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("task_name", UniqueKey, nullable=False),
    Column("slot", UTCDateTime),
    Column("decided_at", UTCDateTime, nullable=False),
    Column("decision", String(32), nullable=False),
    Column("job_id", Id),
    Column("reason", String(200)),
    Column("detail", String(500)),
    Index("ix_scheduler_decisions_task", "task_name", "id"),
)
"""A row's decisions, one entry per slot and outcome (revision 0005; 0006 dropped its index on
``decided_at``: the purge goes by id, ``_store/decisions.py``). On PostgreSQL partitioned by day
on ``decided_at`` (revision 0015, ``_store/partitions.py``), its primary key ``(id,
decided_at)`` there."""

audit = Table(
    "scheduler_audit",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", String(200), nullable=False),
    Column("action", String(32), nullable=False),
    Column("target", UniqueKey),
    Column("reason", String(1000)),
    Column("detail", String(1000)),
    Index("ix_scheduler_audit_target", "target", "id"),
    Index("ix_scheduler_audit_at", "at"),
)
"""Who did what to which row or job, when and why (revision 0005)."""

workers = Table(
    "scheduler_workers",
    metadata,
    Column("id", String(200), primary_key=True),
    Column("hostname", String(200), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("last_seen_at", UTCDateTime, nullable=False),
    Column("last_tick_at", UTCDateTime),
    # Seconds the host's clock is ahead of the database's (negative: behind), when measured.
    Column("clock_offset", Float),
    # The handler names this worker registered, a JSON list (revision 0010); None: unknown.
    Column("handlers", Text),
    # Attempts fenced after their timeout whose handler has not returned (revision 0011).
    Column("stuck_attempts", Integer),
)

QueueName = _UniqueKey(TEXT_LIMITS["queue"])

paused_queues = Table(
    "scheduler_paused_queues",
    metadata,
    Column("queue", QueueName, primary_key=True),
    Column("paused_at", UTCDateTime, nullable=False),
    Column("paused_by", String(200), nullable=False),
    Column("reason", String(500)),
)
"""The queues no worker claims from until resumed, one row each (revision 0012)."""

HandlerName = _UniqueKey(TEXT_LIMITS["handler"])

handlers = Table(
    "scheduler_handlers",
    metadata,
    Column("name", HandlerName, primary_key=True),
    Column("queue", String(TEXT_LIMITS["queue"]), nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("retry_safe", Boolean, nullable=False),
    Column("registered_at", UTCDateTime, nullable=False),
    Column("registered_by", String(200), nullable=False),
)
"""Each handler a worker registered, with its settings, so that any process can enqueue it
(revision 0010)."""

limits = Table(
    "scheduler_limits",
    metadata,
    Column("name", String(200), primary_key=True),
    # Every limited claim bumps it first: the row lock that makes the limit's claims take
    # turns, so that each counts what the one before it claimed (revision 0014).
    Column("version", Integer, nullable=False),
    # fair = true: the partition the last claim served; the next goes on after it.
    Column("cursor", String(200)),
)
"""One row per limit shared by the workers (``[[limits]]``): its lock and its rotation."""

limit_holds = Table(
    "scheduler_limit_holds",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("limit_name", String(200), nullable=False),
    Column("part", String(200), nullable=False),
    Column("job_id", Id, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    # Starts in a window: a rate's count; the running ones: joined to their claimed job.
    Index("ix_scheduler_limit_holds_started", "limit_name", "part", "started_at"),
    Index("ix_scheduler_limit_holds_job", "limit_name", "job_id"),
)
"""One row per attempt a limit let start (revision 0014): it counts towards ``concurrency``
while its job is ``claimed`` and towards ``rate`` while it is in the window; kept no longer
than both need."""
