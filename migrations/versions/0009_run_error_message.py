"""Why a run failed, and the run history by time.

- ``scheduler_runs.error_message``: the first line of the exception's message, redacted, at
  most 300 characters, written only when ``[worker] error_messages = "first-line"``; nullable,
  so no row is rewritten.
- ``ix_scheduler_runs_finished`` on ``(finished_at, outcome)``: the dashboard's chart of runs
  succeeded and failed over time reads a range of it instead of the whole history.

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
    with op.batch_alter_table("scheduler_runs") as batch:
        batch.add_column(sa.Column("error_message", sa.String(300), nullable=True))
    op.create_index("ix_scheduler_runs_finished", "scheduler_runs", ["finished_at", "outcome"])


def downgrade() -> None:
    op.drop_index("ix_scheduler_runs_finished", table_name="scheduler_runs")
    with op.batch_alter_table("scheduler_runs") as batch:
        batch.drop_column("error_message")
