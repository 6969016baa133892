"""History that drops instead of deleting: on PostgreSQL, ``scheduler_runs`` and
``scheduler_decisions`` become tables partitioned by day (``finished_at``, ``decided_at``).

Each table is renamed aside, a partitioned table of the same columns, defaults and id
sequence is created in its place with a default partition and one partition per day the old
table has rows of (and today and the next days'), every row is copied, the old table dropped,
and the primary key (now ``(id, <time>)``: a partitioned table's unique keys must hold its
partition column) and the indexes are built. The rows keep their ids; the sequence goes on.
No foreign key names either table. ``_store/partitions.py`` says how the worker keeps the
partitions.

SQLite and MariaDB: nothing (their purge stays a ``DELETE``). The downgrade copies the rows back
into plain tables.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import op

from scheduler._store import partitions
from scheduler._store.tables import decisions, runs

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    if not partitions.can_partition(conn):  # SQLite, MariaDB, Citus: the DELETE purge stays
        return
    today = datetime.now(UTC).date()
    for table in (runs, decisions):
        if not partitions.partitioned(conn, table.name):
            partitions.convert(conn, table, today)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    for table in (runs, decisions):
        if partitions.partitioned(conn, table.name):
            partitions.unconvert(conn, table)
