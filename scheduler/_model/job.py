"""A job as the scheduler shows it: the read-only view of a row of the queue."""

from __future__ import annotations

import dataclasses
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
        get = m.get
        return cls._made(
            {
                "id": m["id"],
                "handler": m["handler"],
                "state": m["state"],
                "attempts": m["attempts"],
                "max_attempts": m["max_attempts"],
                "run_at": m["run_at"],
                "last_error_code": m["last_error_code"],
                "payload": decode_payload(m["payload"]),
                "queue": m["queue"],
                "priority": m["priority"],
                "task_name": m["task_name"],
                "dedupe_key": m["dedupe_key"],
                "lease_owner": m["lease_owner"],
                "lease_expires_at": m["lease_expires_at"],
                "created_at": m["created_at"],
                "finished_at": m["finished_at"],
                "traceparent": get("traceparent"),
                "slot": get("slot"),
                "tenant": get("tenant"),
                "fence": get("fence") or 0,
                "waiting_for": None,
            }
        )

    @classmethod
    def _made(cls, fields: dict[str, Any]) -> Job:
        """A Job of ``fields`` (every field, by name) without the dataclass's ``__init__``: a
        frozen dataclass's sets each field through ``object.__setattr__``, about ten times the
        cost of filling its ``__dict__`` at once, and a worker makes one per claimed job."""
        made = object.__new__(cls)
        made.__dict__.update(fields)
        return made

    def replaced(self, **changes: Any) -> Job:
        """This job with ``changes`` (fields by name): ``dataclasses.replace`` at a tenth of
        its cost (no ``fields()`` walk, no ``__init__``); the outcome of every job makes one."""
        unknown = changes.keys() - _FIELDS
        if unknown:
            raise TypeError(f"Job has no field(s) {sorted(unknown)}")
        return self._made({**self.__dict__, **changes})


_FIELDS = frozenset(field.name for field in dataclasses.fields(Job))


RecordedHook = Callable[[list[tuple[Job, str]]], None]
"""Told of each batch of committed outcomes: (the job as written, ``succeeded``, ``failed``,
``aborted`` or ``abandoned``)."""
