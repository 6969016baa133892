"""``backfill``: one job per cron slot of a task in ``[start, end)`` (docs/howto/operate.md).

The slots are the task's own (its cron in its timezone, DST rules included: ``_cron``). A slot
is taken when a job of the task carries it (``jobs.slot``) or an attempt of one ran for it
(``runs.slot``, kept by a rerun in place); taken slots are skipped, so running the same backfill
twice enqueues nothing the second time.

Two backfills of one task at once: each first bumps the row's ``version`` with a
compare-and-swap on the version it read, then reads the taken slots, then inserts. The second
one's swap waits for the first's transaction and then touches nothing (the version moved on):
it starts again and reads the first one's jobs. The tick's dispatch swaps the same version, so
a backfill and a dispatch of one task are ordered too. No unique index on
``(task_name, slot)`` is needed, and the tick's insert pays nothing for backfill.

Backfilled jobs are extra jobs of the task: the row's ``last_job_id`` and
``consecutive_failures`` are left alone, so the tick's rerun in place and failure count never
see them, and the ``overlap`` policy does not hold them back. A backfilled job that fails ends
``aborted`` like any job (retries first, as its handler says), stays for inspection, and can be
run again with ``scheduler retry ID``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .._errors import SchedulerError, UnknownRow
from .._model import defaults as _limits
from .._model import slots as _slots
from .._model.time import iso
from .._store import Connection
from .._store import backfill as _store

#: ``--max``: a backfill of more slots than this is refused unless told otherwise.
DEFAULT_MAX = _limits.BACKFILL_MAX


class VersionMoved(Exception):
    """The row changed between the read and the compare-and-swap: read it again."""


@dataclass
class BackfillResult:
    """What a backfill did (or, on a dry run, would do)."""

    task: str
    start: datetime
    end: datetime
    slots: list[datetime]
    """Every slot of the task in ``[start, end)``, oldest first."""
    taken: list[datetime] = field(default_factory=list)
    """The slots that already had a job: skipped."""
    enqueued: dict[datetime, int] = field(default_factory=dict)
    """Slot -> the new job's id (empty on a dry run)."""
    dry_run: bool = False
    queue: str | None = None
    """The queue of the jobs it enqueued (the handler's)."""

    @property
    def pending(self) -> list[datetime]:
        """The slots a backfill enqueues (on a dry run: would enqueue)."""
        taken = set(self.taken)
        return [s for s in self.slots if s not in taken]

    def as_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "from": iso(self.start),
            "to": iso(self.end),
            "dry_run": self.dry_run,
            "slots": [iso(s) for s in self.slots],
            "taken": [iso(s) for s in self.taken],
            "enqueued": [{"slot": iso(s), "job_id": i} for s, i in self.enqueued.items()],
        }


def backfill(
    conn: Connection,
    name: str,
    start: datetime,
    end: datetime,
    *,
    now: datetime,
    max_slots: int = DEFAULT_MAX,
    dry_run: bool = False,
    job_defaults: Callable[[str], tuple[int, str]],
) -> BackfillResult:
    """Enqueue one job per free slot of task ``name`` in ``[start, end)``, each with its
    ``slot`` and a ``backfilled`` decision, in this transaction. Raises :class:`UnknownRow`,
    :class:`SchedulerError` (a bad range, too many slots) before writing anything, and
    :class:`VersionMoved` when another writer changed the row meanwhile (run it again)."""
    row = _store.read_task(conn, name)
    if row is None:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")
    start, end = _slots.localize(start, row.timezone), _slots.localize(end, row.timezone)
    if start >= end:
        raise SchedulerError(
            f"backfill {name!r}: --from {iso(start)} is not before --to {iso(end)}"
        )
    if end > now:
        raise SchedulerError(
            f"backfill {name!r}: --to {iso(end)} is in the future (now {iso(now)}):"
            " backfill runs slots that have passed; the tick runs the coming ones"
        )
    found = _slots.backfill_slots(row.cron, row.timezone, name, start, end, max_slots)
    if len(found) > max_slots:
        raise SchedulerError(
            f"backfill {name!r}: more than {max_slots:,} slots from {iso(start)} to"
            f" {iso(end)} (--max {max_slots}): narrow the range or raise --max"
        )
    result = BackfillResult(name, start, end, found, dry_run=dry_run)
    if not found:
        return result
    if not dry_run:
        if not _store.swap_version(conn, name, row.version):
            raise VersionMoved(name)
    taken = _store.taken(conn, name, found)
    result.taken = [s for s in found if s in taken]
    if dry_run:
        return result
    max_attempts, queue = job_defaults(row.handler)
    result.queue = queue
    result.enqueued = _store.enqueue(
        conn, name, row, result.pending, now=now, queue=queue, max_attempts=max_attempts
    )
    return result
