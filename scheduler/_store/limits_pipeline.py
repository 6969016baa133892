"""The claim under limits in one round trip: PostgreSQL through psycopg, no ``fair`` limit.

The claim of ``scheduler/_store/limits.py`` holds the limits' row locks for its whole
transaction: about six client round trips (lock, count, choose, claim, hold, commit). On a
loaded machine the worker holding the lock is descheduled in between, and every other claim
waits for it. This one holds the lock only inside the server, for one round trip:

1. **Choose, unlocked.** One plain read of the ready jobs under the limits, in the claim's
   order, the partitions a (possibly stale) count finds full left out. No lock: the read may
   be stale, and that is fine, since step 2 decides.
2. **Decide, locked, in one round trip.** In psycopg's pipeline mode, one implicit transaction
   (everything before the pipeline's Sync is one, committed at the Sync, rolled back whole if
   a statement fails): behind a transaction pooler the transaction's settings first; then the
   lock, one ``UPDATE`` bumping the ``version`` of each limit's row, in name order; then ONE
   statement that counts the running and started attempts per limit and partition, works out
   each partition's room, claims up to that room of the chosen jobs still ``queued`` (a
   conditional ``UPDATE ... RETURNING``, in the chosen order: ``row_number()`` over each
   partition <= its room), and inserts the holds of the jobs it won.

**The snapshot rule.** Under READ COMMITTED, PostgreSQL takes a statement's snapshot when that
statement starts. The counting statement starts after the lock ``UPDATE`` has returned, that
is, after every claim that held the lock before committed (a lock is released after its
transaction's commit is visible), so it counts all of them. The count must therefore be its own
statement after the lock, never a CTE of the lock's statement: a statement's CTEs all share the
snapshot taken before its lock was granted.

A job under several limits is taken only if its rank among the chosen jobs of each of its
partitions is within that partition's room: conservative (a job another limit held back still
counts against the first one's room), never above a limit. A job cancelled between the read and
the claim is not ``queued`` any more, and the conditional ``UPDATE`` passes it over.

``fair`` limits (the rotation's cursor), SQLite (``BEGIN IMMEDIATE`` serializes anyway),
MariaDB/MySQL and drivers without pipeline mode use ``limits.claim``.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Dialect, literal

from .._model.job import Job
from .._model.limits import Limit, LimitSet
from .._model.rules import CLAIMED, QUEUED
from .driver import cursor_events, driver_error
from .engine import LOCAL_SETTINGS_KEY, Store
from .limits import covered, part_expression
from .tables import UTCDateTime, jobs

_MAX_CANDIDATES = 500
_JOB_COLUMNS = [column.name for column in jobs.c]


def covers(store: Store, limitset: LimitSet) -> bool:
    """Whether this claim serves ``limitset`` on ``store`` (else ``limits.claim`` does). Not
    on Citus: there the statements of a pipeline's implicit transaction (no ``BEGIN``) each
    commit on the worker node at once, so the lock ``UPDATE``'s row locks are gone before the
    counting statement runs (racing claims ran 15 jobs under a concurrency of 5), while
    ``limits.claim``, which holds them for its whole transaction, keeps every limit."""
    if store.caps.citus:
        return False
    return store.caps.pipeline and not any(limit.fair for limit in limitset.limits)


@dataclass(frozen=True)
class _Statements:
    """The SQL of one limit set, for psycopg (``%(name)s`` parameters)."""

    choose: str
    locks: tuple[str, ...]
    claim: str


def _sql(expression: Any, dialect: Dialect) -> str:
    """A Core expression as PostgreSQL text, its values written in (escaped by SQLAlchemy, its
    percent signs doubled for psycopg's parameters)."""
    return str(expression.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


def _counts(chosen: Sequence[Limit], dialect: Dialect) -> str:
    """CTEs ``running`` and ``started``: per (limit, partition), the attempts running and those
    started in the rate's window (``since_N``: the window's start for the N-th limit)."""
    names = ", ".join(_sql(literal(limit.name), dialect) for limit in chosen)
    windows = [
        f"(h.limit_name = {_sql(literal(limit.name), dialect)} AND h.started_at > %(since_{n})s)"
        for n, limit in enumerate(chosen)
        if limit.rate is not None
    ]
    started = (
        "SELECT h.limit_name, h.part, count(*) AS n FROM scheduler_limit_holds h"
        f" WHERE {' OR '.join(windows)} GROUP BY h.limit_name, h.part"
        if windows
        else "SELECT CAST(NULL AS varchar) AS limit_name, CAST(NULL AS varchar) AS part,"
        " 0 AS n WHERE false"
    )
    # Materialized: counted once, not once per candidate. The running jobs' ids first (few:
    # the claimed ones), then their holds by (limit, job): OFFSET 0 keeps the subquery a
    # lookup per id, whatever the planner's statistics say (a table just filled looks empty).
    return (
        "running AS MATERIALIZED (SELECT h.limit_name, h.part, count(DISTINCT h.job_id) AS n"
        " FROM unnest(ARRAY(SELECT cj.id FROM scheduler_jobs cj"
        f" WHERE cj.state = '{CLAIMED}')) AS r(id) CROSS JOIN LATERAL (SELECT h.limit_name,"
        " h.part, h.job_id FROM scheduler_limit_holds h"
        f" WHERE h.limit_name IN ({names}) AND h.job_id = r.id OFFSET 0) h"
        " GROUP BY h.limit_name, h.part),"
        f" started AS MATERIALIZED ({started})"
    )


def _room(limit: Limit, dialect: Dialect, part: str) -> str:
    """SQL: how many more attempts may start under ``limit`` in partition ``part`` (SQL)."""
    name = _sql(literal(limit.name), dialect)
    terms = []
    if limit.concurrency is not None:
        terms.append(
            f"{limit.concurrency} - coalesce((SELECT n FROM running"
            f" WHERE limit_name = {name} AND running.part = {part}), 0)"
        )
    if limit.rate is not None:
        terms.append(
            f"{limit.rate_count} - coalesce((SELECT n FROM started"
            f" WHERE limit_name = {name} AND started.part = {part}), 0)"
        )
    return terms[0] if len(terms) == 1 else f"LEAST({terms[0]}, {terms[1]})"


@functools.lru_cache(maxsize=16)
def _statements(
    chosen: tuple[Limit, ...],
    named: tuple[tuple[str, tuple[str, ...]], ...],
    filtered: str | None,
    queues: int,
    dialect: Dialect,
) -> _Statements:
    limitset = LimitSet(chosen, dict(named))
    under = [_sql(covered(limitset, limit), dialect) for limit in chosen]
    parts = [_sql(part_expression(limit, dialect.name), dialect) for limit in chosen]
    counts = _counts(chosen, dialect)
    # IN, not = ANY(array): one queue is an equality, and the ready index gives the order.
    listed = ", ".join(f"%(queue_{n})s" for n in range(queues))
    ready = f"scheduler_jobs.run_at <= %(now)s AND scheduler_jobs.queue IN ({listed})"
    waiting = f"scheduler_jobs.state = '{QUEUED}'"
    if filtered is not None:
        ready += f" AND {'NOT ' if filtered == 'not_in' else ''}(scheduler_jobs.handler"
        ready += " = ANY(%(handlers)s))"
    # 1. Choose: the ready jobs under a limit, those in a partition found full left out; and
    # per limit how many partitions were full, and whether a rate filled one (one row at least).
    full = " UNION ALL ".join(
        f"SELECT {_sql(literal(limit.name), dialect)} AS limit_name, p.part,"
        f" {'true' if limit.rate is not None else 'false'} AND {limit.rate_count or 0}"
        " <= coalesce((SELECT n FROM started s WHERE s.limit_name = "
        f"{_sql(literal(limit.name), dialect)} AND s.part = p.part), 0) AS by_rate"
        " FROM (SELECT part FROM running WHERE limit_name ="
        f" {_sql(literal(limit.name), dialect)} UNION SELECT part FROM started WHERE"
        f" limit_name = {_sql(literal(limit.name), dialect)}) p"
        f" WHERE {_room(limit, dialect, 'p.part')} <= 0"
        for limit in chosen
    )
    spared = " AND ".join(
        f"NOT ({u} AND {p} IN (SELECT part FROM full_parts WHERE limit_name ="
        f" {_sql(literal(limit.name), dialect)}))"
        for limit, u, p in zip(chosen, under, parts, strict=True)
    )
    choose = (
        f"WITH {counts}, full_parts AS ({full})"
        " SELECT f.held, f.by_rate, c.id FROM (SELECT count(*) AS held,"
        " coalesce(bool_or(by_rate), false) AS by_rate FROM full_parts) f"
        " LEFT JOIN LATERAL (SELECT scheduler_jobs.id, scheduler_jobs.priority,"
        " scheduler_jobs.run_at FROM scheduler_jobs"
        f" WHERE {waiting} AND {ready} AND ({' OR '.join(under)}) AND {spared}"
        " ORDER BY scheduler_jobs.priority, scheduler_jobs.run_at, scheduler_jobs.id"
        " LIMIT %(candidates)s) c ON true ORDER BY c.priority, c.run_at, c.id"
    )
    # 2. The lock, then the one statement that counts, claims and holds.
    locks = tuple(
        "UPDATE scheduler_limits SET version = version + 1"
        f" WHERE name = {_sql(literal(limit.name), dialect)}"
        for limit in chosen
    )
    columns = ", ".join(
        f"{u} AS u{n}, {p} AS p{n}" for n, (u, p) in enumerate(zip(under, parts, strict=True))
    )
    ranks = ", ".join(
        f"row_number() OVER (PARTITION BY u{n}, p{n} ORDER BY ord) AS k{n}"
        for n in range(len(chosen))
    )
    fits = " AND ".join(
        f"(NOT u{n} OR k{n} <= {_room(limit, dialect, f'p{n}')})" for n, limit in enumerate(chosen)
    )
    holds = " UNION ALL ".join(
        f"SELECT {_sql(literal(limit.name), dialect)}, c.p{n}, w.id, %(now)s"
        f" FROM won w JOIN cand c ON c.id = w.id WHERE c.u{n}"
        for n, limit in enumerate(chosen)
    )
    returned = ", ".join(f"w.{name}" for name in _JOB_COLUMNS)
    claim = (
        f"WITH {counts},"
        " cand AS (SELECT job.*, chosen.ord"
        " FROM unnest(CAST(%(ids)s AS bigint[])) WITH ORDINALITY AS chosen(id, ord)"
        f" CROSS JOIN LATERAL (SELECT scheduler_jobs.id, {columns} FROM scheduler_jobs"
        # by id: the state written so that no index serves it (as for the UPDATE below)
        f" WHERE scheduler_jobs.id = chosen.id AND coalesce(scheduler_jobs.state, '') ="
        f" '{QUEUED}' AND {ready} OFFSET 0) job),"
        f" ranked AS (SELECT cand.*, {ranks} FROM cand),"
        f" fits AS (SELECT id, ord FROM ranked WHERE {fits} ORDER BY ord LIMIT %(want)s),"
        # The recheck of the state is written so that no index serves it: the jobs are found
        # by id (see jobs._claim_statements).
        " won AS (UPDATE scheduler_jobs SET state = %(claimed)s, lease_owner = %(owner)s,"
        " lease_expires_at = %(until)s, started_at = %(now)s,"
        " attempts = scheduler_jobs.attempts + 1, fence = scheduler_jobs.fence + 1"
        " FROM fits WHERE scheduler_jobs.id = fits.id"
        f" AND coalesce(scheduler_jobs.state, '') = '{QUEUED}'"
        " RETURNING scheduler_jobs.*),"
        " held AS (INSERT INTO scheduler_limit_holds (limit_name, part, job_id, started_at)"
        f" {holds})"
        " SELECT (SELECT count(*) FROM cand) - (SELECT count(*) FROM won) AS held,"
        f" {returned} FROM (SELECT 1) one LEFT JOIN won w ON true"
    )
    return _Statements(choose, locks, claim)


def claim(
    store: Store,
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
    """Claim up to ``want`` ready jobs under limits, for ``owner`` (module docstring): as
    ``limits.claim`` returns, the jobs won, how many times a limit held back a job or had a
    full partition, and whether a rate did."""
    chosen = tuple(sorted(limitset.limits, key=lambda limit: limit.name))
    named = tuple(sorted((h, tuple(names)) for h, names in limitset.named.items()))
    filtered = ("not_in" if exclude else "in") if handlers else None
    stamp = UTCDateTime().process_bind_param
    dialect = store.engine.dialect
    sql = _statements(chosen, named, filtered, len(queues), dialect)
    params: dict[str, Any] = {
        "now": stamp(now, dialect),
        "until": stamp(now + lease, dialect),
        "owner": owner,
        "claimed": CLAIMED,
        **{f"queue_{n}": queue for n, queue in enumerate(queues)},
        "handlers": sorted(handlers),
        "candidates": min(want * 4 + 16, _MAX_CANDIDATES),
        "want": want,
    }
    for n, limit in enumerate(chosen):
        if limit.rate is not None:
            params[f"since_{n}"] = stamp(now - timedelta(seconds=limit.rate_seconds or 0), dialect)
    with store.engine.connect() as conn:
        # Behind a transaction pooler each implicit transaction carries its own settings.
        local: bytes | None = conn.connection.info.get(LOCAL_SETTINGS_KEY)
        settings: list[tuple[str, dict[str, Any] | None]] = []
        if local is not None:
            settings.append((local.decode(), None))
        found = _run(conn, [*settings, (sql.choose, params)])[-1]
        held, by_rate = int(found[0][0]), bool(found[0][1])
        ids = [int(row[2]) for row in found if row[2] is not None]
        if not ids:
            return [], held, by_rate
        params["ids"] = ids
        # With parameters (none): psycopg then reads a name's doubled % signs as one.
        locks: list[tuple[str, dict[str, Any] | None]] = [(lock, {}) for lock in sql.locks]
        rows = _run(conn, [*settings, *locks, (sql.claim, params)])[-1]
    held += int(rows[0][0])
    won = [_job(row[1:], dialect) for row in rows if row[1] is not None]
    return sorted(won, key=lambda j: (j.priority, j.run_at, j.id)), held, by_rate


def _run(
    conn: Connection, statements: list[tuple[str, dict[str, Any] | None]]
) -> list[list[tuple[Any, ...]]]:
    """Run ``statements`` on ``conn``'s driver connection in pipeline mode, in its autocommit:
    one implicit transaction, sent together, committed at the one Sync (rolled back whole if
    one fails). The rows of each; the statement events fire as for ``Connection.execute``."""
    import psycopg

    driver: Any = conn.connection.driver_connection
    events = cursor_events(conn)
    cursors = [driver.cursor() for _ in statements]
    pooled = LOCAL_SETTINGS_KEY in conn.connection.info
    driver.autocommit = True  # a local flag, no round trip
    current = statements[0][0]
    try:
        with driver.pipeline():
            for cursor, (current, params) in zip(cursors, statements, strict=True):
                _execute(conn, cursor, current, params, events)
        return [list(c.fetchall()) if c.description else [] for c in cursors]
    except psycopg.Error as exc:
        raise driver_error(conn, current, (), exc) from exc
    finally:
        if not conn.invalidated:
            if not pooled:
                driver.autocommit = False  # behind a pooler it stays on (engine.py)
            for cursor in cursors:
                cursor.close()


def _execute(
    conn: Connection, cursor: Any, sql: str, params: dict[str, Any] | None, events: Any
) -> None:
    for listener in events[0]:
        listener(conn, cursor, sql, params, None, False)
    cursor.execute(sql, params)
    for listener in events[1]:
        listener(conn, cursor, sql, params, None, False)


@functools.lru_cache(maxsize=16)
def _processors(dialect: Dialect) -> list[Any]:
    return [column.type.dialect_impl(dialect).result_processor(dialect, None) for column in jobs.c]


class _Row:
    """A job's row as :meth:`Job.from_row` reads it (``_mapping``)."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: dict[str, Any]) -> None:
        self._mapping = mapping


def _job(values: Sequence[Any], dialect: Dialect) -> Job:
    processed = {
        name: value if process is None else process(value)
        for name, value, process in zip(_JOB_COLUMNS, values, _processors(dialect), strict=True)
    }
    return Job.from_row(_Row(processed))
