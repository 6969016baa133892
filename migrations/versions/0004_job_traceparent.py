"""Jobs carry the W3C ``traceparent`` of the span that enqueued them (OpenTelemetry).

A nullable column, set only by an enqueue made while OpenTelemetry is configured: the run's
span becomes a child of the enqueue's. It holds the 55 characters of a ``traceparent``
header (version, trace id, span id, flags), never baggage or any other header. Adding a
nullable column rewrites nothing on PostgreSQL and MariaDB; SQLite adds it in place too.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("scheduler_jobs", sa.Column("traceparent", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.drop_column("traceparent")
