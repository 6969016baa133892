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

The worker's housekeeping (``Scheduler.purge``) calls :func:`maintain` once a minute, after
the ``DELETE`` purge:

- it creates today's partition and the :data:`DAYS_AHEAD` next days' that are missing;
- it drops a decisions partition once its whole day is older than the decision log's retention
  (the same instant the ``DELETE`` purge uses): every entry in it would have been deleted;
- it drops a runs partition once its whole day is older than the shorter of the jobs'
  retentions, after moving the runs whose job still exists (a task's last job, an aborted job
  inside its 30 days) into the default partition, where the ``DELETE`` purge removes them with
  their job, as before. So a run is kept as long as its job, as before: the ``DELETE`` purge of
  the jobs deletes the default partition's runs, and a day partition's runs of deleted jobs go
  with their partition, within a day of their job.

Each ``CREATE`` and each ``DROP`` is a short transaction of its own: both take an ``ACCESS
EXCLUSIVE`` lock on the parent table, held until commit, and a request for it queued behind a
writer holds back every writer behind it. So each waits for its lock at most
:data:`DDL_LOCK_TIMEOUT` (``lock_timeout``, set for the transaction); when it is not had in time
the step is skipped and the next minute's housekeeping tries again. Each also takes a
transaction-level advisory lock first (``pg_advisory_xact_lock``, its wait bounded the same
way): of the workers of many hosts, one does a step at a time, and the others, once they have
the lock, look the partition up again and find it done; a transaction lock, so PgBouncer's
transaction pooling cannot strand it on a server connection. A creation
that races one outside that lock (:func:`create_ahead`: ``IF NOT EXISTS``, and the duplicate
the other's catalog row raises) takes the duplicate for done. A day partition is never created
over rows the default partition already holds for that day (the server refuses; those rows
stay where the ``DELETE`` purge finds them).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta

from sqlalchemy import Connection, Index, Table, column, table, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import TableClause

from .._model.time import as_utc
from .engine import CITUS_INSTALLED, Store
from .tables import decisions, jobs, runs

PARTITIONED: dict[str, str] = {runs.name: "finished_at", decisions.name: "decided_at"}
"""The partitioned tables and their partition column."""

DAYS_AHEAD = 3
"""Days after today whose partitions exist: a worker stopped for that long finds them ready."""

DDL_LOCK_TIMEOUT = "200ms"
"""How long a partition's ``CREATE`` or ``DROP`` waits for its lock before it is skipped."""

_DAY = re.compile(r"_p(\d{8})$")
PG_CHECK_VIOLATION = "23514"  # a new partition over rows of the default partition
_LOCK = text(
    "SELECT pg_advisory_xact_lock(hashtext('scheduler_partitions'), hashtext(current_schema()))"
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


def can_partition(conn: Connection) -> bool:
    """Whether the history goes into day partitions here: PostgreSQL, not Citus (a distributed
    schema's sequences cannot change owner, which the conversion needs; there the history
    keeps its ``DELETE`` purge, spread over the nodes with the shards)."""
    if conn.dialect.name != "postgresql":
        return False
    return not conn.execute(text(CITUS_INSTALLED)).scalar()


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


def _old(conn: Connection, name: str, before: datetime) -> list[str]:
    """The day partitions of `name` whose whole day is before `before`, oldest first."""
    whole = as_utc(before).replace(tzinfo=None)
    return [
        child
        for day, child in sorted(days(conn, name).items())
        if datetime.combine(day + timedelta(days=1), time()) <= whole
    ]


_KEPT = "scheduler_kept_runs"


def _drop_decisions(conn: Connection, child: str, out: Maintenance) -> None:
    conn.execute(text(f"DROP TABLE {child}"))
    out.dropped.append(child)


def _drop_runs(conn: Connection, child: str, out: Maintenance) -> None:
    """Drop a run history's partition, the runs whose job still exists moved to the default
    partition first.

    The runs to keep are read before the ``DROP`` asks for the parent's lock (into a temporary
    table, dropped at commit), under a ``SHARE`` lock on the partition alone (no writer of
    today's runs needs it; the day is past). The parent's ``ACCESS EXCLUSIVE`` lock is then held
    for the ``DROP`` and the insert of those rows (the few kept) only."""
    names = ", ".join(c.name for c in runs.columns)
    conn.execute(text(f"LOCK TABLE {child} IN SHARE MODE"))
    low, high = conn.execute(text(f"SELECT min(job_id), max(job_id) FROM {child}")).one()
    moved = 0
    if low is not None:
        conn.execute(text(f"CREATE TEMPORARY TABLE {_KEPT} (LIKE {runs.name}) ON COMMIT DROP"))
        moved = conn.execute(
            text(
                f"INSERT INTO {_KEPT} SELECT {names} FROM {child} WHERE job_id IN"
                f" (SELECT id FROM {jobs.name} WHERE id BETWEEN {int(low)} AND {int(high)})"
            )
        ).rowcount
    conn.execute(text(f"DROP TABLE {child}"))
    if moved:
        conn.execute(text(f"INSERT INTO {runs.name} ({names}) SELECT {names} FROM {_KEPT}"))
    out.dropped.append(child)
    out.moved += max(moved, 0)


def _alone(
    store: Store,
    work: Callable[[Connection], None],
    name: str,
    out: Maintenance,
    *,
    creating: bool = False,
    lock: bool = True,
) -> None:
    """`work` on the partition `name` in a transaction of its own, under the maintenance's
    advisory lock and the short lock wait (which bounds the wait for that lock too: skipped
    when not had in time). Once the lock is had, `name` is looked up again: a partition
    another process created (or dropped) meanwhile is left alone."""
    try:
        with store.begin() as conn:
            conn.execute(_LOCK_WAIT)
            if lock:
                conn.execute(_LOCK)
            parent = name.rsplit("_p", 1)[0]
            exists = conn.execute(_CHILD, {"parent": parent, "name": name}).first() is not None
            if exists == creating:
                return
            work(conn)
    except DBAPIError as exc:
        state = _sqlstate(exc)
        if creating and state in (PG_UNIQUE_VIOLATION, PG_DUPLICATE_TABLE):
            return  # another creator's, at the same instant: it exists
        if state not in (PG_LOCK_NOT_AVAILABLE, PG_CHECK_VIOLATION):
            raise
        out.skipped.append(name)


_LOCK_WAIT = text(f"SELECT set_config('lock_timeout', '{DDL_LOCK_TIMEOUT}', true)")
_CHILD = text(
    "SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = to_regclass(:parent) AND c.relname = :name"
)


def _create(name: str, day: date, out: Maintenance) -> Callable[[Connection], None]:
    def work(conn: Connection) -> None:
        conn.execute(text(create_sql(name, day)))
        out.created.append(day_name(name, day))

    return work


def create_ahead(
    store: Store, today: date, out: Maintenance | None = None, *, lock: bool = True
) -> Maintenance:
    """Create today's partitions and the next :data:`DAYS_AHEAD` days' that are missing, each
    in its own transaction. ``lock=False`` leaves out the advisory lock (the tests race
    creators that way: the duplicate path alone)."""
    out = out or Maintenance()
    with store.begin() as conn:
        have = {name: days(conn, name) for name in PARTITIONED}
    for name in PARTITIONED:
        for n in range(DAYS_AHEAD + 1):
            day = today + timedelta(days=n)
            if day not in have[name]:
                work = _create(name, day, out)
                _alone(store, work, day_name(name, day), out, creating=True, lock=lock)
    return out


def maintain(
    store: Store, *, now: datetime, decisions_before: datetime, runs_before: datetime
) -> Maintenance:
    """Create the partitions ahead and drop those past retention, each ``CREATE`` and each
    ``DROP`` in a short transaction of its own (the lock it takes on the parent table is held
    until its commit, and no longer); nothing where the tables are not partitioned."""
    out = Maintenance()
    with store.begin() as conn:
        if not partitioned(conn):
            return out
        old_decisions = _old(conn, decisions.name, decisions_before)
        old_runs = _old(conn, runs.name, runs_before)
    create_ahead(store, as_utc(now).date(), out)
    for child in old_decisions:
        _alone(store, functools.partial(_drop_decisions, child=child, out=out), child, out)
    for child in old_runs:
        _alone(store, functools.partial(_drop_runs, child=child, out=out), child, out)
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
