"""Recovery probes and fences.

- ``scheduler_rows.recovery`` (``manual`` or ``probe``), ``probe_intervals`` (JSON, NULL for
  the defaults), ``probe_at`` (when a probing row's next probe runs; NULL when it is not
  probing, indexed), ``probes`` (how many ran since the disable) and ``recovery_alert`` (the
  ``row_recovered`` alert's outbox, cleared once its receivers ran).
- ``scheduler_jobs.fence``: grows with every claim, takeover and rerun in place of the job.

Existing rows get ``manual`` and 0: the upgrade changes no behaviour.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from scheduler._store.tables import UTCDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_rows") as batch:
        batch.add_column(
            sa.Column("recovery", sa.String(8), nullable=False, server_default="manual")
        )
        batch.add_column(sa.Column("probe_intervals", sa.String(200), nullable=True))
        batch.add_column(sa.Column("probe_at", UTCDateTime, nullable=True))
        batch.add_column(sa.Column("probes", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("recovery_alert", sa.String(500), nullable=True))
        batch.create_index("ix_scheduler_rows_probe", ["probe_at"])
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.add_column(sa.Column("fence", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.drop_column("fence")
    with op.batch_alter_table("scheduler_rows") as batch:
        batch.drop_index("ix_scheduler_rows_probe")
        batch.drop_column("recovery_alert")
        batch.drop_column("probes")
        batch.drop_column("probe_at")
        batch.drop_column("probe_intervals")
        batch.drop_column("recovery")
