"""Schema migrations (Alembic), run on our own connection with our own version table."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from ._errors import SchemaOutdated
from ._store import Store

VERSION_TABLE = "scheduler_alembic_version"


def migrations_dir() -> Path:
    """The shipped migrations: inside the wheel, or the repository's ``migrations/``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError("scheduler's migrations are missing from this installation")


def _config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(store: Store) -> str | None:
    with store.read() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def upgrade(store: Store, revision: str = "head") -> None:
    with store.begin() as conn:
        command.upgrade(_config(conn), revision)


def migrate_to(store: Store, revision: str = "head") -> None:
    """Upgrade to ``revision``, or downgrade when it is older than the current one."""
    current = current_revision(store)
    script = ScriptDirectory.from_config(_config())
    older = revision == "base" or (
        current is not None
        and revision != current
        and any(r.revision == revision for r in script.walk_revisions("base", current))
    )
    if older:
        downgrade(store, revision)
    else:
        upgrade(store, revision)


def downgrade(store: Store, revision: str) -> None:
    with store.begin() as conn:
        command.downgrade(_config(conn), revision)


def _known(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(_config()).get_revision(revision) is not None
    except Exception:  # alembic raises its own errors for unknown revisions
        return False


def check_schema(store: Store) -> None:
    """Raise :class:`SchemaOutdated` unless the database is at the head revision."""
    current = current_revision(store)
    head = head_revision()
    if current is not None and current != head and not _known(current):
        raise SchemaOutdated(
            f"database schema is at revision {current}, newer than this version of scheduler"
            f" knows (its newest is {head}): upgrade the scheduler package, or migrate the"
            " database back with the newer version"
        )
    if current != head:
        raise SchemaOutdated(
            f"database schema is at revision {current or 'none'}, this version needs {head}:"
            " run `scheduler migrate`"
        )
