"""Timeouts: a worker says how many of its attempts still run past their stop.

- ``scheduler_workers.stuck_attempts``: attempts the worker fenced after their timeout and
  ``cancel_grace`` whose handler has not returned (a sync thread blocked for good). Each holds
  one of the worker's threads; ``scheduler status`` warns about them. NULL on the rows of
  processes that do not run jobs, and on rows written before this revision.

The column is nullable: the upgrade rewrites no row.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_workers") as batch:
        batch.add_column(sa.Column("stuck_attempts", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_workers") as batch:
        batch.drop_column("stuck_attempts")
