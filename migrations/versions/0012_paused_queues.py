"""Paused queues.

- ``scheduler_paused_queues``: one row per queue an operator paused (``scheduler pause``):
  when, by whom and why. Workers claim nothing from these queues until the row is deleted
  (``scheduler resume``); the tick still dispatches into them. The name is compared exactly on
  every engine (a binary collation on MariaDB).

The table is new: the upgrade rewrites no row. The downgrade drops it (every queue resumes).

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


def downgrade() -> None:
    op.drop_table("scheduler_paused_queues")
