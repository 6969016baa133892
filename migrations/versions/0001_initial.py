"""Initial schema: jobs, run history, scheduler rows, workers.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from scheduler._store.tables import Id, Payload, UniqueKey, UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scheduler_jobs",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("handler", sa.String(200), nullable=False),
        sa.Column("payload", Payload, nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("run_at", UTCDateTime, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.String(200)),
        sa.Column("lease_expires_at", UTCDateTime),
        sa.Column("started_at", UTCDateTime),
        sa.Column("last_error_code", sa.String(200)),
        sa.Column("dedupe_key", UniqueKey, unique=True),
        sa.Column("task_name", sa.String(200)),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("finished_at", UTCDateTime),
    )
    op.create_index(
        "ix_scheduler_jobs_ready", "scheduler_jobs", ["state", "queue", "priority", "run_at", "id"]
    )
    op.create_index("ix_scheduler_jobs_lease", "scheduler_jobs", ["state", "lease_expires_at"])
    op.create_index("ix_scheduler_jobs_finished", "scheduler_jobs", ["state", "finished_at"])

    op.create_table(
        "scheduler_runs",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("started_at", UTCDateTime),
        sa.Column("finished_at", UTCDateTime, nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("error_code", sa.String(200)),
        sa.Column("worker", sa.String(200)),
    )
    op.create_index("ix_scheduler_runs_job", "scheduler_runs", ["job_id"])

    op.create_table(
        "scheduler_rows",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("name", UniqueKey, nullable=False, unique=True),
        sa.Column("handler", sa.String(200), nullable=False),
        sa.Column("payload", Payload, nullable=False),
        sa.Column("cron", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("concurrent", sa.Boolean, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("next_run_at", UTCDateTime),
        sa.Column("last_job_id", Id),
        sa.Column("consecutive_failures", sa.Integer, nullable=False),
        sa.Column("max_consecutive_failures", sa.Integer),
        sa.Column("disabled_reason", sa.String(64)),
        sa.Column("disabled_at", UTCDateTime),
        sa.Column("alert_id", sa.String(64)),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_scheduler_rows_due", "scheduler_rows", ["enabled", "next_run_at"])

    op.create_table(
        "scheduler_workers",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("hostname", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("last_seen_at", UTCDateTime, nullable=False),
        sa.Column("last_tick_at", UTCDateTime),
    )


def downgrade() -> None:
    op.drop_table("scheduler_workers")
    op.drop_index("ix_scheduler_rows_due", "scheduler_rows")
    op.drop_table("scheduler_rows")
    op.drop_index("ix_scheduler_runs_job", "scheduler_runs")
    op.drop_table("scheduler_runs")
    for name in ("finished", "lease", "ready"):
        op.drop_index(f"ix_scheduler_jobs_{name}", "scheduler_jobs")
    op.drop_table("scheduler_jobs")
