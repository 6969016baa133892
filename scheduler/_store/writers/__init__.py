"""Writing the tick's decisions (every decision, not only dispatches): one interface, one
implementation per way of executing.

The tick (``scheduler/_tick.py``) reads a batch of due rows (``scheduler/_store/due.py``) and
has the model decide each one (``scheduler/_model/decide.py``); a :class:`Writer` then writes
those decisions, each row in its own transaction, under the compare-and-swap on the row's
version. Two implementations:

- :class:`~scheduler._store.writers.portable.PortableWriter` (``portable.py``): SQLAlchemy Core
  on every engine; a fresh dispatch is an INSERT and the row's compare-and-swap. On SQLite one
  connection (one writer at a time); elsewhere, when configured, several connections on
  helper threads.
- :class:`~scheduler._store.writers.postgres.PostgresWriter` (``postgres.py``): PostgreSQL with
  psycopg; a fresh dispatch is one statement (the compare-and-swap and the INSERT in one CTE),
  and the batch's fresh dispatches run at once over several connections from one thread
  (``scheduler/_store/pipeline.py``), so that their commits share WAL flushes. Not on Citus:
  it refuses the statement (a ``VOLATILE`` function, the sequence's ``nextval``, in an
  ``UPDATE`` of a distributed table), so there the portable writer's statements run, each
  routed to the node that holds the shard's tables, in the row's one transaction.

:func:`writer_for` picks one per engine, once, from the store's capabilities
(``Store.caps``). Correctness never rests on the choice: every implementation writes through
the same version compare-and-swap, so a stale snapshot loses instead of acting twice.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from sqlalchemy import Connection, Engine

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


_chosen: weakref.WeakKeyDictionary[Engine, Writer] = weakref.WeakKeyDictionary()


def writer_for(store: Store) -> Writer:
    """The writer for `store`'s engine, chosen once from its capabilities (ask once the engine
    has connected: Citus is known from its first connection)."""
    found = _chosen.get(store.engine)
    if found is None:
        from .portable import PortableWriter
        from .postgres import PostgresWriter

        caps = store.caps
        if caps.pipeline and not caps.citus:
            found = PostgresWriter()
        else:
            found = PortableWriter(single_writer=caps.single_writer)
        _chosen[store.engine] = found
    return found
