"""Limits every worker shares, enforced by the database at claim time.

A claim of jobs under limits is one transaction that decides with its counts (the design is
docs/explanation/limits.md):

1. **Take turns.** It first bumps the ``version`` of every limit's row in
   ``scheduler_limits``, in name order: the row locks make the limited claims of every worker
   and host run one after another (on SQLite ``BEGIN IMMEDIATE`` already does), so each
   counts what the claims before it committed. It is the transaction's first statement, so
   MariaDB's snapshot (REPEATABLE READ: taken at the first plain read) is taken after the
   lock, and PostgreSQL's READ COMMITTED reads each statement's own.
2. **Count.** Per limit and partition: the attempts running (rows of
   ``scheduler_limit_holds`` whose job is ``claimed``) and, for a rate, the attempts started
   in the window ``(now - period, now]``.
3. **Choose.** Ready jobs under the limit, the full partitions left out in the statement (so a
   full partition's backlog never hides the others' jobs); with ``fair``, one job per
   partition in the rotation's order after the partition served last. Each is checked
   against every limit it is under, and counted as it is taken.
4. **Claim and hold.** The conditional ``queued -> claimed`` UPDATE of the chosen ids, and a
   hold per won job and limit, in the same transaction.

A hold needs no release: it stops counting as running when its job leaves ``claimed`` (an
outcome, a retry, a snooze, a takeover that aborts or abandons it), in that transaction.
A takeover that runs the job again keeps it ``claimed``, and so keeps its one place. Holds
that count for nothing any more are deleted now and then (:func:`prune`).

Jobs under no limit never come here: the plain claim leaves them out by handler and queue.

This is the general claim: a limit with ``fair``, SQLite, MariaDB/MySQL. On PostgreSQL through
psycopg without ``fair``, ``limits_pipeline.claim`` takes the same lock and writes the same
holds, but holds the lock for one round trip only (its docstring says how, and why the count
must be a statement of its own after the lock).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    Connection,
    String,
    cast,
    delete,
    func,
    insert,
    literal,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from .._model.job import Job
from .._model.limits import Limit, LimitSet, Places, partition_of, waiting_sentence
from .._model.rules import CLAIMED, QUEUED
from .engine import Store
from .jobs import by_id
from .tables import jobs, limit_holds, limits

_MAX_EXCLUDED = 500  # full partitions left out by the statement; past that, by the check only
_MAX_CANDIDATES = 500


def ensure(store: Store, names: Collection[str]) -> None:
    """Make sure each limit has its row in ``scheduler_limits`` (a worker's start-up)."""
    with store.begin() as conn:
        have = set(
            conn.execute(select(limits.c.name).where(limits.c.name.in_(list(names)))).scalars()
        )
    for name in sorted(set(names) - have):
        try:
            with store.begin() as conn:
                conn.execute(insert(limits).values(name=name, version=0, cursor=None))
        except IntegrityError:
            pass  # another worker made it meanwhile


def part_expression(limit: Limit, dialect: str) -> ColumnElement[Any]:
    """The partition of ``limit`` a job is in, as SQL (for leaving out the full ones and the
    fair rotation; the check of each job is :func:`partition_of`'s)."""
    if limit.per is None:
        return literal("")
    if limit.per == "tenant":
        return func.coalesce(jobs.c.tenant, "")
    if limit.per == "handler":
        return jobs.c.handler
    if limit.per == "queue":
        return jobs.c.queue
    key = limit.payload_key or ""
    value: ColumnElement[Any]
    if dialect == "postgresql":
        value = func.json_extract_path_text(cast(jobs.c.payload, JSON), key)
    elif dialect in ("mysql", "mariadb"):
        value = func.json_unquote(func.json_extract(jobs.c.payload, f'$."{key}"'))
    else:
        value = cast(func.json_extract(jobs.c.payload, f'$."{key}"'), String)
    return func.coalesce(value, "")


@dataclass
class Counts:
    """Running and started attempts per (limit, partition), as one claim found them."""

    running: dict[tuple[str, str], int] = field(default_factory=dict)
    started: dict[tuple[str, str], int] = field(default_factory=dict)

    def room(self, limit: Limit, part: str) -> int:
        """How many more attempts may start in ``part`` now (a large number: no bound)."""
        room = 1 << 30
        key = (limit.name, part)
        if limit.concurrency is not None:
            room = min(room, limit.concurrency - self.running.get(key, 0))
        if limit.rate is not None:
            room = min(room, (limit.rate_count or 0) - self.started.get(key, 0))
        return room

    def rate_full(self, limit: Limit, part: str) -> bool:
        """Whether the rate (not the concurrency) leaves ``part`` no room now."""
        started = self.started.get((limit.name, part), 0)
        return limit.rate is not None and started >= (limit.rate_count or 0)

    def take(self, limit: Limit, part: str) -> None:
        key = (limit.name, part)
        self.running[key] = self.running.get(key, 0) + 1
        self.started[key] = self.started.get(key, 0) + 1


def count(conn: Connection, chosen: Sequence[Limit], now: datetime) -> Counts:
    """The running attempts of ``chosen``'s partitions, and those started in their windows."""
    found = Counts()
    names = [limit.name for limit in chosen]
    running = (
        select(
            limit_holds.c.limit_name,
            limit_holds.c.part,
            func.count(limit_holds.c.job_id.distinct()),
        )
        .select_from(limit_holds.join(jobs, jobs.c.id == limit_holds.c.job_id))
        .where(limit_holds.c.limit_name.in_(names), jobs.c.state == CLAIMED)
        .group_by(limit_holds.c.limit_name, limit_holds.c.part)
    )
    for name, part, n in conn.execute(running):
        found.running[(name, part)] = int(n)
    for limit in chosen:
        if limit.rate is None:
            continue
        since = now - timedelta(seconds=limit.rate_seconds or 0)
        started = (
            select(limit_holds.c.part, func.count())
            .where(limit_holds.c.limit_name == limit.name, limit_holds.c.started_at > since)
            .group_by(limit_holds.c.part)
        )
        for part, n in conn.execute(started):
            found.started[(limit.name, part)] = int(n)
    return found


def covered(limitset: LimitSet, limit: Limit) -> ColumnElement[bool]:
    """Whether a job is under ``limit``, as SQL (its handlers, its queues)."""
    handlers = limitset.handlers_of(limit)
    terms = []
    if handlers:
        terms.append(jobs.c.handler.in_(handlers))
    if limit.queues:
        terms.append(jobs.c.queue.in_(limit.queues))
    if not terms:
        return literal(False)
    return terms[0] if len(terms) == 1 else (terms[0] | terms[1])


def claim(
    store: Store,
    conn: Connection,
    limitset: LimitSet,
    *,
    owner: str,
    now: datetime,
    lease: timedelta,
    want: int,
    queues: Sequence[str],
    handlers: Collection[str] = (),
    exclude: bool = False,
) -> tuple[list[Job], int, bool]:
    """Claim up to ``want`` ready jobs under limits, for ``owner`` (module docstring); returns
    them, how many times a limit held back a job it looked at or had no room at all (a reason
    to look again), and whether a rate did (its window moves on by itself: look again soon)."""
    chosen = sorted(limitset.limits, key=lambda limit: limit.name)
    for limit in chosen:  # 1. take turns (the transaction's first statements)
        conn.execute(
            update(limits).where(limits.c.name == limit.name).values(version=limits.c.version + 1)
        )
    counts = count(conn, chosen, now)  # 2.
    dialect = conn.dialect.name
    taken: dict[int, tuple[Job, list[tuple[Limit, str]]]] = {}
    held = 0
    by_rate = False
    cursors: dict[str, str] = {}
    for limit in chosen:  # 3.
        if len(taken) >= want:
            break
        part = part_expression(limit, dialect)
        ready = [
            jobs.c.state == QUEUED,
            jobs.c.run_at <= now,
            jobs.c.queue.in_(list(queues)),
            covered(limitset, limit),
        ]
        if handlers:
            names = sorted(handlers)
            ready.append(jobs.c.handler.not_in(names) if exclude else jobs.c.handler.in_(names))
        if taken:
            ready.append(jobs.c.id.not_in(list(taken)))
        if limit.per is None:
            if counts.room(limit, "") <= 0:
                held += 1  # full: room may come at any moment (an outcome, the window)
                by_rate = by_rate or counts.rate_full(limit, "")
                continue
        else:
            full = sorted(
                p
                for (name, p) in {**counts.running, **counts.started}
                if name == limit.name and counts.room(limit, p) <= 0
            )
            if full:
                held += 1
                by_rate = by_rate or any(counts.rate_full(limit, p) for p in full)
            if full and len(full) <= _MAX_EXCLUDED:
                ready.append(part.not_in(full))
        space = want - len(taken)
        if limit.fair:
            rows = _rotation(conn, limit, part, ready, space)
        else:
            stmt = (
                select(jobs)
                .where(*ready)
                .order_by(jobs.c.priority, jobs.c.run_at, jobs.c.id)
                .limit(min(space * 4 + 16, _MAX_CANDIDATES))
            )
            rows = [Job.from_row(r) for r in conn.execute(stmt)]
        for job in rows:
            if len(taken) >= want:
                break
            under = limitset.of(job.handler, job.queue)
            parts = [
                (
                    each,
                    partition_of(
                        each,
                        tenant=job.tenant,
                        handler=job.handler,
                        queue=job.queue,
                        payload=job.payload,
                    ),
                )
                for each in under
            ]
            if any(counts.room(each, p) <= 0 for each, p in parts):
                held += 1
                by_rate = by_rate or any(counts.rate_full(each, p) for each, p in parts)
                continue
            for each, p in parts:
                counts.take(each, p)
            taken[job.id] = (job, parts)
            if limit.fair:
                cursors[limit.name] = partition_of(
                    limit,
                    tenant=job.tenant,
                    handler=job.handler,
                    queue=job.queue,
                    payload=job.payload,
                )
    if not taken:
        return [], held, by_rate
    won = _take(store, conn, list(taken), owner=owner, now=now, lease=lease)  # 4.
    holds = [
        {"limit_name": each.name, "part": p, "job_id": job.id, "started_at": now}
        for job in won
        for each, p in taken[job.id][1]
    ]
    if holds:
        conn.execute(insert(limit_holds), holds)
    for name, cursor in cursors.items():
        conn.execute(update(limits).where(limits.c.name == name).values(cursor=cursor))
    return sorted(won, key=lambda j: (j.priority, j.run_at, j.id)), held, by_rate


def hand_on(
    store: Store,
    conn: Connection,
    limitset: LimitSet,
    ended: Mapping[int, Places],
    *,
    owner: str,
    now: datetime,
    lease: timedelta,
    queues: Sequence[str],
) -> list[Job]:
    """In the transaction that ends attempts holding places under limits that count only
    running attempts (``ended``: their places, by job; ``_model.limits.handed_on``), delete
    their holds (they count nothing once the job left ``claimed``, and the running count's
    join stays as small as what runs) and, with ``queues``, claim for ``owner`` as many ready
    jobs into the same places: each under exactly those limits, in the same partitions. The
    running count of every partition stays what it was, so no lock is taken and nothing is
    counted. Returns the jobs won, their holds written. (A batch of successes on PostgreSQL
    does all of it in the statement that writes their ends: ``outcomes.succeed``.)"""
    if not ended:
        return []
    names = sorted({name for places in ended.values() for name, _ in places})
    conn.execute(
        delete(limit_holds).where(
            limit_holds.c.limit_name.in_(names), limit_holds.c.job_id.in_(sorted(ended))
        )
    )
    wanted: dict[Places, int] = {}
    for places in ended.values():
        wanted[places] = wanted.get(places, 0) + 1
    won: list[Job] = []
    for places, n in sorted(wanted.items()) if queues else ():
        pick = fitting(limitset, places, conn.dialect.name, now=now, queues=queues).limit(n)
        if store.caps.skip_locked:
            pick = pick.with_for_update(skip_locked=True)
        ids = list(conn.execute(pick).scalars())
        taken = _take(store, conn, ids, owner=owner, now=now, lease=lease) if ids else []
        holds = [
            {"limit_name": name, "part": part, "job_id": job.id, "started_at": now}
            for job in taken
            for name, part in places
        ]
        if holds:
            conn.execute(insert(limit_holds), holds)
        won += taken
    return sorted(won, key=lambda j: (j.priority, j.run_at, j.id))


def fitting(
    limitset: LimitSet, places: Places, dialect: str, *, now: Any, queues: Sequence[str]
) -> Select[Any]:
    """The ready jobs under exactly the limits of ``places``, each in its partition there, in
    the claim's order (``now``: the instant, or a bound parameter for it)."""
    parts = dict(places)
    ready = [jobs.c.state == QUEUED, jobs.c.run_at <= now, jobs.c.queue.in_(list(queues))]
    for limit in limitset.limits:
        under = covered(limitset, limit)
        if limit.name not in parts:
            ready.append(not_(under))
            continue
        ready.append(under)
        if limit.per is not None:
            ready.append(part_expression(limit, dialect) == parts[limit.name])
    return select(jobs.c.id).where(*ready).order_by(jobs.c.priority, jobs.c.run_at, jobs.c.id)


def any_ready(
    conn: Connection,
    limitset: LimitSet,
    *,
    now: datetime,
    queues: Sequence[str],
    handlers: Collection[str] = (),
    exclude: bool = False,
) -> bool:
    """Whether any job under a limit is ready in ``queues``: one read, so that a worker with
    nothing to do under its limits takes no lock and counts nothing."""
    stmt = _ready(limitset, now=now, queues=queues, handlers=handlers, exclude=exclude)
    return conn.execute(stmt.limit(1)).first() is not None


def ready_probe(limitset: LimitSet, *, now: datetime, queues: Sequence[str]) -> Any:
    """:func:`any_ready` as an ``EXISTS`` expression, for a statement the worker sends anyway
    to carry (its presence write's ``RETURNING``): an idle worker then looks under its limits
    at no statement of its own."""
    return _ready(limitset, now=now, queues=queues).exists()


def _ready(
    limitset: LimitSet,
    *,
    now: datetime,
    queues: Sequence[str],
    handlers: Collection[str] = (),
    exclude: bool = False,
) -> Any:
    under = [covered(limitset, limit) for limit in limitset.limits]
    stmt = select(jobs.c.id).where(
        jobs.c.state == QUEUED,
        jobs.c.run_at <= now,
        jobs.c.queue.in_(list(queues)),
        or_(*under),
    )
    if handlers:
        names = sorted(handlers)
        stmt = stmt.where(jobs.c.handler.not_in(names) if exclude else jobs.c.handler.in_(names))
    return stmt


def _rotation(
    conn: Connection, limit: Limit, part: ColumnElement[Any], ready: list[Any], space: int
) -> list[Job]:
    """``fair``: the first ready job (by id) of up to ``space`` partitions, in the order of the
    rotation: the partitions after the one served last, then from the start again."""
    cursor = conn.execute(select(limits.c.cursor).where(limits.c.name == limit.name)).scalar()
    label = part.label("part")

    def first_of_each(*where: Any, limit: int) -> list[tuple[str, int]]:
        # The partition's condition is the WHERE's (MariaDB's HAVING cannot name the
        # grouped expression again): the same rows, filtered before they are grouped.
        grouped = (
            select(label, func.min(jobs.c.id).label("id"))
            .where(*ready, *where)
            .group_by(part)
            .order_by(part)
            .limit(limit)
        )
        return [(str(p), int(i)) for p, i in conn.execute(grouped)]

    picked: list[tuple[str, int]] = []
    if cursor is not None:
        picked = first_of_each(part > cursor, limit=space)
    if len(picked) < space:
        seen = [p for p, _ in picked]
        picked += first_of_each(*([part.not_in(seen)] if seen else []), limit=space - len(picked))
    if not picked:
        return []
    order = {job_id: index for index, (_, job_id) in enumerate(picked)}
    found = [Job.from_row(r) for r in conn.execute(select(jobs).where(jobs.c.id.in_(list(order))))]
    return sorted(found, key=lambda job: order[job.id])


@functools.cache
def claim_values() -> dict[str, Any]:
    from sqlalchemy import bindparam

    return {
        "state": CLAIMED,
        "lease_owner": bindparam("p_owner"),
        "lease_expires_at": bindparam("p_until"),
        "started_at": bindparam("p_now"),
        "attempts": jobs.c.attempts + 1,
        "fence": jobs.c.fence + 1,  # as every claim (jobs._claim_statements)
    }


def _take(
    store: Store, conn: Connection, ids: list[int], *, owner: str, now: datetime, lease: timedelta
) -> list[Job]:
    """``queued -> claimed`` of ``ids`` (still queued: an operator's cancel may have come
    first); returns the jobs won."""
    from sqlalchemy import bindparam

    params = {"p_owner": owner, "p_until": now + lease, "p_now": now, "p_ids": sorted(ids)}
    stmt = by_id(
        update(jobs)
        .where(jobs.c.id.in_(bindparam("p_ids", expanding=True)), jobs.c.state == QUEUED)
        .values(**claim_values())
    )
    if store.caps.claim_returning:
        return [Job.from_row(r) for r in conn.execute(stmt.returning(*jobs.c), params)]
    conn.execute(stmt, params)
    won = select(jobs).where(
        jobs.c.id.in_(sorted(ids)), jobs.c.state == CLAIMED, jobs.c.lease_owner == owner
    )
    return [Job.from_row(r) for r in conn.execute(won)]


PRUNE_MARGIN = timedelta(seconds=5)
"""Holds are kept this much longer than their window: every worker counts by its own clock
(the database's, as each process measured it), and a hold one worker deletes must already be
out of every other worker's window."""


def prune(conn: Connection, limitset: LimitSet, now: datetime) -> int:
    """Delete the holds that count for nothing any more: past their limit's rate window (or
    any, without a rate) by ``PRUNE_MARGIN`` and whose job is not ``claimed``. Returns how
    many."""
    deleted = 0
    running = select(jobs.c.id).where(jobs.c.state == CLAIMED)
    for limit in limitset.limits:
        keep = timedelta(seconds=limit.rate_seconds or 0) + PRUNE_MARGIN
        stmt = delete(limit_holds).where(
            limit_holds.c.limit_name == limit.name,
            limit_holds.c.started_at <= now - keep,
            limit_holds.c.job_id.not_in(running),
        )
        deleted += int(conn.execute(stmt).rowcount)
    return deleted


def waiting_for(
    conn: Connection, limitset: LimitSet, found: Sequence[Job], now: datetime
) -> dict[int, str]:
    """What each ready ``queued`` job of ``found`` that a limit holds waits for ("limit
    crm-api: 10 of 10 running"), by job id; the others are left out. One count for all."""
    ready = [
        (job, under)
        for job in found
        if job.state == QUEUED
        and job.run_at <= now
        and (under := limitset.of(job.handler, job.queue))
    ]
    if not ready:
        return {}
    chosen = {limit.name: limit for _, under in ready for limit in under}
    counts = count(conn, list(chosen.values()), now)
    sentences: dict[int, str] = {}
    for job, under in ready:
        for limit in under:
            part = partition_of(
                limit, tenant=job.tenant, handler=job.handler, queue=job.queue, payload=job.payload
            )
            key = (limit.name, part)
            running, started = counts.running.get(key, 0), counts.started.get(key, 0)
            sentence = waiting_sentence(limit, running, started)
            if sentence is not None:
                sentences[job.id] = sentence
                break
    return sentences


def gauges(conn: Connection, limitset: LimitSet, now: datetime) -> dict[str, tuple[int, int]]:
    """Per limit: (attempts running under it, ready jobs under it still queued)."""
    found: dict[str, tuple[int, int]] = {}
    counts = count(conn, list(limitset.limits), now)
    for limit in limitset.limits:
        in_use = sum(n for (name, _), n in counts.running.items() if name == limit.name)
        waiting = select(func.count()).where(
            jobs.c.state == QUEUED, jobs.c.run_at <= now, covered(limitset, limit)
        )
        found[limit.name] = (in_use, int(conn.execute(waiting).scalar_one()))
    return found
