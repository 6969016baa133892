"""Successes in one statement (PostgreSQL): the jobs' ends under their leases, their run
history, and, under a limit that counts only running attempts, their places handed on to the
next ready jobs (``limits.hand_on``), written by one statement of data-modifying ``WITH``s.

A batch of outcomes otherwise takes a statement for the successes, one for the history and
one for the hand-on, each a round trip inside ``BEGIN`` … ``COMMIT``. One statement is atomic
by itself, so where the driver can run it in autocommit (psycopg, not behind a transaction
pooler: ``Store.write_at_once``) a batch of successes is one round trip.

The statement's parts all see the snapshot taken when it starts: the jobs it ends are
``claimed`` in it, and the jobs it hands places to are ``queued`` in it, so the two never meet
(a row is never changed twice by one statement), and a claim that counts sees the end and the
start together or neither.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Connection,
    DateTime,
    Select,
    any_,
    bindparam,
    cast,
    delete,
    func,
    insert,
    literal,
    null,
    select,
    union_all,
    update,
)

from .._model.job import Job
from .._model.limits import LimitSet, Places
from .._model.rules import QUEUED, SUCCEEDED
from .._model.time import as_utc
from .driver import Prepared, PreparedSet
from .jobs import Finish, held_guard, released
from .limits import claim_values, fitting
from .tables import jobs, limit_holds, runs


def _naive(value: datetime | None) -> datetime | None:
    return None if value is None else as_utc(value).replace(tzinfo=None)


_IDS = ARRAY(BigInteger)


@functools.cache
def _ends() -> tuple[Any, Any]:
    """The ends under the leases (``done``: their ids, attempts and slots) and their history
    (``history``), as CTEs with bound parameters, built once: building a statement costs more
    than running it."""
    done = (
        update(jobs)
        .where(jobs.c.id == any_(cast(bindparam("p_ids"), _IDS)), held_guard())
        .values(
            state=SUCCEEDED,
            finished_at=bindparam("p_now"),
            dedupe_key=None,
            last_error_code=None,
            **released(),
        )
        .returning(jobs.c.id, jobs.c.attempts, jobs.c.slot)
        .cte("done")
    )
    starts = (
        func.unnest(
            cast(bindparam("p_ids_again"), _IDS), cast(bindparam("p_starts"), ARRAY(DateTime()))
        )
        .table_valued("id", "started_at")
        .render_derived(name="starts")
    )
    history = (
        insert(runs)
        .from_select(
            [
                "job_id",
                "attempt",
                "started_at",
                "finished_at",
                "outcome",
                "error_code",
                "worker",
                "slot",
                "error_message",
            ],
            select(
                done.c.id,
                done.c.attempts,
                starts.c.started_at,
                bindparam("p_finished", type_=runs.c.finished_at.type),
                literal(str(SUCCEEDED), type_=runs.c.outcome.type),
                null(),
                bindparam("p_worker", type_=runs.c.worker.type),
                done.c.slot,
                null(),
            ).select_from(done.join(starts, starts.c.id == done.c.id)),
        )
        .cte("history")
    )
    return done, history


@functools.cache
def _plain() -> Select[Any]:
    done, history = _ends()
    return select(done.c.id).add_cte(history)


# On the driver's cursor (``driver.Prepared``): a batch of successes is one statement, and
# ``Connection.execute``'s own Python cost as much as the rest of writing a small batch.
_PLAIN = PreparedSet(lambda _dialect: _plain(), functools.partial(Prepared, literals=True))


def handing_on(limitset: LimitSet, places: Places, queues: tuple[str, ...]) -> Select[Any]:
    """The statement that also hands the places of the jobs of ``p_placed`` that ended to as
    many ready jobs in ``queues`` (``limits.fitting``): the ended ones' holds deleted, the
    next ones claimed for ``p_owner`` until ``p_until`` with their holds. Its rows: a handed
    job's columns, or an ended job's id (``ended_id``). Build it once per ``places`` and
    ``queues`` (:class:`Statements`)."""
    done, history = _ends()
    mine = done.c.id == any_(cast(bindparam("p_placed"), _IDS))
    names = sorted(name for name, _ in places)
    gone = delete(limit_holds).where(
        limit_holds.c.limit_name.in_(names),
        limit_holds.c.job_id.in_(select(done.c.id).where(mine)),
    )
    room = select(func.count()).select_from(done).where(mine).scalar_subquery()
    now = bindparam("p_now", type_=jobs.c.run_at.type)
    pick = fitting(limitset, places, "postgresql", now=now, queues=queues)
    ready = pick.limit(room).with_for_update(skip_locked=True).cte("handed_ready")
    won = (
        update(jobs)
        .where(jobs.c.id.in_(select(ready.c.id)), jobs.c.state == QUEUED)
        .values(**claim_values())
        .returning(*jobs.c)
        .cte("handed_won")
    )
    start = bindparam("p_started", type_=limit_holds.c.started_at.type)
    holds = [
        select(literal(name).label("n"), literal(part).label("p"), won.c.id, start)
        for name, part in places
    ]
    held = (
        insert(limit_holds)
        .from_select(
            ["limit_name", "part", "job_id", "started_at"],
            holds[0] if len(holds) == 1 else union_all(*holds),
        )
        .cte("handed_held")
    )
    both = union_all(
        select(*won.c, null().label("ended_id")),
        select(*[cast(null(), c.type).label(c.name) for c in jobs.c], done.c.id),
    )
    statement = select(both.subquery()).add_cte(history).add_cte(gone.cte("handed_gone"))
    return statement.add_cte(held)


class Statements:
    """One runner's hand-on statements, built once per set of places and queues."""

    def __init__(self, limitset: LimitSet) -> None:
        self.limitset = limitset
        self._built: dict[tuple[Places, tuple[str, ...]], Select[Any]] = {}

    def get(self, places: Places, queues: tuple[str, ...]) -> Select[Any]:
        key = (places, queues)
        found = self._built.get(key)
        if found is None:
            if len(self._built) > 256:  # many partitions: keep the recent ones
                self._built.clear()
            found = self._built[key] = handing_on(self.limitset, places, queues)
        return found


def succeed(
    conn: Connection,
    items: Sequence[Finish],
    *,
    owner: str,
    now: datetime,
    lease: timedelta,
    hand_on: Select[Any] | None = None,
    placed: Sequence[int] = (),
) -> tuple[list[Job | None], list[Job]]:
    """End ``items`` (all successes) under ``owner``'s leases and append their history; with
    ``hand_on`` (:meth:`Statements.get` for the places the jobs ``placed`` among them hold),
    claim as many ready jobs as those of ``placed`` that ended, into the same places, for
    ``owner``. Returns each item's job as it now stands (None: its lease was lost) and the
    jobs claimed."""
    ids = [f.job.id for f in items]
    params: dict[str, Any] = {
        "p_ids": ids,
        "p_ids_again": ids,
        "p_starts": [_naive(f.started_at) for f in items],
        "p_owner": owner,
        "p_worker": owner,
        "p_now": now,
        "p_finished": now,
    }
    if hand_on is None or not placed:
        cursor = _PLAIN.on(conn).run(conn, params)
        try:
            found = {row[0] for row in cursor.fetchall()}
        finally:
            cursor.close()
        return _views(items, found, now), []
    params.update({"p_placed": list(placed), "p_until": now + lease, "p_started": now})
    ended: set[int] = set()
    handed: list[Job] = []
    for row in conn.execute(hand_on, params):
        if row.ended_id is not None:
            ended.add(row.ended_id)
        else:
            handed.append(Job.from_row(row))
    handed.sort(key=lambda j: (j.priority, j.run_at, j.id))
    return _views(items, ended, now), handed


def _views(items: Sequence[Finish], ended: set[int], now: datetime) -> list[Job | None]:
    return [f.job.replaced(**f.values(now)) if f.job.id in ended else None for f in items]
