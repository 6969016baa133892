"""The tick: each due row in its own transaction, decided by a compare-and-swap on its version.

For one due row (SPEC §2): a terminally ``aborted`` last job counts a failure and either
disables the row (committed, reported *not dispatched*) or is reset and rerun in place; a
non-concurrent row whose last job is still in flight is held back (nothing written); otherwise
a fresh job is dispatched. The outcome reported is tracked apart from commit/rollback.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement

from . import _cron, _jobs, _pgspread, _retry, signals
from ._alerts import Alert, cause, deliver
from ._driver import Prepared, PreparedSet
from ._jobs import ABORTED, CLAIMED, QUEUED, SUCCEEDED
from ._pgspread import Spread
from ._store import Store
from ._tables import jobs, rows

log = logging.getLogger(__name__)

DISPATCHED, RERUN, HELD_BACK, DISABLED, LOST_RACE = (
    "dispatched",
    "rerun",
    "held_back",
    "disabled",
    "lost_race",
)
_FRESH = "_fresh"  # not an outcome: "dispatch this row fresh", from _one to _spread
REASON_FAILURES = "max_consecutive_failures"

# (handler name) -> (max_attempts, queue) for the jobs the tick creates
JobDefaults = Callable[[str], tuple[int, str]]


@dataclass
class TickReport:
    """Row names per outcome of one tick."""

    dispatched: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    lost_race: list[str] = field(default_factory=list)

    def add(self, outcome: str, name: str) -> None:
        getattr(self, outcome).append(name)

    def as_dict(self) -> dict[str, list[str]]:
        return {
            k: list(getattr(self, k)) for k in (DISPATCHED, RERUN, HELD_BACK, DISABLED, LOST_RACE)
        }

    def __bool__(self) -> bool:
        return any(self.as_dict().values())


class _Rollback(Exception):
    def __init__(self, outcome: str) -> None:
        self.outcome = outcome


_due_columns = [
    rows.c.id,
    rows.c.name,
    rows.c.handler,
    rows.c.payload,
    rows.c.cron,
    rows.c.timezone,
    rows.c.concurrent,
    rows.c.next_run_at,
    rows.c.last_job_id,
    rows.c.consecutive_failures,
    rows.c.max_consecutive_failures,
    rows.c.version,
    jobs.c.state.label("job_state"),
    jobs.c.last_error_code.label("job_error"),
]


# Built once with bound parameters (building costs more than running on SQLite).
_P = bindparam
_DUE = (
    select(*_due_columns)
    .select_from(rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id))
    .where(rows.c.enabled == true(), rows.c.next_run_at <= _P("p_now"))
    .order_by(rows.c.next_run_at, rows.c.id)
    .limit(_P("p_limit", type_=Integer))
)
_DUE_AFTER = _DUE.where(  # the next batch: keyset pagination past the last row seen
    or_(
        rows.c.next_run_at > _P("p_after_at"),
        and_(rows.c.next_run_at == _P("p_after_at"), rows.c.id > _P("p_after_id")),
    )
)
_RESET_JOB = _jobs.by_id(
    update(jobs)
    .where(jobs.c.id == _P("p_id"), jobs.c.state == ABORTED)
    .values(
        state=QUEUED,
        attempts=0,
        max_attempts=_P("p_max_attempts"),
        queue=_P("p_queue"),
        handler=_P("p_handler"),
        payload=_P("p_payload"),
        run_at=_P("p_now"),
        last_error_code=None,
        lease_owner=None,
        lease_expires_at=None,
        started_at=None,
        finished_at=None,
    )
)


# A fresh dispatch, the tick's hot path, runs on the driver's cursor (see _driver.py). The job's
# values are _jobs.new_job_values', each a parameter named "j_" + its column.
_JOB_COLUMNS: tuple[str, ...] = ("handler", "payload", "queue", "priority", "run_at", "state")
_JOB_COLUMNS += ("attempts", "max_attempts", "dedupe_key", "task_name", "created_at")
_JOB_PARAMS = {c: _P(f"j_{c}", type_=jobs.c[c].type) for c in _JOB_COLUMNS}
# Where the compare-and-swap and the job's INSERT are one statement (data-modifying CTEs).
_ONE_STATEMENT = frozenset({"postgresql"})
_SWAP_VALUES = {
    "version": rows.c.version + literal_column("1"),
    "updated_at": _P("p_now", type_=rows.c.updated_at.type),
    "consecutive_failures": _P("r_failures", type_=rows.c.consecutive_failures.type),
    "next_run_at": _P("r_next_run_at", type_=rows.c.next_run_at.type),
}
_SWAP_WHERE = (
    rows.c.id == _P("r_id", type_=rows.c.id.type),
    rows.c.version == _P("r_version", type_=rows.c.version.type),
)


def _build_dispatch(dialect: str) -> ClauseElement:
    if dialect in _ONE_STATEMENT:
        # One statement, so one round trip: the compare-and-swap takes the job's id from the
        # jobs sequence, and the INSERT runs only for the row it returns (none if the swap lost).
        sequence: Any = literal_column("pg_get_serial_sequence('scheduler_jobs', 'id')")
        swapped = (
            update(rows)
            .where(*_SWAP_WHERE)
            .values(last_job_id=func.nextval(sequence), **_SWAP_VALUES)
            .returning(rows.c.last_job_id)
            .cte("swapped")
        )
        source = select(swapped.c.last_job_id, *(_JOB_PARAMS[c] for c in _JOB_COLUMNS))
        columns = [jobs.c.id, *(jobs.c[c] for c in _JOB_COLUMNS)]
        return insert(jobs).from_select(columns, source).returning(jobs.c.id)
    return insert(jobs).values(_JOB_PARAMS)


def _build_dispatch_swap(_dialect: str) -> ClauseElement:
    return (
        update(rows)
        .where(*_SWAP_WHERE)
        .values(last_job_id=_P("r_job_id", type_=rows.c.last_job_id.type), **_SWAP_VALUES)
    )


_DISPATCH = PreparedSet(_build_dispatch, Prepared)
_DISPATCH_SWAP = PreparedSet(_build_dispatch_swap, Prepared)
_DISPATCH_SPREAD = PreparedSet(_build_dispatch, Spread)  # PostgreSQL with psycopg: see _spread


def _dispatch(conn: Connection, params: dict[str, Any]) -> int:
    """Insert the row's new job and point the row at it, under the version compare-and-swap."""
    job_id = int(_DISPATCH.on(conn).run(conn, params).lastrowid)
    params["r_job_id"] = job_id
    if _DISPATCH_SWAP.on(conn).run(conn, params).rowcount != 1:
        raise _Rollback(LOST_RACE)
    return job_id


def _due(
    store: Store, conn: Connection, now: datetime, limit: int, after: tuple[datetime, int] | None
) -> list[Any]:
    """The next batch of due rows, read on its own (an idle tick: 1 statement, no write lock)."""
    if after is None:
        return store.read_rows(conn, _DUE, {"p_now": now, "p_limit": limit})
    params = {"p_now": now, "p_limit": limit, "p_after_at": after[0], "p_after_id": after[1]}
    return store.read_rows(conn, _DUE_AFTER, params)


@functools.lru_cache(maxsize=16)
def _swap_statement(keys: tuple[str, ...]) -> Any:
    return (
        update(rows)
        .where(rows.c.id == _P("p_id"), rows.c.version == _P("p_version"))
        .values(
            version=rows.c.version + 1,
            updated_at=_P("p_now"),
            **{key: _P(f"p_{key}", type_=rows.c[key].type) for key in keys},
        )
    )


def _swap(conn: Connection, row: Any, now: datetime, **values: Any) -> None:
    """The compare-and-swap on the row's version; a miss means another process won."""
    params = {f"p_{key}": value for key, value in values.items()}
    params.update(p_id=row.id, p_version=row.version, p_now=now)
    if conn.execute(_swap_statement(tuple(sorted(values))), params).rowcount != 1:
        raise _Rollback(LOST_RACE)


# On PostgreSQL a batch's rows are spread over several connections: each row is still its own
# transaction, and commits waiting on the WAL flush at the same time share it.
DEFAULT_CONNECTIONS = {"postgresql": 4}
_ROWS_PER_CONNECTION = 2  # fewer rows than this per connection are not worth a checkout

AfterCommit = Callable[[Connection], object]
Decided = tuple[str, AfterCommit | None]


def tick(
    store: Store,
    *,
    now: datetime,
    max_consecutive_failures: int,
    batch_size: int,
    job_defaults: JobDefaults,
    connections: int = 0,
) -> TickReport:
    """Run one tick over every due row, oldest ``next_run_at`` first, in bounded batches."""
    dialect = store.engine.dialect.name
    if dialect == "sqlite" or connections < 0:
        connections = 1  # one writer at a time: more connections would only wait on the lock
    elif connections == 0:
        connections = DEFAULT_CONNECTIONS.get(dialect, 1)
    decide = functools.partial(
        _one, now=now, global_limit=max_consecutive_failures, job_defaults=job_defaults
    )
    fresh = functools.partial(_fresh_params, now=now, job_defaults=job_defaults)
    report = TickReport()
    after: tuple[datetime, int] | None = None
    # One connection reads each batch, runs its rows (or the first lane of them) and sends the
    # signals: a checkout costs a round trip where the pool pings (PostgreSQL, MariaDB).
    with store.engine.connect() as conn:
        spread = _pgspread.available(conn)
        while True:
            batch = _due(store, conn, now, batch_size, after)
            if spread:  # PostgreSQL (psycopg): fresh rows over connections at once
                _spread(store, conn, batch, connections, decide, fresh, report)
            elif (lanes := min(connections, len(batch) // _ROWS_PER_CONNECTION)) > 1:
                _parallel(store, conn, batch, lanes, decide, report)  # threads (MariaDB)
            else:
                for row in batch:
                    outcome, after_commit = decide(conn, row)
                    _settle(conn, row, outcome, after_commit, report)
            if len(batch) < batch_size:
                return report
            after = (batch[-1].next_run_at, batch[-1].id)


def _parallel(
    store: Store,
    conn: Connection,
    batch: list[Any],
    lanes: int,
    decide: Callable[[Connection, Any], Decided],
    report: TickReport,
) -> None:
    """Rows taken in due order by `lanes` connections (this thread runs the first on `conn`);
    outcomes reported (and signals sent) in due order once every lane is done. A lane that
    fails stops; what the others committed is still reported and signalled before its error
    is raised."""
    decided: dict[int, Decided] = {}
    # Each lane takes the next row when it is free, so a helper that starts late (it waits for
    # the GIL and a connection) takes fewer rows. A deque's popleft is thread-safe.
    pending = collections.deque(batch)

    def lane(lane_conn: Connection) -> None:
        while True:
            try:
                row = pending.popleft()
            except IndexError:
                return
            decided[row.id] = decide(lane_conn, row)

    def helper() -> None:
        with store.engine.connect() as helper_conn:
            lane(helper_conn)

    helpers = store.helpers(lanes - 1)
    futures = [helpers.submit(helper) for _ in range(lanes - 1)]
    failures: list[BaseException] = []
    try:
        lane(conn)
    except BaseException as exc:  # settle the other lanes' commits first
        failures.append(exc)
    for future in futures:
        error = future.exception()
        if error is not None:
            failures.append(error)
    _settle_all(conn, batch, decided, failures, report)


def _spread(
    store: Store,
    conn: Connection,
    batch: list[Any],
    connections: int,
    decide: Callable[..., Decided],
    fresh: Callable[[Any], dict[str, Any]],
    report: TickReport,
) -> None:
    """PostgreSQL: the rows to rerun, disable or hold back are decided first, one by one on
    `conn`; then the fresh dispatches, one statement and one transaction each, run at once
    over up to `connections` connections from this thread (see _pgspread), so that their
    commits share WAL flushes. Outcomes are reported (and signals sent) in due order; an error
    is raised after what committed has been reported."""
    decided: dict[int, Decided] = {}
    fresh_rows: list[Any] = []
    failures: list[BaseException] = []
    try:
        for row in batch:
            outcome = decide(conn, row, defer_fresh=True)
            if outcome[0] == _FRESH:
                fresh_rows.append(row)
            else:
                decided[row.id] = outcome
        if fresh_rows:
            lanes = max(1, min(connections, len(fresh_rows) // _ROWS_PER_CONNECTION))
            with contextlib.ExitStack() as stack:

                def lane_connections() -> Iterator[Connection]:
                    yield conn  # its first row is on its way before the next checkout
                    for _ in range(lanes - 1):
                        try:
                            extra = stack.enter_context(store.engine.connect())
                        except Exception:  # the lanes already open go on with every row
                            log.debug("tick: no more connections for the batch", exc_info=True)
                            return
                        yield extra

                found = _DISPATCH_SPREAD.on(conn).run(lane_connections(), fresh_rows, fresh)
            for row, job_id in zip(fresh_rows, found, strict=True):
                if isinstance(job_id, BaseException):
                    failures.append(job_id)
                else:
                    decided[row.id] = (
                        (LOST_RACE, None) if job_id is None else _dispatched(row, job_id)
                    )
    except BaseException as exc:  # report what committed first
        failures.append(exc)
    _settle_all(conn, batch, decided, failures, report)


def _settle_all(
    conn: Connection,
    batch: list[Any],
    decided: dict[int, Decided],
    failures: list[BaseException],
    report: TickReport,
) -> None:
    """Report the decided rows (and send their signals) in due order, then raise the first
    failure: what committed is reported even when another row failed."""
    for row in batch:
        if row.id in decided:
            _settle(conn, row, *decided[row.id], report)
    if failures:
        raise failures[0]


def _settle(
    conn: Connection, row: Any, outcome: str, after_commit: AfterCommit | None, report: TickReport
) -> None:
    report.add(outcome, row.name)
    log.debug(
        "tick: row %s %s", row.name, outcome, extra={"action": f"row_{outcome}", "row": row.name}
    )
    if after_commit is not None:
        after_commit(conn)


def _one(
    conn: Connection,
    row: Any,
    *,
    now: datetime,
    global_limit: int,
    job_defaults: JobDefaults,
    defer_fresh: bool = False,
) -> Decided:
    """One due row in its own transaction: (outcome, what to run after the commit).

    The branch follows the snapshot of the due query; every write is a compare-and-swap on the
    row's version, so a snapshot that went stale loses (`lost_race`) instead of acting twice.
    A hold back writes nothing, so it needs no transaction at all.
    """
    state = row.job_state
    try:
        if state == ABORTED:  # checked before the in-flight gate, whatever the concurrency
            with conn.begin():
                return _after_failure(conn, row, now, global_limit, job_defaults)
        if state in (QUEUED, CLAIMED) and not row.concurrent:
            return HELD_BACK, None
        if defer_fresh:  # the caller dispatches it (_spread)
            return _FRESH, None
        return _fresh(conn, row, now, job_defaults)
    except _Rollback as rolled_back:
        return rolled_back.outcome, None
    except DBAPIError as exc:  # a deadlock or lock wait timeout: retried on the next tick
        if _retry.lock_conflict(exc) is None:
            raise
        log.debug("tick: row %s lost to a lock conflict: %s", row.name, exc.orig)
        return LOST_RACE, None


def _after_failure(
    conn: Connection, row: Any, now: datetime, global_limit: int, job_defaults: JobDefaults
) -> Decided:
    """The last job is aborted: count it, then disable the row or rerun the job in place."""
    failures = row.consecutive_failures + 1
    limit = row.max_consecutive_failures
    limit = global_limit if limit is None else limit
    if limit and failures >= limit:
        alert_id = uuid.uuid4().hex
        _swap(
            conn,
            row,
            now,
            enabled=False,
            disabled_reason=REASON_FAILURES,
            disabled_at=now,
            consecutive_failures=failures,
            alert_id=alert_id,
        )
        code = cause(conn, row.last_job_id, row.job_error)
        log.warning(
            "row %s disabled after %s consecutive failures (last error %s)",
            row.name,
            failures,
            code,
            extra={"action": "row_disabled", "row": row.name, "code": code},
        )
        alert = Alert(row.id, row.name, failures, code, row.last_job_id, now, alert_id)
        return DISABLED, lambda after: deliver(after, alert)
    max_attempts, queue = job_defaults(row.handler)
    _swap(
        conn,
        row,
        now,
        consecutive_failures=failures,
        next_run_at=_cron.next_after(row.cron, row.timezone, now, row.name),
    )
    reset = conn.execute(
        _RESET_JOB,
        {
            "p_id": row.last_job_id,
            "p_max_attempts": max_attempts,
            "p_queue": queue,
            "p_handler": row.handler,
            "p_payload": row.payload,
            "p_now": now,
        },
    )
    if reset.rowcount != 1:
        raise _Rollback(LOST_RACE)
    return RERUN, lambda _conn: signals.send(
        signals.job_rerun,
        row.name,
        row=row.name,
        job_id=row.last_job_id,
        consecutive_failures=failures,
    )


def _fresh_params(row: Any, *, now: datetime, job_defaults: JobDefaults) -> dict[str, Any]:
    """The parameters of a fresh dispatch: the new job's values and the row's swap."""
    max_attempts, queue = job_defaults(row.handler)
    job = _jobs.new_job_values(
        handler=row.handler,
        payload=row.payload,
        now=now,
        max_attempts=max_attempts,
        queue=queue,
        task_name=row.name,
    )
    params = {f"j_{column}": value for column, value in job.items()}
    params.update(
        p_now=now,
        r_id=row.id,
        r_version=row.version,
        r_failures=0 if row.job_state in (SUCCEEDED, None) else row.consecutive_failures,
        r_next_run_at=_cron.next_after(row.cron, row.timezone, now, row.name),
    )
    return params


def _fresh(conn: Connection, row: Any, now: datetime, job_defaults: JobDefaults) -> Decided:
    """Dispatch a new job in its own transaction (PostgreSQL with psycopg: see _spread)."""
    params = _fresh_params(row, now=now, job_defaults=job_defaults)
    with conn.begin():
        if conn.dialect.name in _ONE_STATEMENT:  # another PostgreSQL driver
            found = _DISPATCH.on(conn).run(conn, params).fetchone()
            if found is None:
                raise _Rollback(LOST_RACE)
            job_id = int(found[0])
        else:
            job_id = _dispatch(conn, params)
    return _dispatched(row, job_id)


def _dispatched(row: Any, job_id: int) -> Decided:
    return DISPATCHED, lambda _conn: signals.send(
        signals.job_dispatched,
        row.name,
        row=row.name,
        job_id=job_id,
        slot=row.next_run_at,
    )
