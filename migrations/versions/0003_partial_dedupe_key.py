"""The dedupe key's unique index holds only the jobs that have a key.

A job has a dedupe key only while it is active and only when its enqueue gave one (a
dispatched job never has one), yet the unique constraint of revision 0001 took an index entry
for every job, NULL included: one index write per enqueue and per dispatch that no query
reads. On SQLite and PostgreSQL the constraint becomes a unique index on ``dedupe_key`` where
it is not NULL (both engines use it for ``dedupe_key = ?``, and a second active job with the
same key still fails the insert). SQLite cannot drop a constraint, so its jobs table is
rebuilt, rows kept. MariaDB has no partial indexes: its unique index is only renamed, so that
the schema has the same index name on every engine.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEX = "ux_scheduler_jobs_dedupe"
WHERE = sa.text("dedupe_key IS NOT NULL")
# SQLite's constraint from 0001 has no name: batch mode names it by this convention to drop it.
NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def upgrade() -> None:
    dialect = op.get_context().dialect.name
    if dialect == "sqlite":
        with op.batch_alter_table("scheduler_jobs", naming_convention=NAMING) as batch:
            batch.drop_constraint("uq_scheduler_jobs_dedupe_key", type_="unique")
    elif dialect == "postgresql":
        op.drop_constraint("scheduler_jobs_dedupe_key_key", "scheduler_jobs", type_="unique")
    else:  # MariaDB: the unique index that 0001's constraint made, under its column's name
        op.drop_index("dedupe_key", "scheduler_jobs")
    op.create_index(
        INDEX,
        "scheduler_jobs",
        ["dedupe_key"],
        unique=True,
        sqlite_where=WHERE,
        postgresql_where=WHERE,
    )


def downgrade() -> None:
    dialect = op.get_context().dialect.name
    op.drop_index(INDEX, "scheduler_jobs")
    if dialect == "sqlite":
        with op.batch_alter_table("scheduler_jobs") as batch:
            batch.create_unique_constraint("uq_scheduler_jobs_dedupe_key", ["dedupe_key"])
    elif dialect == "postgresql":
        op.create_unique_constraint(
            "scheduler_jobs_dedupe_key_key", "scheduler_jobs", ["dedupe_key"]
        )
    else:
        op.create_index("dedupe_key", "scheduler_jobs", ["dedupe_key"], unique=True)
