"""Run policies, the decision log, the audit log, job slots, tenants and clock offsets.

One revision for the schema of the capabilities that come after the tick's redesign, so that
each of them adds code, not another migration:

- ``scheduler_rows``: the run policies ``overlap`` (``hold``, ``skip``, ``allow``; rows that
  were ``concurrent`` become ``allow``), ``catchup_window`` and ``jitter`` (seconds, 0 = off);
  ``held_slot``, the slot whose ``held_back`` decision is already logged (a held-back row writes
  once per slot, not once per tick); ``disabled_note``, the operator's ``--reason``; ``tenant``.
- ``scheduler_jobs``: ``slot``, the nominal cron instant a dispatched job stands for;
  ``tenant``; an index on ``(task_name, id)`` for a task's jobs, newest first.
- ``scheduler_runs``: ``slot``, kept with each attempt.
- ``scheduler_decisions``: one entry per slot and outcome of a row.
- ``scheduler_audit``: who did what to which row or job, when and why.
- ``scheduler_workers``: ``clock_offset``, how far the host's clock is from the database's.

Every new column is nullable or has a server default, so the upgrade rewrites no row on
PostgreSQL and MariaDB (SQLite adds them in place); the downgrade drops them again (on SQLite
by rebuilding the tables, rows kept).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from scheduler._store.tables import Id, UniqueKey, UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_rows") as batch:
        batch.add_column(sa.Column("overlap", sa.String(8), nullable=False, server_default="hold"))
        batch.add_column(
            sa.Column("catchup_window", sa.Integer, nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("jitter", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("held_slot", UTCDateTime, nullable=True))
        batch.add_column(sa.Column("disabled_note", sa.String(500), nullable=True))
        batch.add_column(sa.Column("tenant", sa.String(63), nullable=True))
    op.execute(
        sa.text("UPDATE scheduler_rows SET overlap = 'allow' WHERE concurrent = :yes").bindparams(
            yes=True
        )
    )
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.add_column(sa.Column("slot", UTCDateTime, nullable=True))
        batch.add_column(sa.Column("tenant", sa.String(63), nullable=True))
    op.create_index("ix_scheduler_jobs_task", "scheduler_jobs", ["task_name", "id"])
    with op.batch_alter_table("scheduler_runs") as batch:
        batch.add_column(sa.Column("slot", UTCDateTime, nullable=True))
    with op.batch_alter_table("scheduler_workers") as batch:
        batch.add_column(sa.Column("clock_offset", sa.Float, nullable=True))
    op.create_table(
        "scheduler_decisions",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("task_name", UniqueKey, nullable=False),
        sa.Column("slot", UTCDateTime, nullable=True),
        sa.Column("decided_at", UTCDateTime, nullable=False),
        sa.Column("decision", sa.String(32), nullable=False),
        sa.Column("job_id", Id, nullable=True),
        sa.Column("reason", sa.String(200), nullable=True),
        sa.Column("detail", sa.String(500), nullable=True),
    )
    op.create_index("ix_scheduler_decisions_task", "scheduler_decisions", ["task_name", "id"])
    op.create_index("ix_scheduler_decisions_at", "scheduler_decisions", ["decided_at"])
    op.create_table(
        "scheduler_audit",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", UniqueKey, nullable=True),
        sa.Column("reason", sa.String(1000), nullable=True),
        sa.Column("detail", sa.String(1000), nullable=True),
    )
    op.create_index("ix_scheduler_audit_target", "scheduler_audit", ["target", "id"])
    op.create_index("ix_scheduler_audit_at", "scheduler_audit", ["at"])


def downgrade() -> None:
    op.drop_table("scheduler_audit")
    op.drop_table("scheduler_decisions")
    with op.batch_alter_table("scheduler_workers") as batch:
        batch.drop_column("clock_offset")
    with op.batch_alter_table("scheduler_runs") as batch:
        batch.drop_column("slot")
    op.drop_index("ix_scheduler_jobs_task", "scheduler_jobs")
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.drop_column("tenant")
        batch.drop_column("slot")
    # ``overlap = 'allow'`` goes back to being ``concurrent`` (it was kept in step with it).
    with op.batch_alter_table("scheduler_rows") as batch:
        for column in (
            "tenant",
            "disabled_note",
            "held_slot",
            "jitter",
            "catchup_window",
            "overlap",
        ):
            batch.drop_column(column)
