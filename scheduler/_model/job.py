"""A job as the scheduler shows it: the read-only view of a row of the queue."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .payload import decode_payload


@dataclass(frozen=True)
class Job:
    """A read-only view of a job row."""

    id: int
    handler: str
    state: str
    attempts: int
    max_attempts: int
    run_at: datetime
    last_error_code: str | None
    payload: dict[str, Any]
    queue: str
    priority: int
    task_name: str | None
    dedupe_key: str | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    finished_at: datetime | None
    traceparent: str | None = None  # the enqueue's span (OpenTelemetry), when traced
    slot: datetime | None = None  # the cron instant a task's job stands for (before jitter)
    tenant: str | None = None  # whose job it is (``enqueue(tenant=...)``, a task's ``tenant``)
    fence: int = 0  # grows with every claim, takeover and rerun in place of the job
    #: A ready ``queued`` job a limit holds back: what it waits for ("limit crm-api: 10 of
    #: 10 running"); None otherwise (and in the jobs a worker claims).
    waiting_for: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> Job:
        """From a row of ``scheduler_jobs`` as read (any object with a ``_mapping``)."""
        m = row._mapping
        return cls(
            id=m["id"],
            handler=m["handler"],
            state=m["state"],
            attempts=m["attempts"],
            max_attempts=m["max_attempts"],
            run_at=m["run_at"],
            last_error_code=m["last_error_code"],
            payload=decode_payload(m["payload"]),
            queue=m["queue"],
            priority=m["priority"],
            task_name=m["task_name"],
            dedupe_key=m["dedupe_key"],
            lease_owner=m["lease_owner"],
            lease_expires_at=m["lease_expires_at"],
            created_at=m["created_at"],
            finished_at=m["finished_at"],
            traceparent=m.get("traceparent"),
            slot=m.get("slot"),
            tenant=m.get("tenant"),
            fence=m.get("fence") or 0,
        )


RecordedHook = Callable[[list[tuple[Job, str]]], None]
"""Told of each batch of committed outcomes: (the job as written, ``succeeded``, ``failed``,
``aborted`` or ``abandoned``)."""
