"""How one attempt ended, before it is written: the runner decides it, the recorder writes it,
the traces and the metrics read it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .job import Job
from .rules import QUEUED, SUCCEEDED


@dataclass(frozen=True)
class Ending:
    """How one attempt ended, before it is written."""

    job: Job
    started: datetime
    state: str  # succeeded, aborted, or queued (a retry at retry_at)
    code: str | None
    retry_at: datetime | None = None
    run_code: str | None = None  # the code for the run history, when it differs
    abandoned: bool = False
    message: str | None = None  # the exception's first line, redacted ([worker] error_messages)
    snoozed: bool = False  # queued again at retry_at, its attempt given back (Snooze)
    completed: bool = False  # the handler recorded its success itself (job.complete)

    @classmethod
    def success(cls, job: Job, started: datetime, *, completed: bool = False) -> Ending:
        """``Ending(job, started, SUCCEEDED, None, completed=completed)``, made without the
        frozen dataclass's ``__init__`` (which sets each field through ``object.__setattr__``):
        one per job a worker runs."""
        made = object.__new__(cls)
        made.__dict__.update(
            job=job,
            started=started,
            state=SUCCEEDED,
            code=None,
            retry_at=None,
            run_code=None,
            abandoned=False,
            message=None,
            snoozed=False,
            completed=completed,
        )
        return made

    @property
    def result(self) -> str:
        """How the attempt ended, as the run history, the metrics and the traces name it:
        ``succeeded``, ``failed`` (a retry follows), ``aborted``, ``abandoned`` or
        ``snoozed``."""
        if self.abandoned:
            return "abandoned"
        if self.snoozed:
            return "snoozed"
        return "failed" if self.state == QUEUED else self.state
