"""Wake-ups: an idle worker learns of a ready job at once, not at its next poll.

One function announces: :func:`announce`, called inside the transaction that makes jobs ready
(an enqueue, a retry written by a worker, ``retry_job``, ``backfill``) or, on a connection
outside any transaction, after the commits it speaks for (the tick, once per batch). What it
does depends on how the processes of one database are told:

- **PostgreSQL** (no ``[broker]``): ``pg_notify`` on the caller's connection, so the server
  delivers it at commit and never for a rollback. A transaction announces each queue once
  (PostgreSQL folds equal notifications of one transaction into one): a thousand jobs enqueued
  in one transaction are one wake-up. The channel is ``scheduler:`` and the schema the tables
  live in, so two schemas of one database do not wake each other.
- **A broker** (``[broker] url = "redis://..."``): after the commit (a rollback drops it), one
  token per ready job, up to :data:`TOKEN_CAP`, is pushed on a Redis list per queue; an idle
  worker pops one (``BLPOP``) and claims. One token wakes one worker: as many workers wake as
  there are jobs. Redis carries wake-ups only: the jobs and every decision stay in the SQL
  database, and a Redis that is down costs the poll interval, never a job.
- **In this process**: after the commit, the workers running in this process on the same
  database are woken directly (up to one per job, those with a free slot first).

Listening is per worker (:func:`listen`): a connection of its own that ``LISTEN``\\ s
(PostgreSQL; the ``[database] listen_url`` if set, and none behind a transaction pooler
without one), or a thread that pops the broker's tokens, or, on SQLite, a thread that reads the
WAL index header of the database file (48 bytes of the ``-shm`` file, every
:data:`SQLITE_WATCH_SECONDS`): it changes with every commit of any process, and reading it is
no SQL statement. The worker's own commits are told apart and ignored, so an idle worker does
not wake itself. Each wake-up sets the worker's event; the worker claims as it does at a poll,
and the poll (``POLL_SECONDS``) stays as the safety net for anything missed. A job whose
``run_at`` is in the future (a retry's back-off) is announced with it: a worker that hears of
it keeps a timer for the earliest such instant instead of waiting for the poll.
"""

from ._announce import (
    Hub,
    announce,
    announced,
    configure,
    detach,
    folds,
    notify_payload,
)
from ._broker import broker_problem, show_url, token_key
from ._common import Ready, database_key, parse_payload
from ._listen import Listening, describe, listen, status_warnings
from ._postgres import LISTEN_APPLICATION_NAME, NOTIFY_COLUMN, listen_connect_args
from ._process import COOLDOWN_SECONDS, Waiter
from ._sqlite import SqliteWatcher

__all__ = [
    "COOLDOWN_SECONDS",
    "LISTEN_APPLICATION_NAME",
    "NOTIFY_COLUMN",
    "Hub",
    "Listening",
    "Ready",
    "SqliteWatcher",
    "Waiter",
    "announce",
    "announced",
    "broker_problem",
    "configure",
    "database_key",
    "describe",
    "detach",
    "folds",
    "listen",
    "listen_connect_args",
    "notify_payload",
    "parse_payload",
    "show_url",
    "status_warnings",
    "token_key",
]
