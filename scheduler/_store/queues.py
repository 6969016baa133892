"""Paused queues (``scheduler_paused_queues``): workers claim nothing from them until resumed.

A pause is one row, written with its audit entry in one transaction; a resume deletes it.
Workers read the set at most once per poll (:func:`paused_names`, one primary-key scan of a
table that holds a handful of rows) and leave the paused queues out of their claims; the tick
still dispatches into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from .._model.time import iso
from .tables import paused_queues


@dataclass(frozen=True)
class PausedQueue:
    """A queue an operator paused."""

    queue: str
    paused_at: datetime
    paused_by: str
    reason: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "paused_at": iso(self.paused_at),
            "paused_by": self.paused_by,
            "reason": self.reason,
        }


def pause(conn: Connection, queue: str, *, now: datetime, actor: str, reason: str | None) -> bool:
    """Pause ``queue``; False if it was paused already (its reason is then replaced when a new
    one is given, and nothing else changes)."""
    found = conn.execute(
        select(paused_queues.c.queue).where(paused_queues.c.queue == queue)
    ).first()
    if found is not None:
        if reason is not None:
            conn.execute(
                update(paused_queues).where(paused_queues.c.queue == queue).values(reason=reason)
            )
        return False
    conn.execute(
        insert(paused_queues).values(queue=queue, paused_at=now, paused_by=actor, reason=reason)
    )
    return True


def resume(conn: Connection, queue: str) -> bool:
    """Resume ``queue``; False if it was not paused."""
    gone = conn.execute(delete(paused_queues).where(paused_queues.c.queue == queue))
    return bool(gone.rowcount)


def paused(conn: Connection) -> list[PausedQueue]:
    """Every paused queue, by name."""
    rows = conn.execute(select(paused_queues).order_by(paused_queues.c.queue))
    return [PausedQueue(r.queue, r.paused_at, r.paused_by, r.reason) for r in rows]


def paused_names(conn: Connection) -> frozenset[str]:
    """The paused queues' names (what a worker reads once per poll)."""
    return frozenset(conn.execute(select(paused_queues.c.queue)).scalars())
