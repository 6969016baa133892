"""Alembic environment for scheduler's own tables.

Run programmatically by ``scheduler.Scheduler.migrate`` on the caller's connection, with our
own version table so a host application's ``alembic_version`` is never touched.
"""

from __future__ import annotations

from alembic import context

from scheduler._store.migrate import VERSION_TABLE
from scheduler._store.tables import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
