"""``scheduler migrate --reshard`` (PostgreSQL): move every row from the shards the database
has to the ``[database] shards = N`` the file asks, with the workers stopped.

The *sources* are every set of the scheduler's tables the database holds: the tables without
shards in the connection's own schema (the layout of one shard) and each shard schema
``scheduler_shard_K``. The *targets* are the layout asked: shards ``0..N-1``, or with
``N = 1`` the tables in the connection's own schema. Each row goes to the shard its routing key
hashes to (:func:`.shards.routing_key`, :func:`.shards.shard_of`):

- a task (``scheduler_rows``): its tenant, else its name;
- a job: its task's shard (when the task is in the same source), else its tenant, else its
  task's name, else its handler's name (a job of no task);
- a run: its job's shard; a limit's hold: its job's; either of no job (purged): shard 0;
- a decision: its task's shard, else its job's, else its task name's;
- an audit entry: its target's (a task's name, or ``job ID``), else shard 0 (``queue NAME``,
  ``sync``, a removed task's).

The tables every shard has a copy of are merged into every target, a row once per key:
the paused queues (``scheduler_paused_queues``, by queue: a pause is every shard's), the
handlers' recorded settings (``scheduler_handlers``, by name, the latest registration wins),
the limits' lock rows (``scheduler_limits``, by name) and the presence rows of the (stopped)
workers and the hosts' tick records (``scheduler_workers``, by id). The version table is each
target's own (its migration writes it).

Ids keep their values (unique across shards), then each target's sequences restart above the
largest id any shard holds or any sequence gave (:func:`.shards.start_sequences`'s
``floor``), so new ids are fresh and still tell their shard.

Crash safety: the move is one transaction per source (its rows out to their targets, and a
source that is not a target dropped, in the same transaction), so a failure at any point
leaves every row exactly once, in its old shard or its new one. A marker table
(:data:`MARKER`, in the connection's own schema) is written before anything else and dropped
last: while it exists every command refuses the database (:func:`.shards.layout_error`) until
``migrate --reshard`` runs again and finishes (with any ``shards``: sources are whatever
holds the tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, Table, text

from .._errors import ConfigError, SchedulerError, SchemaOutdated
from .._model.rules import CLAIMED, Thresholds
from . import migrate as _migrate
from . import shards as _shards
from .engine import Store
from .status.health import TICK_SUFFIX
from .tables import (
    audit,
    decisions,
    handlers,
    jobs,
    limit_holds,
    limits,
    metadata,
    paused_queues,
    rows,
    runs,
    workers,
)

MARKER = _shards.RESHARD_MARKER
"""The table that says a reshard has started and not finished (in the connection's own
schema): one row, the shards asked and the id floor measured before anything moved."""

ROUTED: tuple[Table, ...] = (rows, jobs, runs, decisions, audit, limit_holds)
"""The tables whose rows each go to one shard (see the module's docstring)."""

SHARED: dict[str, str] = {
    paused_queues.name: "queue",
    handlers.name: "name",
    limits.name: "name",
    workers.name: "id",
}
"""The tables each shard has a copy of, merged into every target: table -> its key."""

COMMAND = "migrate --reshard"


@dataclass
class Reshard:
    """What :func:`reshard` did."""

    before: int
    """Shards the database had (1: the tables without shards)."""
    after: int
    """Shards it has now (``[database] shards``)."""
    fitted: bool = False
    """The layout already fitted: nothing was written."""
    moved: dict[str, int] = field(default_factory=dict)
    """Rows moved to another shard, by table."""
    rows: dict[str, int] = field(default_factory=dict)
    """Rows of the routed tables, by table (the same before and after)."""
    dropped: list[str] = field(default_factory=list)
    """The schemas (or the own schema's tables) dropped once emptied."""
    id_floor: int = 0
    """The sequences of every shard now give ids above this."""

    def summary(self) -> str:
        if self.fitted:
            return (
                f"the database already has the layout of [database] shards = {self.after}:"
                " nothing to move"
            )
        parts = ", ".join(
            f"{label} {self.moved.get(name, 0)} of {self.rows.get(name, 0)}"
            for name, label in LABELS.items()
        )
        dropped = f"; dropped {', '.join(self.dropped)}" if self.dropped else ""
        return (
            f"resharded from {_shards_word(self.before)} to {_shards_word(self.after)}:"
            f" moved {parts} (the others stayed in their shard){dropped}; new ids start"
            f" above {self.id_floor}"
        )


LABELS = {
    rows.name: "tasks",
    jobs.name: "jobs",
    runs.name: "runs",
    decisions.name: "decisions",
    audit.name: "audit entries",
    limit_holds.name: "limit holds",
}


def _shards_word(count: int) -> str:
    return "1 shard (no shard schemas)" if count == 1 else f"{count} shards"


@dataclass(frozen=True)
class _Source:
    schema: str
    revision: str | None  # None: no tables (a schema created, not migrated)
    base: bool  # the connection's own schema (the tables without shards)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _t(schema: str, table: str) -> str:
    return f"{_q(schema)}.{_q(table)}"


def _cols(table: Table) -> str:
    return ", ".join(_q(c.name) for c in table.columns)


def reshard(
    store: Store,
    shard_stores: Sequence[Store],
    *,
    now: datetime,
    worker_gone: float = Thresholds.worker_gone,
) -> Reshard:
    """Move the rows to ``len(shard_stores)`` shards (see the module's docstring). `store`:
    the database's own engine (the connection's own schema); `shard_stores`: each target
    shard's (with one shard: `store` itself). Refuses (a :class:`SchedulerError`, nothing
    written) on another engine than PostgreSQL, while a worker is alive or a job claimed, on
    a schema not at the head revision, or when two rows would collide in one shard."""
    count = len(shard_stores)
    if store.caps.dialect != "postgresql":
        raise ConfigError(
            f"{COMMAND}: shards are schemas of one PostgreSQL database (Citus included);"
            f" this database is {store.caps.dialect}: there is nothing to reshard"
        )
    head = _migrate.head_revision()
    with store.read() as conn:
        own = str(conn.execute(text("SELECT current_schema()")).scalar_one())
        found, base, _ = _shards.layout(conn)
        marker = _marker(conn, own)
        targets = [own] if count == 1 else [_shards.schema_name(i) for i in range(count)]
        before = len(found) if found else 1
        fits = found == [] if count == 1 else found == list(range(count)) and not base
        if fits and marker is None:
            return Reshard(before=before, after=count, fitted=True)
        sources = [_Source(own, _revision(conn, own), True)] if base else []
        sources += [
            _Source(name, _revision(conn, name), False)
            for name in (_shards.schema_name(i) for i in found)
        ]
        if not any(s.revision is not None for s in sources) and marker is None:
            raise SchemaOutdated(
                f"{COMMAND}: the database has none of the scheduler's tables yet: create"
                " them with `scheduler migrate`"
            )
        _check_sources(sources, head)
        filled = [s for s in sources if s.revision is not None]
        _check_stopped(conn, filled, now, worker_gone)
        _check_collisions(conn, filled, count)
        floor = max(_id_floor(conn, [s.schema for s in filled]), marker or 0)
        counted = {t.name: _count(conn, filled, t) for t in ROUTED}

    result = Reshard(before=before, after=count, id_floor=floor, rows=counted)
    with store.begin() as conn:  # from here on, an unfinished reshard is refused
        conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {_t(own, MARKER)} (shards integer NOT NULL,"
                " id_floor bigint NOT NULL, started_at timestamp NOT NULL)"
            )
        )
        conn.execute(text(f"DELETE FROM {_t(own, MARKER)}"))
        conn.execute(
            text(f"INSERT INTO {_t(own, MARKER)} VALUES (:count, :floor, :now)"),
            {"count": count, "floor": floor, "now": now.replace(tzinfo=None)},
        )
    # The targets' tables (growing: new schemas; shrinking to one: the own schema's tables).
    if count > 1:
        _shards.create_schemas(store.engine, count)
    for index, target in enumerate(shard_stores):
        _migrate.migrate_to(target)
        if count > 1:
            with target.begin() as conn:
                _shards.start_sequences(conn, index, count)

    for source in sources:
        with store.begin() as conn:
            if source.revision is not None:
                moved = _move(conn, source.schema, targets)
                for name, number in moved.items():
                    result.moved[name] = result.moved.get(name, 0) + number
            if source.schema not in targets:
                _drop(conn, source)
                result.dropped.append(
                    source.schema if not source.base else f"the tables in {source.schema}"
                )

    for index, target in enumerate(shard_stores):
        with target.begin() as conn:
            _shards.start_sequences(conn, index, count, floor=floor)
    with store.begin() as conn:
        conn.execute(text(f"DROP TABLE {_t(own, MARKER)}"))
    return result


def _marker(conn: Connection, own: str) -> int | None:
    """The id floor an unfinished reshard recorded (None: none started)."""
    if conn.execute(text("SELECT to_regclass(:name)"), {"name": _t(own, MARKER)}).scalar():
        floor = conn.execute(text(f"SELECT max(id_floor) FROM {_t(own, MARKER)}")).scalar()
        return int(floor or 0)
    return None


def _revision(conn: Connection, schema: str) -> str | None:
    table = _t(schema, _migrate.VERSION_TABLE)
    if not conn.execute(text("SELECT to_regclass(:name)"), {"name": table}).scalar():
        return None
    found = list(conn.execute(text(f"SELECT version_num FROM {table}")).scalars())
    return str(found[0]) if len(found) == 1 else None


def _check_sources(sources: list[_Source], head: str) -> None:
    """Refuse a source not at the head revision (its columns would not match the targets');
    a schema without tables (created, never migrated) has no rows: a target is migrated, any
    other dropped."""
    for source in sources:
        if source.revision is not None and source.revision != head:
            raise SchemaOutdated(
                f"{COMMAND}: {_where(source)} is at revision {source.revision}, this version needs"
                f" {head}: run `scheduler migrate` with the shards the database has first"
            )


def _check_stopped(
    conn: Connection, sources: list[_Source], now: datetime, worker_gone: float
) -> None:
    since = (now - timedelta(seconds=worker_gone)).replace(tzinfo=None)
    for source in sources:
        seen = conn.execute(
            text(
                f"SELECT id, last_seen_at FROM {_t(source.schema, workers.name)}"
                " WHERE id NOT LIKE :tick AND last_seen_at > :since ORDER BY last_seen_at DESC"
            ),
            {"tick": "%" + TICK_SUFFIX, "since": since},
        ).first()
        if seen is not None:
            ago = max(0.0, (now.replace(tzinfo=None) - seen.last_seen_at).total_seconds())
            raise SchedulerError(
                f"{COMMAND}: worker {seen.id} was seen {ago:.0f} s ago ({_where(source)}):"
                f" stop every worker first (one not seen for {worker_gone:g} s counts as"
                " stopped); nothing was moved"
            )
        claimed = conn.execute(
            text(f"SELECT count(*) FROM {_t(source.schema, jobs.name)} WHERE state = :claimed"),
            {"claimed": str(CLAIMED)},
        ).scalar_one()
        if claimed:
            raise SchedulerError(
                f"{COMMAND}: {claimed} job(s) are claimed or running ({_where(source)}):"
                " let them finish before stopping the workers (`scheduler worker --once` takes"
                " over the leases of a worker that died and runs them); nothing was moved"
            )


def _where(source: _Source) -> str:
    return "the tables without shards" if source.base else f"schema {source.schema}"


def _check_collisions(conn: Connection, sources: list[_Source], count: int) -> None:
    """Refuse two tasks of one name, or two active jobs of one dedupe key bound for the same
    shard (each is unique within a shard)."""
    names: dict[str, str] = {}
    for source in sources:
        for (name,) in conn.execute(text(f"SELECT name FROM {_t(source.schema, rows.name)}")):
            if name in names:
                raise SchedulerError(
                    f"{COMMAND}: task {name!r} is in {names[name]} and in {_where(source)}:"
                    " remove one of them first; nothing was moved"
                )
            names[name] = _where(source)
    keys: dict[tuple[int, str], int] = {}
    for source in sources:
        found = conn.execute(
            text(
                f"SELECT j.id, j.dedupe_key, coalesce(r.tenant, r.name),"
                f" coalesce(j.tenant, j.task_name, j.handler)"
                f" FROM {_t(source.schema, jobs.name)} j"
                f" LEFT JOIN {_t(source.schema, rows.name)} r ON r.name = j.task_name"
                " WHERE j.dedupe_key IS NOT NULL"
            )
        )
        for job_id, key, task_key, job_key in found:
            shard = _shards.shard_of(task_key if task_key is not None else job_key, count)
            other = keys.setdefault((shard, key), job_id)
            if other != job_id:
                raise SchedulerError(
                    f"{COMMAND}: jobs {other} and {job_id} both hold dedupe key {key!r} and"
                    f" would both be in shard {shard}: cancel one, or let it finish, first;"
                    " nothing was moved"
                )


def _id_floor(conn: Connection, schemas: list[str]) -> int:
    """The largest id any source holds or any of its sequences gave."""
    floor = conn.execute(
        text(
            "SELECT coalesce(max(last_value), 0) FROM pg_sequences WHERE schemaname = ANY(:schemas)"
        ),
        {"schemas": schemas},
    ).scalar_one()
    highest = int(floor)
    for schema in schemas:
        for table in metadata.tables.values():
            if "id" in table.c and table.c.id.autoincrement is True:
                found = conn.execute(text(f"SELECT max(id) FROM {_t(schema, table.name)}"))
                highest = max(highest, int(found.scalar() or 0))
    return highest


def _count(conn: Connection, sources: list[_Source], table: Table) -> int:
    return sum(
        int(conn.execute(text(f"SELECT count(*) FROM {_t(s.schema, table.name)}")).scalar_one())
        for s in sources
    )


def _move(conn: Connection, schema: str, targets: list[str]) -> dict[str, int]:
    """Move `schema`'s rows that belong elsewhere to their targets and merge its shared
    tables into every other target, in the caller's transaction; the rows moved by table."""
    count = len(targets)
    for table in (*ROUTED, *(metadata.tables[name] for name in SHARED)):
        conn.execute(text(f"LOCK TABLE {_t(schema, table.name)} IN EXCLUSIVE MODE"))
    _routes(conn, schema, count)
    moved: dict[str, int] = {}
    for table in ROUTED:
        for index, target in enumerate(targets):
            if target == schema:
                continue  # its rows stay
            columns = _cols(table)
            done = conn.execute(
                text(
                    f"WITH moved AS (DELETE FROM {_t(schema, table.name)} x"
                    f" USING reshard_{table.name} r WHERE r.id = x.id AND r.shard = :shard"
                    f" RETURNING {', '.join('x.' + _q(c.name) for c in table.columns)})"
                    f" INSERT INTO {_t(target, table.name)} ({columns})"
                    f" SELECT {columns} FROM moved"
                ),
                {"shard": index},
            )
            moved[table.name] = moved.get(table.name, 0) + max(done.rowcount, 0)
        if schema not in targets:
            left = conn.execute(text(f"SELECT count(*) FROM {_t(schema, table.name)}")).scalar_one()
            if left:  # every row has a shard: this would be a defect, not lost rows
                raise SchedulerError(f"{COMMAND}: {left} row(s) of {table.name} found no shard")
    for name, key in SHARED.items():
        table = metadata.tables[name]
        columns = _cols(table)
        on_conflict = f"ON CONFLICT ({_q(key)}) DO NOTHING"
        if table is handlers:  # the latest registration's settings win
            changed = ", ".join(
                f"{_q(c.name)} = excluded.{_q(c.name)}" for c in table.columns if c.name != key
            )
            on_conflict = (
                f"ON CONFLICT ({_q(key)}) DO UPDATE SET {changed}"
                f" WHERE {_q(name)}.registered_at < excluded.registered_at"
            )
        for target in targets:
            if target != schema:
                conn.execute(
                    text(
                        f"INSERT INTO {_t(target, name)} AS {_q(name)} ({columns})"
                        f" SELECT {columns} FROM {_t(schema, name)} {on_conflict}"
                    )
                )
    return moved


def _routes(conn: Connection, schema: str, count: int) -> None:
    """The temporary tables ``reshard_<table>`` (id, shard) of `schema`'s routed rows, and
    ``reshard_keys`` (key, shard): every routing key's shard, computed here (CRC-32)."""
    keys: set[str] = set()
    for statement in (
        f"SELECT DISTINCT coalesce(tenant, name) FROM {_t(schema, rows.name)}",
        f"SELECT DISTINCT coalesce(tenant, task_name, handler) FROM {_t(schema, jobs.name)}",
        f"SELECT DISTINCT task_name FROM {_t(schema, decisions.name)}",
    ):
        keys.update(str(k) for k in conn.execute(text(statement)).scalars())
    conn.execute(
        text("CREATE TEMPORARY TABLE reshard_keys (key text PRIMARY KEY, shard int) ON COMMIT DROP")
    )
    if keys:
        conn.execute(
            text("INSERT INTO reshard_keys (key, shard) VALUES (:key, :shard)"),
            [{"key": k, "shard": _shards.shard_of(k, count)} for k in sorted(keys)],
        )
    routes = {
        rows.name: (
            f"SELECT x.id, k.shard FROM {_t(schema, rows.name)} x"
            " JOIN reshard_keys k ON k.key = coalesce(x.tenant, x.name)"
        ),
        jobs.name: (
            f"SELECT x.id, coalesce(t.shard, k.shard) FROM {_t(schema, jobs.name)} x"
            f" LEFT JOIN {_t(schema, rows.name)} r ON r.name = x.task_name"
            " LEFT JOIN reshard_scheduler_rows t ON t.id = r.id"
            " LEFT JOIN reshard_keys k ON k.key = coalesce(x.tenant, x.task_name, x.handler)"
        ),
        runs.name: (
            f"SELECT x.id, coalesce(j.shard, 0) FROM {_t(schema, runs.name)} x"
            " LEFT JOIN reshard_scheduler_jobs j ON j.id = x.job_id"
        ),
        decisions.name: (
            f"SELECT x.id, coalesce(t.shard, j.shard, k.shard, 0)"
            f" FROM {_t(schema, decisions.name)} x"
            f" LEFT JOIN {_t(schema, rows.name)} r ON r.name = x.task_name"
            " LEFT JOIN reshard_scheduler_rows t ON t.id = r.id"
            " LEFT JOIN reshard_scheduler_jobs j ON j.id = x.job_id"
            " LEFT JOIN reshard_keys k ON k.key = x.task_name"
        ),
        audit.name: (
            f"SELECT x.id, coalesce(t.shard, j.shard, 0) FROM {_t(schema, audit.name)} x"
            f" LEFT JOIN {_t(schema, rows.name)} r ON r.name = x.target"
            " LEFT JOIN reshard_scheduler_rows t ON t.id = r.id"
            " LEFT JOIN reshard_scheduler_jobs j ON j.id = CASE"
            " WHEN x.target ~ '^job [0-9]{1,18}$' THEN CAST(substr(x.target, 5) AS bigint) END"
        ),
        limit_holds.name: (
            f"SELECT x.id, coalesce(j.shard, 0) FROM {_t(schema, limit_holds.name)} x"
            " LEFT JOIN reshard_scheduler_jobs j ON j.id = x.job_id"
        ),
    }
    for table in ROUTED:  # in order: jobs' routes read the rows', the others the jobs'
        name = f"reshard_{table.name}"
        conn.execute(
            text(
                f"CREATE TEMPORARY TABLE {name} (id bigint PRIMARY KEY, shard int NOT NULL)"
                " ON COMMIT DROP"
            )
        )
        conn.execute(text(f"INSERT INTO {name} (id, shard) {routes[table.name]}"))
        conn.execute(text(f"ANALYZE {name}"))


def _drop(conn: Connection, source: _Source) -> None:
    """Drop an emptied source: a shard schema, or the own schema's tables (only the
    scheduler's: the schema may hold the application's own)."""
    if not source.base:
        conn.execute(text(f"DROP SCHEMA {_q(source.schema)} CASCADE"))
        return
    for table in [*reversed(metadata.sorted_tables), _migrate.VERSION_TABLE]:
        name = table if isinstance(table, str) else table.name
        conn.execute(text(f"DROP TABLE IF EXISTS {_t(source.schema, name)} CASCADE"))
