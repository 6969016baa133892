"""Paused queues and a task's timeout.

- ``scheduler_paused_queues``: one row per queue an operator paused (``scheduler pause``):
  when, by whom and why. Workers claim nothing from these queues until the row is deleted
  (``scheduler resume``); the tick still dispatches into them. The name is compared exactly on
  every engine (a binary collation on MariaDB).
- ``scheduler_rows.timeout``: seconds one attempt of the task's jobs may run, which wins
  over its handler's ``timeout``; NULL (every row written before this revision): the
  handler's; 0: no limit.

The table is new and the column nullable: the upgrade rewrites no row. The downgrade drops
both (every queue resumes; tasks go back to their handlers' timeouts).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from scheduler._store.tables import QueueName, UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scheduler_paused_queues",
        sa.Column("queue", QueueName, primary_key=True),
        sa.Column("paused_at", UTCDateTime, nullable=False),
        sa.Column("paused_by", sa.String(200), nullable=False),
        sa.Column("reason", sa.String(500), nullable=True),
    )
    with op.batch_alter_table("scheduler_rows") as batch:
        batch.add_column(sa.Column("timeout", sa.Double, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_rows") as batch:
        batch.drop_column("timeout")
    op.drop_table("scheduler_paused_queues")
