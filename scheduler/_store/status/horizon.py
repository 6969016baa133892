"""Who holds the MVCC horizon, and how many dead row versions wait for vacuum (PostgreSQL).

Every claim and every outcome leaves a dead version of a job row behind; vacuum removes it
once no transaction that could still see it is running. A transaction left open elsewhere on
the same database (a report, a ``pg_dump``, a session idle in a transaction, a prepared
transaction nobody committed) pins that horizon, and the dead versions pile up for as long as
it stays open. :func:`holders` names those transactions, oldest first; :func:`dead_tuples`
counts the dead versions per scheduler table. ``status`` warns about a holder older than
``Thresholds.horizon`` (health.py), and the metrics export both (metrics.py).

What the primary cannot time is left out: a standby's query kept alive by
``hot_standby_feedback`` (the walsender's ``backend_xmin``) and a replication slot's ``xmin``
carry no start time here; run ``status`` on the standby for its own sessions, and see
``pg_replication_slots`` for the slots. Another role's sessions are seen in full only with
``pg_read_all_stats`` (or as a superuser).

Other engines have no such horizon to watch: every function returns nothing there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, column, func, literal, or_, select, table, text

from ..tables import decisions, jobs, rows, runs

#: The tables whose dead row versions are counted (``scheduler_table_dead_tuples{table}``).
TABLES = tuple(t.name for t in (jobs, runs, rows, decisions))


@dataclass(frozen=True)
class Holder:
    """One transaction that holds the MVCC horizon of this database."""

    pid: int | None
    """The backend's process id (None for a prepared transaction: no backend holds it)."""
    application_name: str
    """What the session said it is (``application_name``); a prepared transaction's gid."""
    state: str
    """``active``, ``idle in transaction``... or ``prepared`` for a prepared transaction."""
    age: float
    """Seconds since the transaction began (a prepared one: since it was prepared)."""

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "prepared transaction"
        name = self.application_name or "(no application_name)"
        return f"{name!r} ({who}, {self.state}) for {self.age:.0f}s"


# A backend of this database with a snapshot or a transaction id (both hold the horizon), and
# the prepared transactions of this database; this read's own backend left out.
_HOLDERS = text(
    """
    SELECT pid, application_name, state,
           EXTRACT(EPOCH FROM clock_timestamp() - xact_start)::float8 AS age
      FROM pg_stat_activity
     WHERE pid <> pg_backend_pid()
       AND backend_type = 'client backend'
       AND datname = current_database()
       AND xact_start IS NOT NULL
       AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
    UNION ALL
    SELECT NULL, gid, 'prepared', EXTRACT(EPOCH FROM clock_timestamp() - prepared)::float8
      FROM pg_prepared_xacts
     WHERE database = current_database()
     ORDER BY age DESC
     LIMIT :limit
    """
)


def holders(conn: Connection, *, limit: int = 5) -> list[Holder]:
    """The transactions that hold this database's MVCC horizon, oldest first (at most
    `limit`); empty on other engines."""
    if conn.dialect.name != "postgresql":
        return []
    found = conn.execute(_HOLDERS, {"limit": limit})
    return [
        Holder(pid, name or "", state or "", max(float(age or 0.0), 0.0))
        for pid, name, state, age in found
    ]


# The tables as the connection's search_path finds them (a tenant's schema, a test's).
_stats = table("pg_stat_user_tables", column("relid"), column("relname"), column("n_dead_tup"))
_inherits = table("pg_inherits", column("inhrelid"), column("inhparent"))
_parent = table("pg_class", column("oid"), column("relname")).alias("parent")
_ours = [func.to_regclass(literal(name)) for name in TABLES]
_owner = func.coalesce(_parent.c.relname, _stats.c.relname)
DEAD_TUPLES = (
    select(_owner.label("relname"), func.sum(_stats.c.n_dead_tup).label("n_dead_tup"))
    .select_from(
        _stats.outerjoin(_inherits, _inherits.c.inhrelid == _stats.c.relid).outerjoin(
            _parent, _parent.c.oid == _inherits.c.inhparent
        )
    )
    .where(or_(_stats.c.relid.in_(_ours), _inherits.c.inhparent.in_(_ours)))
    .group_by(_owner)
)
"""(table, dead row versions) per scheduler table, as the statistics last counted them; a
partitioned table's (the history on PostgreSQL, revision 0015) summed over its partitions."""

_activity = table(
    "pg_stat_activity",
    column("pid"),
    column("backend_type"),
    column("datname"),
    column("xact_start"),
    column("backend_xmin"),
    column("backend_xid"),
)
_prepared = table("pg_prepared_xacts", column("prepared"), column("database"))


def _seconds_since(instant: Any) -> Any:
    return func.extract("epoch", func.clock_timestamp() - instant)


OLDEST_AGE = select(
    func.coalesce(
        func.greatest(
            select(func.max(_seconds_since(_activity.c.xact_start)))
            .where(
                _activity.c.pid != func.pg_backend_pid(),
                _activity.c.backend_type == "client backend",
                _activity.c.datname == func.current_database(),
                or_(_activity.c.backend_xmin.is_not(None), _activity.c.backend_xid.is_not(None)),
            )
            .scalar_subquery(),
            select(func.max(_seconds_since(_prepared.c.prepared)))
            .where(_prepared.c.database == func.current_database())
            .scalar_subquery(),
        ),
        0,
    )
).scalar_subquery()
"""Seconds the oldest horizon-holding transaction of this database has run (0: none); the
same transactions :func:`holders` lists."""


def dead_tuples(conn: Connection) -> dict[str, int]:
    """Dead row versions per scheduler table (``pg_stat_user_tables.n_dead_tup``); empty on
    other engines."""
    if conn.dialect.name != "postgresql":
        return {}
    return {name: int(n) for name, n in conn.execute(DEAD_TUPLES)}


def warnings(found: list[Holder], threshold: float) -> list[str]:
    """``status``'s warning about the holders older than `threshold` seconds."""
    old = [h for h in found if h.age > threshold]
    if not old:
        return []
    return [
        f"a transaction has held the MVCC horizon for more than {threshold:g}s, so vacuum"
        f" cannot remove dead rows: {h.describe()}; end it (pg_terminate_backend, or"
        " COMMIT/ROLLBACK PREPARED for a prepared one)"
        for h in old
    ]
