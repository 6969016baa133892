"""The due index gains ``id``: ``(enabled, next_run_at, id)``, the due query's own order.

The tick reads the due rows in batches, ordered by ``(next_run_at, id)`` and paginated by
that pair. A burst's rows share one ``next_run_at``, so on ``(enabled, next_run_at)``
PostgreSQL had to read every due row and sort them for each batch of 100: a burst of
100,000 rows cost 1,000 reads of up to 100,000 rows each (issue 25). With ``id`` in the
index, a batch is a range scan of its own rows from where the last one ended. (SQLite and
InnoDB append the primary key to every index already; there the index only says so.)

Rebuilding an index rewrites no row; the downgrade builds the old one again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_scheduler_rows_due", table_name="scheduler_rows")
    op.create_index("ix_scheduler_rows_due", "scheduler_rows", ["enabled", "next_run_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_scheduler_rows_due", table_name="scheduler_rows")
    op.create_index("ix_scheduler_rows_due", "scheduler_rows", ["enabled", "next_run_at"])
