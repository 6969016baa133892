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
  (``scheduler/_store/pipeline.py``), so that their commits share WAL flushes.

:func:`writer_for` picks one per engine, once, from the store's capabilities
(``Store.caps``). Correctness never rests on the choice: every implementation writes through
the same version compare-and-swap, so a stale snapshot loses instead of acting twice.
"""

from __future__ import annotations

import weakref

from sqlalchemy import Engine

from .. import Store
from .base import AfterCommit, Carried, Decided, Done, JobDefaults, Work, Writer

__all__ = [
    "AfterCommit",
    "Carried",
    "Decided",
    "Done",
    "JobDefaults",
    "Work",
    "Writer",
    "writer_for",
]

_chosen: weakref.WeakKeyDictionary[Engine, Writer] = weakref.WeakKeyDictionary()


def writer_for(store: Store) -> Writer:
    """The writer for `store`'s engine, chosen once from its capabilities."""
    found = _chosen.get(store.engine)
    if found is None:
        from .portable import PortableWriter
        from .postgres import PostgresWriter

        caps = store.caps
        if caps.pipeline:
            found = PostgresWriter()
        else:
            found = PortableWriter(single_writer=caps.single_writer)
        _chosen[store.engine] = found
    return found
