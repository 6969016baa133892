"""The durable job queue's SQL: enqueue, claim, takeover, heartbeat, finish, purge.

Every racy transition is one conditional UPDATE whose row count decides the winner: a claim
moves ``queued -> claimed`` only if still ``queued``; every later transition requires the same
lease owner and an unexpired lease (a takeover requires the *old* owner and expiry instead).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    delete,
    false,
    func,
    insert,
    select,
    tuple_,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.dml import Update
from sqlalchemy.sql.elements import BindParameter

from .._errors import JobStateError, SchedulerError
from .._model import defaults as _limits
from .._model.job import Job
from .._model.rules import ABORTED, CLAIMED, QUEUED, SUCCEEDED
from . import bulk as _bulk
from . import partitions as _partitions
from . import wakeup as _wakeup
from .driver import Prepared, PreparedSet
from .engine import Store, skip_locked
from .retry import retry
from .tables import decisions, jobs, rows, runs


def new_job_values(
    *,
    handler: str,
    payload: str,
    now: datetime,
    run_at: datetime | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int = 3,
    dedupe_key: str | None = None,
    task_name: str | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """A new job's column values. Columns added by later revisions (``tenant``) appear only
    when set: the migration tests insert these values at older revisions."""
    values = {
        "handler": handler,
        "payload": payload,
        "queue": queue,
        "priority": priority,
        "run_at": run_at or now,
        "state": QUEUED,
        "attempts": 0,
        "max_attempts": max_attempts,
        "dedupe_key": dedupe_key,
        "task_name": task_name,
        "created_at": now,
    }
    if tenant is not None:
        values["tenant"] = tenant
    return values


_U = TypeVar("_U", bound=Update)


def by_id(statement: _U) -> _U:
    """An UPDATE of jobs chosen by id, made to find them through the primary key on MariaDB and
    MySQL. Left to itself, their optimiser may scan a state index instead (``state = 'claimed'``
    on the lease index, ``state = 'queued'`` on the ready index) when that range looks as small,
    and then locks every entry it scans and the gaps between them: a finishing worker blocked
    the others' claims, and the claims deadlocked (issue 18). By the key, it locks its rows."""
    for dialect in ("mysql", "mariadb"):
        statement = statement.with_hint("FORCE INDEX (PRIMARY)", dialect_name=dialect)
    return statement


# The hot statements are built once with bound parameters: building a statement costs more
# than running it on SQLite. Parameters are named p_* where a SET clause names the column.
_P = bindparam
_INSERT_JOB = insert(jobs)
_INSERT_NOTIFYING = insert(jobs).returning(jobs.c.id, _wakeup.NOTIFY_COLUMN)
_INSERT_RUNS = insert(runs)
_BY_ID = select(jobs).where(jobs.c.id == _P("p_id"))
_BY_KEY = select(jobs.c.id).where(jobs.c.dedupe_key == _P("p_key"))
# MariaDB/MySQL after a duplicate key: a locking read sees the latest committed holder.
_BY_KEY_LOCKED = _BY_KEY.with_for_update(read=True)
# The guard of every transition after a claim: same owner, unexpired lease. Its state and
# lease are written so that no index can serve them (COALESCE of a column that is never
# NULL here, of a comparison that is false for NULL): the statements it guards choose their
# jobs by id, and PostgreSQL, which has no index hints (by_id is MariaDB's), took the lease
# index (state = 'claimed' AND lease_expires_at > now) instead of the primary key. That
# range holds an entry per claim made within a lease, dead ones included: while a
# transaction held the MVCC horizon, each outcome and heartbeat walked thousands (issue 25).
_HELD = and_(
    func.coalesce(jobs.c.state, "") == CLAIMED,
    jobs.c.lease_owner == _P("p_owner"),
    func.coalesce(jobs.c.lease_expires_at > _P("p_now"), false()),
)
_IDS: BindParameter[Any] = _P("p_ids", expanding=True)
_EXTEND = by_id(
    update(jobs).where(jobs.c.id.in_(_IDS), _HELD).values(lease_expires_at=_P("p_until"))
)
_RELEASE = {"lease_owner": None, "lease_expires_at": None}


def held_guard() -> Any:
    """The guard of every transition after a claim (``p_owner``'s unexpired lease at
    ``p_now``), for statements built elsewhere in the store."""
    return _HELD


def released() -> dict[str, Any]:
    """The values that end a lease."""
    return dict(_RELEASE)


_SUCCEED_MANY = by_id(
    update(jobs)
    .where(jobs.c.id.in_(_IDS), _HELD)
    .values(
        state=SUCCEEDED, finished_at=_P("p_now"), dedupe_key=None, last_error_code=None, **_RELEASE
    )
    .returning(jobs.c.id)
)
_END_ONE = by_id(
    update(jobs)
    .where(jobs.c.id == _P("p_id"), _HELD)
    .values(
        state=_P("p_state"),
        finished_at=_P("p_now"),
        dedupe_key=None,
        last_error_code=_P("p_code"),
        **_RELEASE,
    )
)
_RETRY_ONE = by_id(
    update(jobs)
    .where(jobs.c.id == _P("p_id"), _HELD)
    .values(state=QUEUED, run_at=_P("p_retry_at"), last_error_code=_P("p_code"), **_RELEASE)
)


def insert_job(conn: Connection, values: dict[str, Any]) -> int:
    result = conn.execute(_INSERT_JOB, values)
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def enqueue(store: Store, values: dict[str, Any]) -> int:
    """Insert a job in a transaction of our own (run again after a deadlock); with a dedupe
    key, return the active job holding that key if any.

    Without a dedupe key the job is one statement (the ``INSERT``, which carries its wake-up on
    PostgreSQL; on Citus a query around it does): through psycopg, where no transaction
    pooler needs each transaction to carry its settings, that statement runs in the driver's
    autocommit, its own transaction, in one round trip instead of three (``BEGIN``,
    ``INSERT``, ``COMMIT``)."""
    if values.get("dedupe_key") is None and store.caps.autocommit_reads:
        return retry("enqueue", lambda: _enqueue_alone(store, values))

    def attempt() -> int:
        with store.begin() as conn:
            return enqueue_on(store, conn, values)

    return retry("enqueue", attempt)


def _enqueue_alone(store: Store, values: dict[str, Any]) -> int:
    """:func:`enqueue_on` of a job without a dedupe key, its one statement in the driver's
    autocommit (psycopg). SQLAlchemy's transaction still begins and commits around it, so
    what the statement announced to this process's workers goes out after the commit, as
    after any transaction's.

    Where the ``INSERT`` carries its wake-up (PostgreSQL, not Citus), it runs straight on the
    driver's cursor (``_store/driver.py``: compiled once per set of columns, each value still
    converted by its column's type, the cursor events still fired): ``Connection.execute``'s
    own Python cost about as much as the rest of an enqueue."""
    with store.engine.connect() as conn:
        driver: Any = conn.connection.driver_connection
        driver.autocommit = True  # psycopg: a local flag, no round trip
        try:
            if store.caps.citus or not _wakeup.folds(store, conn):
                job_id = enqueue_on(store, conn, values)
            else:
                prepared = _insert_notifying(tuple(values)).on(conn)
                cursor = prepared.run(conn, _notifying(values))
                try:
                    found = cursor.fetchone()
                finally:
                    cursor.close()
                assert found is not None
                # Committed already, outside SQLAlchemy's transaction (none began): this
                # process's workers are woken now.
                _wakeup.announced(store, conn, [(values["queue"], values["run_at"])])
                job_id = int(found[0])
            conn.commit()  # ends SQLAlchemy's transaction; the server has committed already
            return job_id
        finally:
            if not conn.invalidated:
                driver.autocommit = False


@functools.lru_cache(maxsize=64)  # callers' sets of columns are few; never grow without end
def _insert_notifying(columns: tuple[str, ...]) -> PreparedSet[Prepared]:
    """:data:`_INSERT_NOTIFYING` of ``columns`` (and ``p_wakeup``) on the driver's cursor,
    compiled once per dialect (:class:`~.driver.PreparedSet`)."""
    written = {name: bindparam(name, type_=jobs.c[name].type) for name in columns}
    statement = insert(jobs).values(written).returning(jobs.c.id, _wakeup.NOTIFY_COLUMN)
    return PreparedSet(lambda _dialect: statement, Prepared)


def enqueue_on(store: Store, conn: Connection, values: dict[str, Any]) -> int:
    """Insert one job on ``conn``, in the transaction it is in (ours, or the caller's: then
    nothing here commits, retries, or rolls the transaction back); returns its id, or with a
    dedupe key the id of the active job holding that key if there is one.

    The one place a single job is written by ``enqueue`` (the wake-up of a ready job goes here).

    A key that another open transaction has just inserted makes this INSERT wait for that
    transaction's end (the unique index's lock): if it commits, its job's id is returned; if it
    rolls back, this job is inserted. On PostgreSQL and SQLite the INSERT says ``ON CONFLICT DO
    NOTHING``, so a conflict never aborts the caller's transaction; on MariaDB/MySQL a duplicate
    key rolls back that statement alone, and the holder is read with a locking read (which sees
    the latest committed row under REPEATABLE READ too).
    """
    key = values.get("dedupe_key")
    ready = [(values["queue"], values["run_at"])]
    fold = _wakeup.folds(store, conn)  # PostgreSQL: the NOTIFY rides in the INSERT
    if key is None:
        if not fold:
            job_id = insert_job(conn, values)
            _wakeup.announce(store, conn, ready)
            return job_id
        citus = store.caps.citus
        notifying = _citus_notifying(tuple(values), False) if citus else _INSERT_NOTIFYING
        found = conn.execute(notifying, _notifying(values)).first()
        assert found is not None
        _wakeup.announced(store, conn, ready)
        return int(found[0])
    upsert = _bulk.upsert_statement(conn.dialect)
    for _ in range(_DEDUPE_ROUNDS):
        if upsert is not None:
            if fold:
                if store.caps.citus:
                    statement = _citus_notifying(tuple(values), True)
                else:
                    statement = _upsert_notifying(conn.dialect.name)
                row = conn.execute(statement, _notifying(values))
                found = row.scalar()
            else:
                found = conn.execute(upsert, values).scalar()
            if found is not None:  # inserted (a conflict returns no row, and notifies nobody)
                if fold:
                    _wakeup.announced(store, conn, ready)
                else:
                    _wakeup.announce(store, conn, ready)
                return int(found)
            existing = conn.execute(_BY_KEY, {"p_key": key}).scalar()
        else:
            existing = conn.execute(_BY_KEY, {"p_key": key}).scalar()
            if existing is None:
                try:
                    job_id = insert_job(conn, values)
                except IntegrityError:
                    existing = conn.execute(_BY_KEY_LOCKED, {"p_key": key}).scalar()
                else:
                    _wakeup.announce(store, conn, ready)
                    return job_id
        if existing is not None:
            return int(existing)
        # The holder finished (its key released) between the INSERT and the read: again.
    raise SchedulerError(f"could not enqueue with dedupe key {key!r}: it kept changing hands")


def _notifying(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the ``p_wakeup`` parameter of :data:`_wakeup.NOTIFY_COLUMN`."""
    payload = _wakeup.notify_payload(values["queue"], values["run_at"], values["created_at"])
    return {**values, "p_wakeup": payload}


@functools.cache
def _upsert_notifying(dialect_name: str) -> Any:
    """PostgreSQL's dedupe-key INSERT that also notifies the workers of the job it inserted."""
    return _bulk.upsert_by_name(dialect_name).returning(_wakeup.NOTIFY_COLUMN)


@functools.cache
def _citus_notifying(columns: tuple[str, ...], dedupe: bool) -> Any:
    """Citus: the enqueue's INSERT of ``columns`` (with a dedupe key: its ``ON CONFLICT DO
    NOTHING``) as a CTE, and its id and :data:`_wakeup.NOTIFY_COLUMN` selected from it.

    Citus refuses ``pg_notify`` in the ``RETURNING`` of a write to a distributed table (it
    would run on the worker node, where nobody listens). Written this way the INSERT is routed
    to the node that holds the schema's tables, and the query around it runs on the
    coordinator, where the workers listen: still one statement, its own transaction, and no
    notification for a conflict (the CTE returns no row)."""
    base = _bulk.upsert_by_name("postgresql") if dedupe else insert(jobs).returning(jobs.c.id)
    written = {name: bindparam(name, type_=jobs.c[name].type) for name in columns}
    inserted = base.values(written).cte("inserted")
    return select(inserted.c.id, _wakeup.NOTIFY_COLUMN)


def enqueue_many_on(store: Store, conn: Connection, items: Sequence[dict[str, Any]]) -> list[int]:
    """Insert jobs on ``conn``, in the transaction it is in, one statement per chunk; returns
    their ids in ``items``' order (for a dedupe key: the active job's, also when an earlier
    item of ``items`` has the same key), and announces them to the workers (one wake-up for
    the whole call, at commit). The one place jobs are written in bulk."""
    ids = _bulk.insert_many(conn, items, citus=store.caps.citus)
    _wakeup.announce(store, conn, [(item["queue"], item["run_at"]) for item in items])
    return ids


_DEDUPE_ROUNDS = 5


def get_job(conn: Connection, job_id: int) -> Job | None:
    row = conn.execute(_BY_ID, {"p_id": job_id}).first()
    return Job.from_row(row) if row is not None else None


#: Where a claim left off in the claim's order: (priority, run_at, id) of the last job it took.
ClaimKey = tuple[int, datetime, int]


@functools.lru_cache(maxsize=32)
def _claim_statements(
    skip_locked: bool,
    returning: bool,
    by_handler: str | None = None,
    after: bool = False,
    unlimited: bool = False,
) -> tuple[Any, ...]:
    """The claim for one engine's capabilities: (statement) or (select, update, reselect).

    ``by_handler`` ``"in"`` / ``"not_in"``: only the jobs of the handlers ``p_handlers``, or
    only the others' (the worker claims its async and its sync handlers' jobs apart).
    ``after``: only the jobs past ``(p_after_priority, p_after_at, p_after_id)`` in the
    claim's order, a row comparison the ready index is range-scanned from (PostgreSQL): the
    entries before it, left by jobs claimed since vacuum last ran, are not walked (see
    :class:`~scheduler._store.cursor.ClaimCursor`).
    ``unlimited``: not the jobs of the handlers ``p_limited`` (those under a limit are claimed
    by ``scheduler/_store/limits.py``)."""
    ready = (
        select(jobs.c.id)
        .where(
            jobs.c.state == QUEUED,
            jobs.c.run_at <= _P("p_now"),
            jobs.c.queue.in_(_P("p_queues", expanding=True)),
        )
        .order_by(jobs.c.priority, jobs.c.run_at, jobs.c.id)
        .limit(_P("p_limit", type_=Integer))
    )
    if after:
        ready = ready.where(
            tuple_(jobs.c.priority, jobs.c.run_at, jobs.c.id)
            > tuple_(
                _P("p_after_priority", type_=jobs.c.priority.type),
                _P("p_after_at", type_=jobs.c.run_at.type),
                _P("p_after_id", type_=jobs.c.id.type),
            )
        )
    if by_handler is not None:
        names: BindParameter[Any] = _P("p_handlers", expanding=True)
        ready = ready.where(
            jobs.c.handler.not_in(names) if by_handler == "not_in" else jobs.c.handler.in_(names)
        )
    if unlimited:
        ready = ready.where(jobs.c.handler.not_in(_P("p_limited", expanding=True)))
    if skip_locked:
        ready = ready.with_for_update(skip_locked=True)
    claim_values = {
        "state": CLAIMED,
        "lease_owner": _P("p_owner"),
        "lease_expires_at": _P("p_until"),
        "started_at": _P("p_now"),
        "attempts": jobs.c.attempts + 1,
        "fence": jobs.c.fence + 1,
    }
    if returning:
        # Materialized, the locking SELECT runs once. As a plain IN-subquery PostgreSQL may plan
        # a nested-loop semi-join that reruns it per outer row, each run skipping the rows this
        # statement already locked: claim(limit=1) then claimed every ready job.
        # Its recheck of the state is written as _HELD's is, so that no index serves it: with
        # `state = 'queued'` PostgreSQL could take the ready index for the UPDATE's side of
        # the join (its statistics saying few jobs are queued), and that walked every entry
        # of the range, dead ones included, past the cursor's start (issue 25).
        picked = ready.cte("ready").prefix_with("MATERIALIZED")
        return (
            update(jobs)
            .where(jobs.c.id.in_(select(picked.c.id)), func.coalesce(jobs.c.state, "") == QUEUED)
            .values(**claim_values)
            .returning(*jobs.c),
        )
    # Portable path (MariaDB/MySQL: no UPDATE ... RETURNING, no LIMIT in IN-subqueries).
    # By the primary key, in id order (the range scan's): every claimer locks in one order.
    take = by_id(
        update(jobs).where(jobs.c.id.in_(_IDS), jobs.c.state == QUEUED).values(**claim_values)
    )
    won = (
        select(jobs)
        .where(jobs.c.id.in_(_IDS), jobs.c.state == CLAIMED, jobs.c.lease_owner == _P("p_owner"))
        .order_by(jobs.c.priority, jobs.c.run_at, jobs.c.id)
    )
    return ready, take, won


def claim(
    store: Store,
    conn: Connection,
    *,
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int = 1,
    queues: Sequence[str] = ("default",),
    handlers: Collection[str] = (),
    exclude: bool = False,
    after: ClaimKey | None = None,
    limited: Collection[str] = (),
) -> list[Job]:
    """Move up to ``limit`` ready jobs ``queued -> claimed`` for ``owner`` (with ``handlers``:
    only those handlers' jobs, or with ``exclude`` only the other handlers'; with ``after``,
    only those past that key in the claim's order; never those of the ``limited`` handlers)."""
    returning = store.caps.claim_returning
    by_handler = ("not_in" if exclude else "in") if handlers else None
    statements = _claim_statements(
        store.caps.skip_locked, returning, by_handler, after is not None, bool(limited)
    )
    params: dict[str, Any] = {
        "p_now": now,
        "p_queues": list(queues),
        "p_limit": limit,
        "p_owner": owner,
        "p_until": now + lease,
    }
    if after is not None:
        params.update(p_after_priority=after[0], p_after_at=after[1], p_after_id=after[2])
    if by_handler is not None:
        params["p_handlers"] = sorted(handlers)
    if limited:
        params["p_limited"] = sorted(limited)
    if returning:
        found = (Job.from_row(r) for r in conn.execute(statements[0], params))
        return sorted(found, key=lambda j: (j.priority, j.run_at, j.id))
    ready, take, won = statements
    ids = sorted(conn.execute(ready, params).scalars())
    if not ids:
        return []
    conn.execute(take, {**params, "p_ids": ids})
    return [Job.from_row(r) for r in conn.execute(won, {"p_owner": owner, "p_ids": ids})]


def expired(
    conn: Connection, *, now: datetime, limit: int, queues: Sequence[str] = ("default",)
) -> list[Job]:
    """Claimed jobs of ``queues`` whose lease has run out (their worker stopped or stalled)."""
    params = {"p_now": now, "p_limit": limit, "p_queues": list(queues)}
    return [Job.from_row(r) for r in conn.execute(EXPIRED, params)]


# The worker looks for expired leases before every claim: built once, like the claim.
# `lease_expires_at <= now` implies IS NOT NULL: the partial lease index serves it.
EXPIRED = (
    select(jobs)
    .where(
        jobs.c.state == CLAIMED,
        jobs.c.lease_expires_at <= _P("p_now", type_=jobs.c.lease_expires_at.type),
        jobs.c.queue.in_(_P("p_queues", expanding=True)),
    )
    .order_by(jobs.c.lease_expires_at, jobs.c.id)
    .limit(_P("p_limit", type_=Integer))
)

# A snooze: queued again at run_at, the attempt the claim counted given back.
_SNOOZE_ONE = by_id(
    update(jobs)
    .where(jobs.c.id == _P("p_id"), _HELD)
    .values(state=QUEUED, run_at=_P("p_retry_at"), attempts=jobs.c.attempts - 1, **_RELEASE)
)


def _seize(conn: Connection, job: Job, now: datetime, values: dict[str, Any]) -> bool:
    """Write ``values`` to an expired job, conditional on the owner and expiry we saw.

    Whoever changed the job since (its owner renewing, another worker taking it over) makes
    this change nothing. On a win, the lost attempt is recorded in the run history. A job
    another transaction holds locked is not waited for: it is not taken this time.
    """
    if skip_locked(conn.dialect):
        mine = select(jobs.c.id).where(jobs.c.id == job.id).with_for_update(skip_locked=True)
        if conn.execute(mine).first() is None:
            return False
    result = conn.execute(
        by_id(update(jobs))
        .where(
            jobs.c.id == job.id,
            jobs.c.state == CLAIMED,
            jobs.c.lease_owner == job.lease_owner,
            jobs.c.lease_expires_at == job.lease_expires_at,
            jobs.c.lease_expires_at <= now,
        )
        .values(**values)
    )
    if result.rowcount != 1:
        return False
    record_run(
        conn, job, outcome="lost", error_code="lease_expired", now=now, worker=job.lease_owner
    )
    return True


def take_over(
    conn: Connection, job: Job, *, owner: str, now: datetime, lease: timedelta, rerun: bool
) -> bool:
    """Take ``job`` from its stopped owner; with ``rerun`` start a new attempt. True if won."""
    values: dict[str, Any] = {
        "lease_owner": owner,
        "lease_expires_at": now + lease,
        "fence": jobs.c.fence + 1,  # the stopped owner's attempt is fenced
    }
    if rerun:
        values.update(attempts=jobs.c.attempts + 1, started_at=now)
    return _seize(conn, job, now, values)


def abort_expired(conn: Connection, job: Job, *, now: datetime) -> bool:
    """End a job whose lease expired on its last attempt: ``aborted`` / ``lease_expired``."""
    return _seize(conn, job, now, _finished(ABORTED, now, "lease_expired"))


def heartbeat(
    conn: Connection, job_ids: Iterable[int], *, owner: str, now: datetime, lease: timedelta
) -> int:
    """Extend the leases ``owner`` still holds; returns how many were extended."""
    ids = list(job_ids)
    if not ids:
        return 0
    params = {"p_ids": ids, "p_owner": owner, "p_now": now, "p_until": now + lease}
    return int(conn.execute(_EXTEND, params).rowcount)


_HOLDING = select(jobs.c.id).where(jobs.c.id.in_(_IDS), _HELD)


def holding(conn: Connection, job_ids: Iterable[int], *, owner: str, now: datetime) -> set[int]:
    """Which of ``job_ids`` ``owner`` holds the lease of at ``now``."""
    params = {"p_ids": list(job_ids), "p_owner": owner, "p_now": now}
    return set(conn.execute(_HOLDING, params).scalars())


def _finished(state: str, now: datetime, code: str | None) -> dict[str, Any]:
    return {
        "state": state,
        "finished_at": now,
        "lease_owner": None,
        "lease_expires_at": None,
        "dedupe_key": None,
        "last_error_code": code,
    }


@dataclass(frozen=True)
class Finish:
    """The end of one attempt, to be written under the lease."""

    job: Job
    state: str  # succeeded, aborted, or queued (a retry at retry_at)
    code: str | None = None
    run_code: str | None = None
    outcome: str | None = None
    retry_at: datetime | None = None
    started_at: datetime | None = None
    message: str | None = None  # the run's redacted error message ([worker] error_messages)
    snoozed: bool = False  # queued again at retry_at with its attempt given back

    def values(self, now: datetime) -> dict[str, Any]:
        if self.snoozed:
            return {
                "state": QUEUED,
                "run_at": self.retry_at,
                "attempts": self.job.attempts - 1,
                "lease_owner": None,
                "lease_expires_at": None,
            }
        if self.state == QUEUED:
            return {
                "state": QUEUED,
                "run_at": self.retry_at,
                "lease_owner": None,
                "lease_expires_at": None,
                "last_error_code": self.code,
            }
        return _finished(self.state, now, self.code)


def finish_many(
    conn: Connection, items: Sequence[Finish], *, owner: str, now: datetime
) -> list[Job | None]:
    """Record the end of several attempts, each guarded by ``owner``'s unexpired lease.

    Returns each job as it now stands, or None where the lease was lost (nothing written for
    it). Successes share one UPDATE where the engine can say which rows it changed.
    """
    done: dict[int, Job] = {}
    guard: dict[str, Any] = {"p_owner": owner, "p_now": now}
    plain = [f for f in items if f.state == SUCCEEDED]
    if len(plain) > 1 and conn.dialect.update_returning:
        won = set(
            conn.execute(_SUCCEED_MANY, {**guard, "p_ids": [f.job.id for f in plain]}).scalars()
        )
        values = _finished(SUCCEEDED, now, None)
        done.update((f.job.id, f.job.replaced(**values)) for f in plain if f.job.id in won)
        rest = [f for f in items if f.state != SUCCEEDED]
    else:
        rest = list(items)
    for f in rest:
        params: dict[str, Any] = {**guard, "p_id": f.job.id, "p_code": f.code}
        if f.state == QUEUED:
            params["p_retry_at"] = f.retry_at
            statement = _SNOOZE_ONE if f.snoozed else _RETRY_ONE
        else:
            params["p_state"] = f.state
            statement = _END_ONE
        if conn.execute(statement, params).rowcount == 1:
            done[f.job.id] = f.job.replaced(**f.values(now))
    history = [
        _run_values(
            f.job,
            outcome=f.outcome or f.state,
            error_code=f.run_code or f.code,
            now=now,
            worker=owner,
            started_at=f.started_at,
            error_message=f.message,
        )
        for f in items
        if f.job.id in done
    ]
    if history:
        conn.execute(_INSERT_RUNS, history)
    return [done.get(f.job.id) for f in items]


def _run_values(
    job: Job,
    *,
    outcome: str,
    error_code: str | None,
    now: datetime,
    worker: str | None,
    started_at: datetime | None = None,
    error_message: str | None = None,
) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "attempt": job.attempts,
        "started_at": started_at,
        "finished_at": now,
        "outcome": outcome,
        "error_code": error_code,
        "worker": worker,
        "slot": job.slot,
        "error_message": error_message,
    }


def record_run(conn: Connection, job: Job, **kwargs: Any) -> None:
    """Append one attempt to the run history."""
    conn.execute(_INSERT_RUNS, _run_values(job, **kwargs))


def history(conn: Connection, job_id: int) -> list[dict[str, Any]]:
    """The job's finished attempts, oldest first, each with its ``run``: 1 for the job's first
    run, one more at each attempt 1 after it (a rerun in place or a retry starts a run)."""
    stmt = select(runs).where(runs.c.job_id == job_id).order_by(runs.c.id)
    found = [dict(r._mapping) for r in conn.execute(stmt)]
    run = 0
    for item in found:
        if item["attempt"] == 1 or run == 0:
            run += 1
        item["run"] = run
    return found


def run_number() -> Any:
    """A column for a select from ``runs``: the run the attempt belongs to, as :func:`history`
    numbers them: the job's attempts 1 up to it (``ix_scheduler_runs_job``)."""
    earlier = runs.alias("earlier")
    starts = (
        select(func.count())
        .where(earlier.c.job_id == runs.c.job_id, earlier.c.attempt == 1, earlier.c.id <= runs.c.id)
        .scalar_subquery()
    )
    return case((starts < 1, 1), else_=starts).label("run")


def first_attempts(conn: Connection, job_id: int) -> int:
    """How many runs of the job were a first attempt (each run of a rerun in place starts
    its attempts again): the run number a log line names."""
    found = conn.execute(
        select(func.count()).select_from(runs).where(runs.c.job_id == job_id, runs.c.attempt == 1)
    )
    return int(found.scalar_one())


def job_exists(conn: Connection, job_id: int) -> bool:
    return conn.execute(select(jobs.c.id).where(jobs.c.id == job_id)).first() is not None


def latest_states(conn: Connection, names: Sequence[str]) -> dict[str, str]:
    """The state of each named task's newest job, for the tasks that have one: the tasks that
    never dispatched a job of their own, whose jobs ``backfill`` made. A statement per 500
    names, each a walk of the ``(task_name, id)`` index's end per name."""
    found: dict[str, str] = {}
    for start in range(0, len(names), 500):
        chunk = list(names[start : start + 500])
        newest = (
            select(func.max(jobs.c.id))
            .where(jobs.c.task_name.in_(chunk))
            .group_by(jobs.c.task_name)
        )
        stmt = select(jobs.c.task_name, jobs.c.state).where(jobs.c.id.in_(newest))
        found.update({r.task_name: str(r.state) for r in conn.execute(stmt)})
    return found


def task_has_jobs(conn: Connection, name: str) -> bool:
    """Whether any job of task ``name`` is kept (one entry of the ``(task_name, id)`` index)."""
    stmt = select(jobs.c.id).where(jobs.c.task_name == name).limit(1)
    return conn.execute(stmt).first() is not None


#: ``scheduler jobs`` lists this many unless told otherwise.
LIST_LIMIT = _limits.LIST_LIMIT


def list_statement(
    *,
    state: str | None = None,
    task: str | None = None,
    handler: str | None = None,
    queue: str | None = None,
    tenant: str | None = None,
    limit: int = LIST_LIMIT,
) -> Select[Any]:
    """Jobs, newest first (by id). With ``task`` it is a range of the ``(task_name, id)`` index
    read backwards, ``limit`` entries long: no sort, whatever the table's size."""
    stmt = select(jobs).order_by(jobs.c.id.desc()).limit(limit)
    for column, value in (
        (jobs.c.state, state),
        (jobs.c.task_name, task),
        (jobs.c.handler, handler),
        (jobs.c.queue, queue),
        (jobs.c.tenant, tenant),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    return stmt


def list_jobs(conn: Connection, **filters: Any) -> list[Job]:
    """The jobs :func:`list_statement` selects."""
    return [Job.from_row(r) for r in conn.execute(list_statement(**filters))]


def purge_statement(succeeded_before: datetime, aborted_before: datetime) -> Select[Any]:
    # `finished_at < t` implies IS NOT NULL: the partial finished index serves both branches.
    in_use = select(rows.c.last_job_id).where(rows.c.last_job_id.is_not(None))
    return select(jobs.c.id).where(
        ((jobs.c.state == SUCCEEDED) & (jobs.c.finished_at < succeeded_before))
        | ((jobs.c.state == ABORTED) & (jobs.c.finished_at < aborted_before)),
        jobs.c.id.not_in(in_use),
    )


def purge(
    conn: Connection, *, now: datetime, succeeded_after: timedelta, aborted_after: timedelta
) -> int:
    """Delete old finished jobs and their history; a job a row still points at is kept.

    Where the history is partitioned by day (PostgreSQL), only the default partition's runs
    are deleted here: a day partition's go with it (``_store/partitions.py``)."""
    old = purge_statement(now - succeeded_after, now - aborted_after)
    ids = list(conn.execute(old).scalars())
    history = _partitions.default_partition(conn, runs) if ids else runs
    deleted = 0
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        conn.execute(delete(history).where(history.c.job_id.in_(chunk)))
        deleted += conn.execute(delete(jobs).where(jobs.c.id.in_(chunk))).rowcount
    return deleted


# -- operators: retry an aborted job, cancel a queued one (docs/howto/operate.md) ----------
def _requeue_values(now: datetime) -> dict[str, Any]:
    return {
        "state": QUEUED,
        "attempts": 0,
        "run_at": now,
        "last_error_code": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "started_at": None,
        "finished_at": None,
    }


def requeue(
    conn: Connection,
    job_id: int,
    *,
    now: datetime,
    job_defaults: Callable[[str], tuple[int, str]],
    registered: Callable[[str], bool] | None = None,
) -> Job:
    """Move an ``aborted`` job back to ``queued`` with its attempts reset (the dead-letter
    requeue). A task's job must be the task's current job (``last_job_id``): it becomes a fresh
    run of it, handler and payload refreshed from the row, as a rerun in place does. A job
    ``backfill`` made is the other job of a task that may be retried: it runs its slot again,
    and the row (``last_job_id``, ``consecutive_failures``) is not touched.

    ``max_attempts`` and queue come from ``job_defaults`` (the handler's registration); when
    the handler is unchanged and ``registered`` says this process does not know it (a retry
    from a dashboard that imports no handlers), the job keeps its own.

    One conditional UPDATE (``state = 'aborted'``), its row count checked: a job that changed
    meanwhile is refused, never requeued twice.
    """
    job = get_job(conn, job_id)
    if job is None:
        raise JobStateError(f"no job {job_id}")
    if job.state != ABORTED:
        raise JobStateError(f"job {job_id} is {job.state}: only an aborted job can be retried")
    values = _requeue_values(now)
    condition = [jobs.c.id == job_id, jobs.c.state == ABORTED]
    if job.task_name is not None:
        row = conn.execute(
            select(rows.c.handler, rows.c.payload, rows.c.last_job_id, rows.c.tenant).where(
                rows.c.name == job.task_name
            )
        ).first()
        if row is not None:
            backfilled = row.last_job_id != job_id and is_backfilled(conn, job)
            if row.last_job_id != job_id and not backfilled:
                raise JobStateError(
                    f"job {job_id} is not the current job of task {job.task_name!r}"
                    f" (job {row.last_job_id}): retry that one, or trigger the task"
                )
            max_attempts, queue = job_defaults(row.handler)
            if (
                row.handler == job.handler
                and registered is not None
                and not registered(job.handler)
            ):
                max_attempts, queue = job.max_attempts, job.queue
            values.update(
                handler=row.handler,
                payload=row.payload,
                max_attempts=max_attempts,
                queue=queue,
                tenant=row.tenant,
            )
            if not backfilled:
                condition.append(
                    jobs.c.id.in_(select(rows.c.last_job_id).where(rows.c.name == job.task_name))
                )
    if conn.execute(update(jobs).where(*condition).values(**values)).rowcount != 1:
        raise JobStateError(f"job {job_id} changed meanwhile: nothing retried")
    found = get_job(conn, job_id)
    assert found is not None
    return found


def is_backfilled(conn: Connection, job: Job) -> bool:
    """Whether ``backfill`` made ``job`` (its ``backfilled`` decision names it)."""
    if job.task_name is None:
        return False
    found = conn.execute(
        select(decisions.c.id)
        .where(
            decisions.c.task_name == job.task_name,
            decisions.c.job_id == job.id,
            decisions.c.decision == BACKFILLED,
        )
        .limit(1)
    ).first()
    return found is not None


BACKFILLED = "backfilled"


def cancel(conn: Connection, job_id: int, *, now: datetime) -> Job:
    """Move a ``queued`` job to ``aborted`` with code ``cancelled``, or ask the worker of a
    ``claimed`` one to stop it (``cancel_requested_at``); refused in any other state.

    Each a conditional UPDATE on the state, its row count checked: a job a worker claimed
    meanwhile is asked to stop instead, one that finished meanwhile is refused.
    """
    result = conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.state == QUEUED)
        .values(**_finished(ABORTED, now, CANCELLED))
    )
    if result.rowcount != 1:
        asked = conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state == CLAIMED)
            .values(cancel_requested_at=now)
        )
        if asked.rowcount != 1:
            job = get_job(conn, job_id)
            if job is None:
                raise JobStateError(f"no job {job_id}")
            raise JobStateError(
                f"job {job_id} is {job.state}: only a queued or running job can be cancelled"
            )
    found = get_job(conn, job_id)
    assert found is not None
    return found


CANCELLED = "cancelled"


def cancels_requested(conn: Connection, job_ids: Iterable[int], *, owner: str) -> set[int]:
    """Which of ``job_ids``, claimed by ``owner``, an operator asked to cancel during their
    current attempt (a request older than the attempt's start was a past run's)."""
    found = conn.execute(
        select(jobs.c.id).where(
            jobs.c.id.in_(list(job_ids)),
            jobs.c.state == CLAIMED,
            jobs.c.lease_owner == owner,
            jobs.c.cancel_requested_at >= jobs.c.started_at,
        )
    )
    return set(found.scalars())


def cancel_task_jobs(conn: Connection, name: str, now: datetime) -> int:
    """Abort every ``queued`` job of the task ``name`` (a retry waiting out its back-off too)
    with code ``cancelled``: its row was removed. A job a worker claims meanwhile is not
    touched (the claim and this are both conditional on ``queued``). Returns how many."""
    ended = conn.execute(
        update(jobs)
        .where(jobs.c.task_name == name, jobs.c.state == QUEUED)
        .values(**_finished(ABORTED, now, CANCELLED))
    )
    return int(ended.rowcount)


# The rerun in place of an aborted job: the tick's, and a recovery probe's.
RERUN_IN_PLACE = by_id(  # through the primary key on MariaDB/MySQL (see by_id)
    update(jobs)
    .where(jobs.c.id == bindparam("p_id"), jobs.c.state == ABORTED)
    .values(
        state=QUEUED,
        attempts=0,
        fence=jobs.c.fence + 1,
        max_attempts=bindparam("p_max_attempts"),
        queue=bindparam("p_queue"),
        handler=bindparam("p_handler"),
        payload=bindparam("p_payload"),
        tenant=bindparam("p_tenant"),
        run_at=bindparam("p_now"),
        slot=bindparam("p_slot"),
        traceparent=bindparam("p_traceparent"),
        last_error_code=None,
        lease_owner=None,
        lease_expires_at=None,
        started_at=None,
        finished_at=None,
    )
)


def complete_fenced(
    conn: Connection, job: Job, *, fence: int, owner: str, now: datetime, started_at: datetime
) -> bool:
    """Record ``job``'s success in the caller's transaction (``job.complete``), if the attempt
    with ``fence`` still holds it; with its run in the history. False: it was fenced."""
    done = conn.execute(
        by_id(update(jobs))
        .where(
            jobs.c.id == job.id,
            jobs.c.state == CLAIMED,
            jobs.c.fence == fence,
            jobs.c.lease_owner == owner,
        )
        .values(**_finished(SUCCEEDED, now, None))
    )
    if done.rowcount != 1:
        return False
    record_run(
        conn, job, outcome=SUCCEEDED, error_code=None, now=now, worker=owner, started_at=started_at
    )
    return True
