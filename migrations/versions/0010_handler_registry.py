"""Handler settings known to every process.

- ``scheduler_handlers``: one row per handler name a worker registered: its ``queue``,
  ``max_attempts`` and ``retry_safe``, when a worker last registered it and which worker.
  ``enqueue`` from a process that has not registered the handler itself uses these settings.
  The name is compared exactly on every engine (a binary collation on MariaDB).
- ``scheduler_workers.handlers``: the names each running worker registered (a JSON list), so
  that ``status`` can list ready jobs whose handler no live worker has.

Both are new (a table, a nullable column): the upgrade rewrites no row. The downgrade drops
them; workers record them again when they start on the upgraded schema.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from scheduler._store.tables import HandlerName, UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scheduler_handlers",
        sa.Column("name", HandlerName, primary_key=True),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("retry_safe", sa.Boolean, nullable=False),
        sa.Column("registered_at", UTCDateTime, nullable=False),
        sa.Column("registered_by", sa.String(200), nullable=False),
    )
    with op.batch_alter_table("scheduler_workers") as batch:
        batch.add_column(sa.Column("handlers", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_workers") as batch:
        batch.drop_column("handlers")
    op.drop_table("scheduler_handlers")
