"""The decision log loses its index on ``decided_at``: the purge finds its range by id.

Every tick that dispatches writes one entry per due row, so each index of
``scheduler_decisions`` is paid on the tick's hot path (one more B-tree insert and, on
SQLite, one more page in each row's commit). ``ix_scheduler_decisions_at`` served only the
purge, which runs rarely: entries are written in id order at the writer's "now", so the purge
finds the first id decided at or after its cut-off by bisection on the primary key and deletes
the ids below it that are older than the cut-off (``scheduler/_store/decisions.py``).
``ix_scheduler_decisions_task`` (task, id), which ``explain`` reads, stays.

Dropping an index rewrites no row; the downgrade creates it again.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_scheduler_decisions_at", table_name="scheduler_decisions")


def downgrade() -> None:
    op.create_index("ix_scheduler_decisions_at", "scheduler_decisions", ["decided_at"])
