"""Health across shards (``[database] shards`` above 1): each shard's read (``health._gather``,
one transaction in the shard's schema) merged into what one database would have answered.

Counts add up; the oldest ready job is the oldest of all, the latest finished attempt the
latest; the rows of every kind are merged by name (the first ``limit`` of all, the totals
added); a worker serving several shards keeps a presence row in each, shown once (seen last
when it was seen last anywhere, its stuck attempts added); a queue is paused in every shard.
The last tick is the one every shard has had since: the oldest of each shard's latest tick
(a shard never ticked has none), and the shards behind are named in ``no scheduler tick``.

The dashboard's pages merge the same way (:func:`page`, :func:`running`, :func:`queue_lines`,
:func:`buckets`, :func:`counts`): each shard's page read from the same cursor, the first page of
all kept; the present's figures added. docs/explanation/reading-across-shards.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..._model.rows import TaskRow
from ..._model.time import iso
from .dashboard import Page
from .present import Bucket, QueueCounts
from .warned import KINDS, WarnedRows

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(frozen=True)
class Found:
    """What one shard's health read found, before the facts and the warnings are made of it
    (:func:`health._gather`; several shards' are merged by :func:`merged`)."""

    task_rows: list[TaskRow]
    backfilled: dict[str, str]
    counts: dict[str, int]
    waiting: int
    overdue: int
    stopped: int
    oldest_ready: datetime | None
    last_finished: datetime | None
    any_enabled: bool
    paused: list[Any]
    warned: WarnedRows
    seen: list[Any]
    unrun: dict[str, int]


@dataclass(frozen=True)
class SeenWorker:
    """A worker's presence over the shards (the columns of ``scheduler_workers`` that health
    reads)."""

    id: str
    hostname: str
    pid: int
    started_at: datetime
    last_seen_at: datetime
    last_tick_at: datetime | None
    clock_offset: float | None
    stuck_attempts: int | None
    handlers: str | None


def workers(found: Sequence[Found]) -> list[SeenWorker]:
    """Every shard's presence rows, one per worker id, by when they started."""
    by_id: dict[str, SeenWorker] = {}
    for shard in found:
        for w in shard.seen:
            was = by_id.get(w.id)
            if was is None:
                by_id[w.id] = SeenWorker(
                    w.id,
                    w.hostname,
                    w.pid,
                    w.started_at,
                    w.last_seen_at,
                    w.last_tick_at,
                    w.clock_offset,
                    w.stuck_attempts,
                    w.handlers,
                )
                continue
            latest = w if w.last_seen_at > was.last_seen_at else was
            ticks = [t for t in (was.last_tick_at, w.last_tick_at) if t is not None]
            stuck = [s for s in (was.stuck_attempts, w.stuck_attempts) if s is not None]
            by_id[w.id] = SeenWorker(
                w.id,
                latest.hostname,
                latest.pid,
                min(was.started_at, w.started_at),
                latest.last_seen_at,
                max(ticks) if ticks else None,
                latest.clock_offset,
                sum(stuck) if stuck else None,
                was.handlers or w.handlers,
            )
    return sorted(by_id.values(), key=lambda w: (w.started_at, w.id))


def warned(found: Sequence[Found], limit: int | None) -> WarnedRows:
    """The rows of each kind of every shard, by name, the first ``limit`` of them; totals
    added."""
    rows: dict[str, list[Any]] = {}
    total: dict[str, int] = {}
    for kind in KINDS:
        every = sorted((w for f in found for w in f.warned.found[kind]), key=lambda w: w.name)
        rows[kind] = every if limit is None else every[:limit]
        total[kind] = sum(f.warned.total[kind] for f in found)
    return WarnedRows(rows, total)


def merged(found: Sequence[Found], limit: int | None) -> Found:
    """One read's worth of every shard's (see the module's docstring)."""

    def least(values: Sequence[datetime | None]) -> datetime | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    def latest(values: Sequence[datetime | None]) -> datetime | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    paused: dict[str, Any] = {}
    for shard in found:
        for queue in shard.paused:
            paused.setdefault(queue.queue, queue)
    unrun = counts([f.unrun for f in found])
    return Found(
        task_rows=sorted((r for f in found for r in f.task_rows), key=lambda r: r.name),
        backfilled={name: state for f in found for name, state in f.backfilled.items()},
        counts=counts([f.counts for f in found]),
        waiting=sum(f.waiting for f in found),
        overdue=sum(f.overdue for f in found),
        stopped=sum(f.stopped for f in found),
        oldest_ready=least([f.oldest_ready for f in found]),
        last_finished=latest([f.last_finished for f in found]),
        any_enabled=any(f.any_enabled for f in found),
        paused=[paused[name] for name in sorted(paused)],
        warned=warned(found, limit),
        seen=list(workers(found)),
        unrun=dict(sorted(unrun.items())),
    )


def _latest_tick(shard: Found) -> datetime | None:
    ticks = [w.last_tick_at for w in shard.seen if w.last_tick_at is not None]
    return max(ticks) if ticks else None


def last_tick(
    found: Sequence[Found], now: datetime, tick_after: float
) -> tuple[datetime | None, list[int]]:
    """The tick every shard has had since (None if a shard never ticked), and the shards
    whose latest tick is older than ``tick_after`` seconds, or missing."""
    latest = [_latest_tick(shard) for shard in found]
    behind = now - timedelta(seconds=tick_after)
    lagging = [k for k, at in enumerate(latest) if at is None or at <= behind]
    if any(at is None for at in latest):
        return None, lagging
    return min(at for at in latest if at is not None), lagging


def breakdown(found: Sequence[Found]) -> list[dict[str, Any]]:
    """``status``'s ``health.shards``: each shard's own figures, in shard order."""
    return [
        {
            "shard": index,
            "jobs": dict(shard.counts),
            "waiting": shard.waiting,
            "overdue": shard.overdue,
            "stopped": shard.stopped,
            "last_tick_at": iso(_latest_tick(shard)),
        }
        for index, shard in enumerate(found)
    ]


# -- the dashboard's pages over the shards ---------------------------------------------------
def page(found: Sequence[Page], key: str, limit: int, *, newest_first: bool = False) -> Page:
    """One page of every shard's same page (each its first ``limit`` items from the same
    cursor): the first ``limit`` of all by ``key``; more if any shard had more, or if some
    were cut here (the cursor is then the last item's key, as one shard's page gives)."""
    items = sorted(
        (item for one in found for item in one.items),
        key=lambda item: item[key],
        reverse=newest_first,
    )
    more = len(items) > limit or any(one.next_cursor is not None for one in found)
    items = items[:limit]
    return Page(items, items[-1][key] if more and items else None)


def running(found: Sequence[list[dict[str, Any]]], limit: int) -> list[dict[str, Any]]:
    """The Running page's jobs of every shard: the lease ending soonest first, at most
    ``limit``."""
    every = sorted(
        (job for one in found for job in one), key=lambda j: (j["lease_expires_at"], j["id"])
    )
    return every[:limit]


def queue_lines(found: Sequence[list[QueueCounts]]) -> list[QueueCounts]:
    """The Queues page's lines of every shard, one per queue (the counts added), by name."""
    lines: dict[str, QueueCounts] = {}
    for one in found:
        for line in one:
            into = lines.setdefault(line.queue, QueueCounts(line.queue))
            into.ready += line.ready
            into.scheduled += line.scheduled
            into.running += line.running
            into.succeeded += line.succeeded
            into.failed += line.failed
            into.paused = into.paused or line.paused
    return [lines[q] for q in sorted(lines)]


def buckets(found: Sequence[list[Bucket]]) -> list[Bucket]:
    """The chart's bars of every shard (the same bounds in each), the attempts added."""
    return [
        Bucket(
            bars[0].start, bars[0].end, sum(b.succeeded for b in bars), sum(b.failed for b in bars)
        )
        for bars in zip(*found, strict=True)
    ]


def counts(found: Sequence[dict[str, int]]) -> dict[str, int]:
    """Counts by key, added over the shards."""
    total: dict[str, int] = {}
    for one in found:
        for key, count in one.items():
            total[key] = total.get(key, 0) + count
    return total
