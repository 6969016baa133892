"""Limits every worker shares: a lock row per limit and the attempts each let start.

- ``scheduler_limits``: one row per limit (its name), whose ``version`` every limited claim
  bumps first (the limit's claims take turns on that row lock), and ``cursor``, the partition
  a ``fair`` limit served last.
- ``scheduler_limit_holds``: one row per attempt a limit let start (limit, partition, job,
  when): running while its job is ``claimed``, counted by ``rate`` while in the window.

New tables only: the upgrade rewrites no row.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from scheduler._store.tables import Id, UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scheduler_limits",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("cursor", sa.String(200)),
    )
    op.create_table(
        "scheduler_limit_holds",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("limit_name", sa.String(200), nullable=False),
        sa.Column("part", sa.String(200), nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
    )
    op.create_index(
        "ix_scheduler_limit_holds_started",
        "scheduler_limit_holds",
        ["limit_name", "part", "started_at"],
    )
    op.create_index(
        "ix_scheduler_limit_holds_job", "scheduler_limit_holds", ["limit_name", "job_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_scheduler_limit_holds_job", table_name="scheduler_limit_holds")
    op.drop_index("ix_scheduler_limit_holds_started", table_name="scheduler_limit_holds")
    op.drop_table("scheduler_limit_holds")
    op.drop_table("scheduler_limits")
