"""Many jobs in one statement per chunk (``Scheduler.enqueue_many``), on any engine.

The SQL is written once per dialect, with positional placeholders, and each column's value
goes through that column's own bind processor once per distinct value (the conversion Core
would apply): 10,000 jobs share a handful of instants, queues and payloads.

- PostgreSQL: ``INSERT … SELECT … FROM unnest(%s::type[], …) WITH ORDINALITY ORDER BY
  ordinality RETURNING id``: one parameter per column, whatever the row count (a multi-row
  ``VALUES`` list of 10,000 rows costs the driver more to parse than the server to insert).
  Not on Citus: there an ``INSERT … SELECT`` into a distributed table goes through an
  intermediate result copied to the worker node, and that makes its transaction commit in two
  phases (``PREPARE TRANSACTION``); the multi-row ``VALUES`` form below is one router statement.
- SQLite and MariaDB 10.5+: a multi-row ``INSERT … VALUES … RETURNING id``.
- MySQL (no ``RETURNING``): a multi-row ``INSERT`` whose ids are ``LAST_INSERT_ID()`` on,
  consecutive when ``innodb_autoinc_lock_mode`` is 0 or 1 (MySQL's documented guarantee for
  an INSERT whose row count is known); one INSERT per row when it is 2 (interleaved).

Ids follow the rows' order: one statement takes its ids from the sequence (or autoincrement
counter) as it inserts its rows, in the order they come (the ``ORDER BY`` on PostgreSQL), so
the ids returned, sorted, are the rows' ids in order. SQLAlchemy's own ``insertmanyvalues``
sorts on the same assumption.

Dedupe keys: the rows without one go in bulk as above. Each key is looked up once (its active
job's id is the answer), and the rows whose key has no active job go in their own statement:
``ON CONFLICT (dedupe_key) DO NOTHING`` on PostgreSQL and SQLite (a key another transaction
inserted meanwhile is looked up again, after that transaction's end: the unique index makes
the INSERT wait for it); on MariaDB/MySQL a duplicate key rolls back that statement alone, and
the rows go again one by one, a duplicate's holder read with a locking read.
"""

from __future__ import annotations

import functools
import importlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any

from sqlalchemy import Connection, Dialect, bindparam, insert, select
from sqlalchemy.exc import IntegrityError

from .._errors import SchedulerError
from .tables import jobs

#: The columns a bulk insert writes, in this order.
COLUMNS = (
    "handler",
    "payload",
    "queue",
    "priority",
    "run_at",
    "state",
    "attempts",
    "max_attempts",
    "dedupe_key",
    "task_name",
    "created_at",
    "traceparent",
    "tenant",
)
_KEY = COLUMNS.index("dedupe_key")

#: Rows per statement, at most (PostgreSQL: arrays have no parameter limit).
PG_CHUNK = 5_000
VALUES_CHUNK = 1_000
#: Payload bytes per statement, at most (MariaDB's ``max_allowed_packet`` is 16 MiB by default).
CHUNK_BYTES = 4 * 1024 * 1024
_ROUNDS = 5


def upsert_statement(dialect: Dialect) -> Any | None:
    """``INSERT … ON CONFLICT (dedupe_key) DO NOTHING RETURNING id`` where the engine has it
    (PostgreSQL, SQLite), else None."""
    if dialect.name not in ("postgresql", "sqlite") or not dialect.insert_returning:
        return None
    return _upsert(dialect.name)


def upsert_by_name(name: str) -> Any:
    """:func:`upsert_statement` of the dialect called ``name`` ("postgresql" or "sqlite")."""
    return _upsert(name)


@functools.cache
def _upsert(name: str) -> Any:
    # Imported here, once per dialect: a dialect the process does not use stays unloaded
    # (PostgreSQL's would cost a command on SQLite ~20 ms of its start-up).
    make = importlib.import_module(f"sqlalchemy.dialects.{name}").insert
    return (
        make(jobs)
        .on_conflict_do_nothing(
            index_elements=[jobs.c.dedupe_key], index_where=jobs.c.dedupe_key.is_not(None)
        )
        .returning(jobs.c.id)
    )


_HOLDERS = select(jobs.c.id, jobs.c.dedupe_key).where(
    jobs.c.dedupe_key.in_(bindparam("p_keys", expanding=True))
)


def insert_many(
    conn: Connection, items: Sequence[dict[str, Any]], *, citus: bool = False
) -> list[int]:
    """The ids of ``items`` (job values, as ``jobs.new_job_values`` makes them), inserted on
    ``conn`` in its transaction (``citus``: the database has Citus); see the module's
    docstring."""
    ids: list[int | None] = [None] * len(items)
    first: dict[str, int] = {}  # dedupe key -> index of the first item that has it
    plain: list[int] = []
    for index, item in enumerate(items):
        key = item.get("dedupe_key")
        if key is None:
            plain.append(index)
        else:
            first.setdefault(key, index)
    writer = _Writer(conn, citus=citus)
    for chunk in writer.chunks([_row(items[i]) for i in plain]):
        for index, job_id in zip(
            plain[chunk.start : chunk.stop], writer.insert(chunk.rows), strict=True
        ):
            ids[index] = job_id
    if first:
        held = _dedupe(conn, writer, {key: _row(items[i]) for key, i in first.items()})
        for index, item in enumerate(items):
            key = item.get("dedupe_key")
            if key is not None:
                ids[index] = held[key]
    assert all(job_id is not None for job_id in ids)
    return [int(job_id) for job_id in ids if job_id is not None]


def _row(values: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(map(values.get, COLUMNS))


def _holders(conn: Connection, keys: Sequence[str], *, locked: bool = False) -> dict[str, int]:
    found: dict[str, int] = {}
    statement = _HOLDERS.with_for_update(read=True) if locked else _HOLDERS
    for start in range(0, len(keys), VALUES_CHUNK):
        part = list(keys[start : start + VALUES_CHUNK])
        found.update(
            (key, int(job_id)) for job_id, key in conn.execute(statement, {"p_keys": part})
        )
    return found


def _dedupe(conn: Connection, writer: _Writer, rows: dict[str, tuple[Any, ...]]) -> dict[str, int]:
    """Key -> active job id for every key of ``rows``, inserting the rows whose key has none."""
    held = _holders(conn, list(rows))
    for _ in range(_ROUNDS):
        missing = [rows[key] for key in rows if key not in held]
        if not missing:
            return held
        for chunk in writer.chunks(missing):
            held.update(writer.insert_keyed(chunk.rows))
        lost = [key for key in rows if key not in held]  # inserted meanwhile by another
        if lost:
            held.update(_holders(conn, lost, locked=writer.family == "mysql"))
    raise _changing(next(key for key in rows if key not in held))


def _changing(key: str) -> Exception:
    return SchedulerError(f"could not enqueue with dedupe key {key!r}: it kept changing hands")


class _Chunk:
    __slots__ = ("rows", "start", "stop")

    def __init__(self, rows: list[tuple[Any, ...]], start: int, stop: int) -> None:
        self.rows, self.start, self.stop = rows, start, stop


_PLACEHOLDER = {"qmark": "?", "format": "%s", "pyformat": "%s"}


class _Writer:
    """The SQL of one connection's dialect, and its values' conversions."""

    def __init__(self, conn: Connection, *, citus: bool = False) -> None:
        self.conn = conn
        dialect = conn.dialect
        self.dialect = dialect
        self.family = "mysql" if dialect.name in ("mysql", "mariadb") else dialect.name
        self.placeholder = _PLACEHOLDER.get(dialect.paramstyle)
        self.returning = bool(dialect.insert_returning)
        # PostgreSQL's arrays (unnest), but on Citus (see the module's docstring)
        self.arrays = self.family == "postgresql" and self.placeholder == "%s" and not citus
        if self.arrays:
            self.rows_per_chunk = PG_CHUNK
        elif self.family == "sqlite":  # its limit on parameters in one statement
            most = 32_766 if sqlite3.sqlite_version_info >= (3, 32) else 999
            self.rows_per_chunk = min(VALUES_CHUNK, most // len(COLUMNS))
        else:
            self.rows_per_chunk = VALUES_CHUNK
        quote = dialect.identifier_preparer.quote
        self.table = quote(jobs.name)
        self.columns = ", ".join(quote(column) for column in COLUMNS)
        self.processors: list[tuple[int, Callable[[Any], Any]]] = [
            (i, p)
            for i, column in enumerate(COLUMNS)
            if (p := jobs.c[column].type.dialect_impl(dialect).bind_processor(dialect)) is not None
        ]
        self._autoinc_consecutive: bool | None = None

    def chunks(self, rows: list[tuple[Any, ...]]) -> Iterator[_Chunk]:
        payload = COLUMNS.index("payload")
        start = size = 0
        for index, row in enumerate(rows):
            size += len(row[payload])
            if index - start >= self.rows_per_chunk or (size > CHUNK_BYTES and index > start):
                yield _Chunk(rows[start:index], start, index)
                start, size = index, len(row[payload])
        if start < len(rows):
            yield _Chunk(rows[start:], start, len(rows))

    def _columns(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The values column by column, each through its processor once per distinct value."""
        columns = list(zip(*rows, strict=True))
        for i, process in self.processors:
            done = {v: None if v is None else process(v) for v in set(columns[i])}
            columns[i] = tuple(map(done.__getitem__, columns[i]))
        return columns

    def _sql(self, count: int, keyed: bool) -> str:
        conflict = (
            " ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING"
            if keyed and self.family in ("postgresql", "sqlite")
            else ""
        )
        returning = " RETURNING id, dedupe_key" if self.returning else ""
        if self.arrays:
            names = ", ".join(f"c{i}" for i in range(len(COLUMNS)))
            # psycopg 3 sends the arrays in binary (%b): no text quoting of 10,000 values
            mark = "%b" if self.dialect.driver == "psycopg" else "%s"
            arrays = ", ".join(
                f"{mark}::{jobs.c[column].type.compile(dialect=self.dialect)}[]"
                for column in COLUMNS
            )
            return (
                f"INSERT INTO {self.table} ({self.columns}) SELECT {names}"
                f" FROM unnest({arrays}) WITH ORDINALITY AS r({names}, n) ORDER BY n"
                f"{conflict}{returning}"
            )
        marks = "(" + ", ".join([self.placeholder or "?"] * len(COLUMNS)) + ")"
        values = ", ".join([marks] * count)
        return f"INSERT INTO {self.table} ({self.columns}) VALUES {values}{conflict}{returning}"

    def _execute(self, rows: list[tuple[Any, ...]], keyed: bool) -> list[tuple[int, str | None]]:
        columns = self._columns(rows)
        sql = self._sql(len(rows), keyed)
        if self.arrays:
            params: tuple[Any, ...] = tuple(list(column) for column in columns)
        else:
            params = tuple(chain.from_iterable(zip(*columns, strict=True)))
        result = self.conn.exec_driver_sql(sql, params)
        return [(int(job_id), key) for job_id, key in result.all()]

    def insert(self, rows: list[tuple[Any, ...]]) -> list[int]:
        """Ids of ``rows`` (no dedupe keys), in their order."""
        if self.placeholder is None:  # a driver with named parameters only: one by one
            return [self._one(row) for row in rows]
        if self.returning:
            return sorted(job_id for job_id, _key in self._execute(rows, keyed=False))
        if self.family != "mysql" or not self._consecutive():
            return [self._one(row) for row in rows]
        columns = self._columns(rows)
        params = tuple(chain.from_iterable(zip(*columns, strict=True)))
        result = self.conn.exec_driver_sql(self._sql(len(rows), keyed=False), params)
        first = int(result.lastrowid)  # LAST_INSERT_ID(): the statement's first id
        return list(range(first, first + len(rows)))

    def insert_keyed(self, rows: list[tuple[Any, ...]]) -> dict[str, int]:
        """Key -> id of the rows inserted; a row whose key is taken is left out."""
        if self.placeholder is not None and self.returning:
            if self.family in ("postgresql", "sqlite"):  # ON CONFLICT DO NOTHING
                return {key: job_id for job_id, key in self._execute(rows, keyed=True) if key}
            if self.family == "mysql":
                try:
                    return {key: job_id for job_id, key in self._execute(rows, keyed=True) if key}
                except IntegrityError:
                    pass  # InnoDB rolled back this statement only: one by one
        inserted: dict[str, int] = {}
        for row in rows:
            try:
                inserted[row[_KEY]] = self._one(row, guarded=True)
            except IntegrityError:
                continue  # held by another job: read by the caller
        return inserted

    def _one(self, row: tuple[Any, ...], guarded: bool = False) -> int:
        values = dict(zip(COLUMNS, row, strict=True))
        if guarded and self.family != "mysql":
            with self.conn.begin_nested():  # a failed INSERT must not abort the transaction
                result = self.conn.execute(insert(jobs), values)
        else:  # InnoDB rolls back a failed statement alone
            result = self.conn.execute(insert(jobs), values)
        key = result.inserted_primary_key
        assert key is not None
        return int(key[0])

    def _consecutive(self) -> bool:
        """MySQL: whether one INSERT's autoincrement ids are consecutive (lock mode 0 or 1)."""
        if self._autoinc_consecutive is None:
            mode = self.conn.exec_driver_sql("SELECT @@innodb_autoinc_lock_mode").scalar()
            self._autoinc_consecutive = mode is not None and int(mode) in (0, 1)
        return self._autoinc_consecutive
