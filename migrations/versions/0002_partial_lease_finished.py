"""Partial lease and finished indexes: a queued job has no entry in either.

The lease index serves the expired-lease scan (``lease_expires_at <= now``) and the finished
index the purge (``finished_at < cutoff``); both columns are NULL while a job waits, so full
indexes took two index writes per enqueue and per dispatch for entries no query reads. On
SQLite and PostgreSQL they now hold only rows where the column is set (both engines prove
``column <= ?`` implies ``column IS NOT NULL``, bound parameters included). MariaDB has no
partial indexes: its indexes stay as they were.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

INDEXES = {"lease": "lease_expires_at", "finished": "finished_at"}


def _partial() -> bool:
    return op.get_context().dialect.name in ("sqlite", "postgresql")


def upgrade() -> None:
    if not _partial():
        return
    for name, column in INDEXES.items():
        op.drop_index(f"ix_scheduler_jobs_{name}", "scheduler_jobs")
        where = sa.text(f"{column} IS NOT NULL")
        op.create_index(
            f"ix_scheduler_jobs_{name}",
            "scheduler_jobs",
            ["state", column],
            sqlite_where=where,
            postgresql_where=where,
        )


def downgrade() -> None:
    if not _partial():
        return
    for name, column in INDEXES.items():
        op.drop_index(f"ix_scheduler_jobs_{name}", "scheduler_jobs")
        op.create_index(f"ix_scheduler_jobs_{name}", "scheduler_jobs", ["state", column])
