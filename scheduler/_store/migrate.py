"""Schema migrations (Alembic), run on our own connection with our own version table.

Alembic is imported only to migrate, or when the schema is not at the head: every command
checks the schema, and :func:`check_schema` reads the version table and the shipped
revisions' ``revision`` / ``down_revision`` lines itself (Alembic's import alone costs
several hundred milliseconds).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

from .._errors import SchemaOutdated
from . import Store

if TYPE_CHECKING:
    from alembic.config import Config

VERSION_TABLE = "scheduler_alembic_version"


def migrations_dir() -> Path:
    """The shipped migrations: inside the wheel, or the repository's ``migrations/``."""
    package = Path(__file__).resolve().parents[1]  # scheduler/
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError("scheduler's migrations are missing from this installation")


def _config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


_REVISION = re.compile(
    r'^(down_revision|revision)\s*(?::[^=]*)?=\s*(None|"[^"]*"|\'[^\']*\')\s*$', re.M
)


@functools.cache
def shipped_head() -> str | None:
    """The head revision read from the shipped revision files' ``revision = "..."`` and
    ``down_revision = "..."`` lines, without Alembic; None when they do not show a single
    head plainly (then :func:`head_revision` asks Alembic)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (migrations_dir() / "versions").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        found: dict[str, str] = {m[1]: m[2] for m in _REVISION.finditer(source)}
        if "revision" not in found or "down_revision" not in found:
            return None
        revisions.add(found["revision"].strip("\"'"))
        if found["down_revision"] != "None":
            parents.add(found["down_revision"].strip("\"'"))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def current_revision(store: Store) -> str | None:
    """The revision the database is at (None: no schema), read with one SELECT."""
    with store.read() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        found = list(conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())
    return found[0] if len(found) == 1 else None


def upgrade(store: Store, revision: str = "head") -> None:
    from alembic import command

    with store.begin() as conn:
        command.upgrade(_config(conn), revision)


def migrate_to(store: Store, revision: str = "head") -> None:
    """Upgrade to ``revision``, or downgrade when it is older than the current one."""
    from alembic.script import ScriptDirectory

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
    from alembic import command

    with store.begin() as conn:
        command.downgrade(_config(conn), revision)


def _known(revision: str) -> bool:
    from alembic.script import ScriptDirectory

    try:
        return ScriptDirectory.from_config(_config()).get_revision(revision) is not None
    except Exception:  # alembic raises its own errors for unknown revisions
        return False


def check_schema(store: Store) -> None:
    """Raise :class:`SchemaOutdated` unless the database is at the head revision."""
    current = current_revision(store)
    if current is not None and current == shipped_head():
        return  # the usual case, without Alembic
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
