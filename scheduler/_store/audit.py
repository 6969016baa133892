"""The audit log (``scheduler_audit``): who changed what, when and why (docs/howto/operate.md).

An entry is written by the change it records, in the same transaction: a change that rolls
back (a refusal, a lost race, a crash) leaves no entry, and a committed change always has one.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, insert, or_, select

from .._model import defaults as _limits
from .._model.time import iso
from .tables import audit

ACTOR_ENV = "SCHEDULER_ACTOR"
#: The longest ``--reason`` kept (the ``disabled_note`` column's length).
REASON_LIMIT = 500
ACTOR_LIMIT = 200
DETAIL_LIMIT = 1000
DEFAULT_LIMIT = _limits.AUDIT_LIMIT

#: The actions that write an entry.
ACTIONS = (
    "enable",
    "disable",
    "trigger",
    "sync",
    "retry",
    "cancel",
    "backfill",
    "pause",
    "resume",
)


@dataclass(frozen=True)
class AuditEntry:
    """One audited change."""

    id: int
    at: datetime
    actor: str
    action: str
    target: str | None
    reason: str | None
    detail: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": iso(self.at),
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "reason": self.reason,
            "detail": self.detail,
        }


def default_actor() -> str:
    """``$SCHEDULER_ACTOR``, else ``user@host``."""
    found = os.environ.get(ACTOR_ENV, "").strip()
    if found:
        return found
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment or the password file
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


def check(actor: str | None, reason: str | None) -> tuple[str, str | None]:
    """The actor (defaulted) and the reason (stripped, None when empty); ``ValueError`` for
    one longer than its column. Checked before any SQL: a refused change writes nothing."""
    who = (actor or "").strip() or default_actor()
    if len(who) > ACTOR_LIMIT:
        raise ValueError(f"actor is {len(who)} characters, over the {ACTOR_LIMIT}-character limit")
    why = (reason or "").strip() or None
    if why is not None and len(why) > REASON_LIMIT:
        raise ValueError(
            f"reason is {len(why)} characters, over the {REASON_LIMIT}-character limit"
        )
    return who, why


def record(
    conn: Connection,
    *,
    now: datetime,
    actor: str,
    action: str,
    target: str | None,
    reason: str | None = None,
    detail: str | None = None,
) -> None:
    """Append one entry, on the connection (and so in the transaction) of the change."""
    if detail is not None and len(detail) > DETAIL_LIMIT:
        detail = detail[: DETAIL_LIMIT - 1] + "…"
    conn.execute(
        insert(audit).values(
            at=now, actor=actor, action=action, target=target, reason=reason, detail=detail
        )
    )


def entries(
    conn: Connection,
    name: str | None = None,
    limit: int = DEFAULT_LIMIT,
    *,
    job_task: str | None = None,
) -> list[AuditEntry]:
    """The newest ``limit`` entries, newest first; with ``name``, those whose target it is
    (through the ``(target, id)`` index). ``job_task``: ``name`` is ``job ID`` of that task's
    job, whose retries and cancels are filed under the task with the job in their detail."""
    stmt = select(audit).order_by(audit.c.id.desc()).limit(limit)
    if name is not None and job_task is not None:
        of_task = (audit.c.target == job_task) & (audit.c.detail == name)
        stmt = stmt.where(or_(audit.c.target == name, of_task))
    elif name is not None:
        stmt = stmt.where(audit.c.target == name)
    return [
        AuditEntry(
            id=r.id,
            at=r.at,
            actor=r.actor,
            action=r.action,
            target=r.target,
            reason=r.reason,
            detail=r.detail,
        )
        for r in conn.execute(stmt)
    ]


def purge(conn: Connection, *, before: datetime) -> int:
    """Delete the entries written before `before` (index ``ix_scheduler_audit_at``); how many."""
    return int(conn.execute(delete(audit).where(audit.c.at < before)).rowcount or 0)
