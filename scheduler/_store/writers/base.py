"""What a writer of the tick's decisions is given and gives back, and its interface: the
types both implementations (``portable.py``, ``postgres.py``) and the tick share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from sqlalchemy import Connection

from ..._model.decide import Decision
from ..._model.report import Outcome
from ..._model.rows import DueRow
from .. import Store

AfterCommit = Callable[[Connection], object]
"""What to run once the row's transaction has committed (a signal, an alert)."""
Done = tuple[Outcome, AfterCommit | None]
"""One row carried out: its outcome, and what to run after its commit."""
JobDefaults = Callable[[str], tuple[int, str]]
"""(handler name) -> (max_attempts, queue) for the jobs the tick creates or reruns."""
Decided = tuple[DueRow, Decision]


@dataclass(frozen=True)
class Work:
    """What carrying out a batch needs besides the decisions."""

    now: datetime
    job_defaults: JobDefaults
    connections: int
    """Connections to spread a batch over: 0 for the engine's default, < 0 for one."""
    skip_locked: bool = True
    """Pass over a row another transaction holds locked (where the engine can tell at once)."""
    nowait: bool = False
    """A fresh dispatch's swap refuses to wait for the row's lock itself (MariaDB,
    ``Capabilities.nowait``), in place of a ``SKIP LOCKED`` probe."""
    multi_statements: bool = False
    """A fresh dispatch's statements (the job, the row's swap, its entry) go as one query
    (``Capabilities.multi_statements``)."""
    traceparent: str | None = None
    """The tick's span (OpenTelemetry, when traced), for the jobs it creates or reruns."""


@dataclass
class Carried:
    """A batch carried out: per row id, what was done; and the errors raised on the way (the
    rows they stopped are not in `done`)."""

    done: dict[int, Done] = field(default_factory=dict)
    failures: list[BaseException] = field(default_factory=list)


class Writer(Protocol):
    """Carries out the decisions of one batch of due rows, each row in its own transaction."""

    def carry_out(
        self, store: Store, conn: Connection, decided: Sequence[Decided], work: Work
    ) -> Carried:
        """Write `decided` (in due order), starting on `conn` (outside any transaction).

        Returns what was done for each row it got to; an error does not stop the rows on
        other connections, and is returned, not raised, so that what committed is reported.
        """
        ...
