"""Stopping a running job: a worker's hung attempts, an operator's cancel of a claimed job.

- ``scheduler_workers.stuck_attempts``: attempts the worker fenced after their timeout and
  ``cancel_grace`` whose handler has not returned (a sync thread blocked for good). Each holds
  one of the worker's threads; ``scheduler status`` warns about them. NULL on the rows of
  processes that do not run jobs, and on rows written before this revision.
- ``scheduler_jobs.cancel_requested_at``: when an operator asked to cancel the job while it
  was claimed; its worker stops the attempt (a request older than the attempt's
  ``started_at`` belongs to an earlier run and is ignored).

The columns are nullable: the upgrade rewrites no row.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from scheduler._store.tables import UTCDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_workers") as batch:
        batch.add_column(sa.Column("stuck_attempts", sa.Integer, nullable=True))
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.add_column(sa.Column("cancel_requested_at", UTCDateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.drop_column("cancel_requested_at")
    with op.batch_alter_table("scheduler_workers") as batch:
        batch.drop_column("stuck_attempts")
