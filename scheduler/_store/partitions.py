"""History that drops instead of deleting (PostgreSQL): the run history and the decision log in
daily range partitions, created ahead and dropped once past retention.

Revision 0015 makes ``scheduler_runs`` (by ``finished_at``) and ``scheduler_decisions`` (by
``decided_at``) partitioned tables on PostgreSQL: one partition per UTC day, named
``<table>_pYYYYMMDD``, and a default partition, ``<table>_default``, that takes any row no day
partition covers, so an insert never fails for want of one. SQLite and MariaDB keep their plain
tables and the purge by ``DELETE``. The primary keys include the partition column
(``(id, finished_at)``, ``(id, decided_at)``), as PostgreSQL requires of a partitioned table's
unique keys; ids still come from one sequence, so ``id`` alone stays unique. No foreign key
names either table.

The worker's housekeeping (``Scheduler.purge``) calls :func:`maintain` once a minute, in a
transaction of its own after the ``DELETE`` purge:

- it creates today's partition and the :data:`DAYS_AHEAD` next days' (``IF NOT EXISTS``), under
  a transaction-level advisory lock that it only tries (``pg_try_advisory_xact_lock``): of the
  workers of many hosts, one does it and the others go on at once; a transaction lock, so
  PgBouncer's transaction pooling cannot strand it on a server connection;
- it drops a decisions partition once its whole day is older than the decision log's retention
  (the same instant the ``DELETE`` purge uses): every entry in it would have been deleted;
- it drops a runs partition once its whole day is older than the shorter of the jobs'
  retentions, after moving the runs whose job still exists (a task's last job, an aborted job
  inside its 30 days) into the default partition, where the ``DELETE`` purge removes them with
  their job, as before. A run is deleted exactly when its job is: the ``DELETE`` purge of the
  jobs deletes only the default partition's runs, and a day partition's runs of deleted jobs
  go with their partition, at most a day after their job.

Each ``CREATE`` and ``DROP`` runs in a savepoint under a short lock wait
(:data:`DDL_LOCK_TIMEOUT`): both take an ``ACCESS EXCLUSIVE`` lock on the parent table, and a
queued request for it holds back every writer behind it. When the lock is not had in time the
step is skipped and the next minute's housekeeping tries again. A day partition is never
created over rows the default partition already holds for that day (the server refuses, and
those rows stay where the ``DELETE`` purge finds them).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta

from sqlalchemy import Connection, Index, Table, column, table, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import TableClause

from .tables import decisions, jobs, runs

_logger = logging.getLogger(__name__)

PARTITIONED: dict[str, str] = {runs.name: "finished_at", decisions.name: "decided_at"}
"""The partitioned tables and their partition column."""

DAYS_AHEAD = 3
"""Days after today whose partitions exist: a worker stopped for that long finds them ready."""

DDL_LOCK_TIMEOUT = "200ms"
"""How long a partition's ``CREATE`` or ``DROP`` waits for its lock before it is skipped."""

_DAY = re.compile(r"_p(\d{8})$")
PG_CHECK_VIOLATION = "23514"  # a new partition over rows of the default partition
_LOCK = text(
    "SELECT pg_try_advisory_xact_lock(hashtext('scheduler_partitions'), hashtext(current_schema()))"
)
_CHILDREN = text(
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = to_regclass(:parent)"
)
_KIND = text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:name)")


@dataclass
class Maintenance:
    """What one :func:`maintain` did."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    moved: int = 0
    """Runs of a dropped partition whose job still exists, moved to the default partition."""
    skipped: list[str] = field(default_factory=list)
    """Partitions whose lock was not had in time (or another process held the maintenance)."""


def partitioned(conn: Connection, name: str = runs.name) -> bool:
    """Whether `name` is a partitioned table (PostgreSQL after revision 0015)."""
    if conn.dialect.name != "postgresql":
        return False
    return conn.execute(_KIND, {"name": name}).scalar() == "p"


def day_name(name: str, day: date) -> str:
    return f"{name}_p{day:%Y%m%d}"


def default_name(name: str) -> str:
    return f"{name}_default"


def default_partition(conn: Connection, parent: Table) -> TableClause | Table:
    """The table a ``DELETE`` purge of `parent` deletes from: its default partition when it is
    partitioned, else itself."""
    if not partitioned(conn, parent.name):
        return parent
    return table(default_name(parent.name), *(column(c.name, c.type) for c in parent.columns))


def days(conn: Connection, name: str) -> dict[date, str]:
    """The day partitions of `name`: day -> partition."""
    found: dict[date, str] = {}
    for child in conn.execute(_CHILDREN, {"parent": name}).scalars():
        if match := _DAY.search(child):
            found[datetime.strptime(match[1], "%Y%m%d").date()] = child
    return found


def _bound(day: date) -> str:
    return datetime.combine(day, time()).isoformat(sep=" ")


def create_sql(name: str, day: date) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {day_name(name, day)} PARTITION OF {name}"
        f" FOR VALUES FROM ('{_bound(day)}') TO ('{_bound(day + timedelta(days=1))}')"
    )


def _sqlstate(exc: DBAPIError) -> str | None:
    state = getattr(exc.orig, "sqlstate", None)
    return state if isinstance(state, str) else None


PG_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout
PG_UNIQUE_VIOLATION = "23505"  # two creators at once: the other's catalog row came first
PG_DUPLICATE_TABLE = "42P07"


def _step(conn: Connection, statements: Iterable[str], tolerated: Iterable[str] = ()) -> str | None:
    """Run `statements` in a savepoint; None when done, else the SQLSTATE of why not (the
    savepoint is rolled back): a lock not had in time, or one of `tolerated`."""
    try:
        with conn.begin_nested():
            for statement in statements:
                conn.execute(text(statement))
    except DBAPIError as exc:
        state = _sqlstate(exc)
        if state is None or state not in (PG_LOCK_NOT_AVAILABLE, *tolerated):
            raise
        return state
    return None


def create_ahead(conn: Connection, today: date, out: Maintenance | None = None) -> Maintenance:
    """Create today's partitions and the next :data:`DAYS_AHEAD` days' that are missing.

    Safe beside another creator even without :func:`maintain`'s advisory lock: ``IF NOT
    EXISTS``, and the duplicate a creator that checked at the same instant runs into is taken
    for "it exists". A day whose rows the default partition already holds is skipped."""
    out = out or Maintenance()
    tolerated = (PG_CHECK_VIOLATION, PG_UNIQUE_VIOLATION, PG_DUPLICATE_TABLE)
    for name in PARTITIONED:
        have = days(conn, name)
        for n in range(DAYS_AHEAD + 1):
            day = today + timedelta(days=n)
            if day in have:
                continue
            state = _step(conn, [create_sql(name, day)], tolerated)
            if state is None:
                out.created.append(day_name(name, day))
            elif state in (PG_CHECK_VIOLATION, PG_LOCK_NOT_AVAILABLE):
                out.skipped.append(day_name(name, day))
    return out


def _old(conn: Connection, name: str, before: datetime) -> list[tuple[date, str]]:
    """The day partitions of `name` whose whole day is before `before`, oldest first."""
    whole = before.replace(tzinfo=None)
    return sorted(
        (day, child)
        for day, child in days(conn, name).items()
        if datetime.combine(day + timedelta(days=1), time()) <= whole
    )


def drop_decisions(conn: Connection, before: datetime, out: Maintenance) -> None:
    """Drop the decision log's partitions whose whole day is before `before`."""
    for _, child in _old(conn, decisions.name, before):
        if _step(conn, [f"DROP TABLE IF EXISTS {child}"]) is None:
            out.dropped.append(child)
        else:
            out.skipped.append(child)


_KEPT = "scheduler_kept_runs"


def drop_runs(conn: Connection, before: datetime, out: Maintenance) -> None:
    """Drop the run history's partitions whose whole day is before `before`, the runs whose
    job still exists moved to the default partition first.

    The runs to keep are read before the ``DROP`` takes its lock (a temporary table, dropped
    at commit): the partition is in the past, and a ``SHARE`` lock on it (which no writer of
    today's runs needs) keeps it as read. The parent's ``ACCESS EXCLUSIVE`` lock is then held
    for the ``DROP`` and the insert of those few rows only."""
    names = ", ".join(c.name for c in runs.columns)
    for _, child in _old(conn, runs.name, before):
        span = conn.execute(text(f"SELECT min(job_id), max(job_id) FROM {child}")).one()
        statements = [f"LOCK TABLE {child} IN SHARE MODE"]
        moving = span[0] is not None
        if moving:
            statements += [
                f"CREATE TEMPORARY TABLE IF NOT EXISTS {_KEPT} (LIKE {runs.name}) ON COMMIT DROP",
                f"TRUNCATE {_KEPT}",
                f"INSERT INTO {_KEPT} SELECT {names} FROM {child} WHERE job_id IN"
                f" (SELECT id FROM {jobs.name} WHERE id BETWEEN {int(span[0])}"
                f" AND {int(span[1])})",
            ]
        statements.append(f"DROP TABLE {child}")
        if moving:
            statements.append(f"INSERT INTO {runs.name} ({names}) SELECT {names} FROM {_KEPT}")
        if _step(conn, statements) is None:
            out.dropped.append(child)
            if moving:
                out.moved += int(conn.execute(text(f"SELECT count(*) FROM {_KEPT}")).scalar_one())
        else:
            out.skipped.append(child)


def maintain(
    conn: Connection, *, now: datetime, decisions_before: datetime, runs_before: datetime
) -> Maintenance:
    """Create the partitions ahead and drop those past retention, in `conn`'s transaction;
    nothing (an empty report) where the tables are not partitioned, or while another process
    does it."""
    out = Maintenance()
    if not partitioned(conn):
        return out
    if not conn.execute(_LOCK).scalar():
        out.skipped.append("(another process maintains the partitions)")
        return out
    conn.execute(text(f"SELECT set_config('lock_timeout', '{DDL_LOCK_TIMEOUT}', true)"))
    create_ahead(conn, now.date(), out)
    drop_decisions(conn, decisions_before, out)
    drop_runs(conn, runs_before, out)
    return out


# -- the conversion (revision 0015) and back ---------------------------------------------------


def _index_sql(index: Index, on: str) -> str:
    names = ", ".join(str(getattr(c, "name", c)) for c in index.expressions)
    unique = "UNIQUE " if index.unique else ""
    return f"CREATE {unique}INDEX {index.name} ON {on} ({names})"


def _sequence(conn: Connection, name: str) -> str:
    found = conn.execute(text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": name}).scalar()
    if not isinstance(found, str):
        raise RuntimeError(f"{name}.id has no sequence")
    return found


def _rename_away(conn: Connection, parent: Table, old: str) -> None:
    """Rename `parent` to `old`, its primary key and indexes with it (their names are free)."""
    conn.execute(text(f"ALTER TABLE {parent.name} RENAME TO {old}"))
    conn.execute(text(f"ALTER INDEX {parent.name}_pkey RENAME TO {old}_pkey"))
    for index in parent.indexes:
        conn.execute(text(f"ALTER INDEX {index.name} RENAME TO {old}_{index.name}"))


def _keys_and_indexes(conn: Connection, parent: Table, key: str | None) -> None:
    primary = f"id, {key}" if key else "id"
    name = parent.name
    conn.execute(text(f"ALTER TABLE {name} ADD CONSTRAINT {name}_pkey PRIMARY KEY ({primary})"))
    for index in parent.indexes:
        conn.execute(text(_index_sql(index, name)))


def convert(conn: Connection, parent: Table, today: date) -> None:
    """Make `parent` a partitioned table with its rows: day partitions for every day it has
    rows of and for today and the :data:`DAYS_AHEAD` next days, a default partition; the same
    id sequence, columns, indexes and defaults. The rows are copied before the keys and indexes
    are built (one build per partition, not one insert into each index per row)."""
    name, key = parent.name, PARTITIONED[parent.name]
    old = f"{name}_unpartitioned"
    sequence = _sequence(conn, name)
    _rename_away(conn, parent, old)
    conn.execute(
        text(f"CREATE TABLE {name} (LIKE {old} INCLUDING DEFAULTS) PARTITION BY RANGE ({key})")
    )
    conn.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY {name}.id"))
    conn.execute(text(f"CREATE TABLE {default_name(name)} PARTITION OF {name} DEFAULT"))
    had = conn.execute(text(f"SELECT DISTINCT CAST({key} AS date) FROM {old}")).scalars()
    wanted = set(had) | {today + timedelta(days=n) for n in range(DAYS_AHEAD + 1)}
    for day in sorted(wanted):
        conn.execute(text(create_sql(name, day)))
    columns = ", ".join(c.name for c in parent.columns)
    conn.execute(text(f"INSERT INTO {name} ({columns}) SELECT {columns} FROM {old}"))
    conn.execute(text(f"DROP TABLE {old}"))
    _keys_and_indexes(conn, parent, key)


def unconvert(conn: Connection, parent: Table) -> None:
    """Back to one plain table with every row (the downgrade of revision 0015)."""
    name = parent.name
    old = f"{name}_partitioned"
    sequence = _sequence(conn, name)
    _rename_away(conn, parent, old)
    conn.execute(text(f"CREATE TABLE {name} (LIKE {old} INCLUDING DEFAULTS)"))
    conn.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY {name}.id"))
    columns = ", ".join(c.name for c in parent.columns)
    conn.execute(text(f"INSERT INTO {name} ({columns}) SELECT {columns} FROM {old}"))
    conn.execute(text(f"DROP TABLE {old}"))  # and its partitions
    _keys_and_indexes(conn, parent, None)
