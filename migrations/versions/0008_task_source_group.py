"""Tasks as data: each row says who owns it (``source``) and the group it belongs to.

- ``scheduler_rows.source``: ``file`` (the TOML file, or ``sync(tasks)``) or ``api`` (created
  at runtime by ``put_task``/``put_tasks``). Every existing row came from a sync: ``file``.
- ``scheduler_rows.task_group``: an ``api`` row's group (``put_tasks(group=...)``), compared
  exactly on every engine (a binary collation on MariaDB), at most 200 characters.
- Indexes: ``(source, name)``, so that a sync reads the file's rows alone among a million of
  the application's; ``(task_group, name)`` and ``(tenant, name)`` for ``rows(group=...)``,
  ``rows(tenant=...)`` and a group's replacement, each paged by name.

The new columns are nullable or have a server default: the upgrade rewrites no row on
PostgreSQL and MariaDB (SQLite adds them in place). The downgrade refuses while ``api`` rows
exist (dropping the column would turn them into the file's rows, which the next sync
disables): remove them first.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from scheduler._store.tables import UniqueKey

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_rows") as batch:
        batch.add_column(sa.Column("source", sa.String(8), nullable=False, server_default="file"))
        batch.add_column(sa.Column("task_group", UniqueKey, nullable=True))
    op.create_index("ix_scheduler_rows_source", "scheduler_rows", ["source", "name"])
    op.create_index("ix_scheduler_rows_group", "scheduler_rows", ["task_group", "name"])
    op.create_index("ix_scheduler_rows_tenant", "scheduler_rows", ["tenant", "name"])


def downgrade() -> None:
    bind = op.get_bind()
    found = bind.execute(sa.text("SELECT count(*) FROM scheduler_rows WHERE source = 'api'"))
    count = found.scalar()
    if count:
        raise RuntimeError(
            f"{count} task(s) were created at runtime (source 'api'): remove them"
            " (remove_task, `scheduler tasks remove`) before downgrading below revision 0008"
        )
    op.drop_index("ix_scheduler_rows_tenant", table_name="scheduler_rows")
    op.drop_index("ix_scheduler_rows_group", table_name="scheduler_rows")
    op.drop_index("ix_scheduler_rows_source", table_name="scheduler_rows")
    with op.batch_alter_table("scheduler_rows") as batch:
        batch.drop_column("task_group")
        batch.drop_column("source")
