"""Shards (``[database] shards = N``, PostgreSQL): the scheduler's tables once per shard, in
the schemas ``scheduler_shard_0`` … ``scheduler_shard_{N-1}`` of one database.

A task, and every job, run and decision of it, lives in one shard: the one its routing key
hashes to (:func:`shard_of`): its ``tenant``, else its name (a job of no task: its handler's
name). Each shard is a whole set of tables with its own engine, whose connections find the
unqualified tables in the shard's schema (``search_path``, set by the connection's start-up
options, and behind a transaction pooler by each transaction's settings as well), so every
statement of the tick, the claim, the enqueue, a heartbeat and an outcome touches one shard,
and on Citus (whose schema-based sharding makes each schema a *distributed schema*, placed on
one worker node) runs on one node. ``shards = 1`` is the layout without shard schemas.

Ids are unique across shards: shard ``k``'s sequences give the ids ``i`` with ``i - 1 = k``
modulo ``N`` (:func:`start_sequences`), so a job id names its shard (:func:`shard_of_id`)
unless a reshard moved the job; a lookup by id that misses there asks the other shards.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

from .._errors import ConfigError

SCHEMA_PREFIX = "scheduler_shard_"

CITUS_SETTING = "citus.enable_schema_based_sharding"

VERSION_TABLE = "scheduler_alembic_version"
"""``migrate.VERSION_TABLE``, spelled here: ``migrate`` imports the store, which imports this
module (tests/store/test_reshard.py checks they are the same)."""

RESHARD_MARKER = "scheduler_reshard"
"""The table in the connection's own schema that ``migrate --reshard`` writes first and drops
last (``_store/reshard.py``): while it exists, a reshard did not finish."""

_FOUND = text(
    "SELECT nspname, nspname = current_schema() FROM pg_namespace WHERE nspname LIKE :prefix"
    " ORDER BY nspname"
).bindparams(prefix=SCHEMA_PREFIX.replace("_", r"\_") + "%")


def schema_name(index: int) -> str:
    """Shard `index`'s schema."""
    return f"{SCHEMA_PREFIX}{index}"


def routing_key(tenant: str | None, name: str) -> str:
    """What a task's or job's shard is chosen by: its tenant, else `name` (the task's, or for
    a job of no task its handler's)."""
    return tenant if tenant is not None else name


def shard_of(key: str, count: int) -> int:
    """The shard of routing `key` among `count` (CRC-32 of its UTF-8 bytes, modulo `count`:
    the same in every process, on every host and Python version)."""
    if count <= 1:
        return 0
    return zlib.crc32(key.encode("utf-8")) % count


def shard_of_id(row_id: int, count: int) -> int:
    """The shard whose sequence gave `row_id`: where the row is, unless a reshard moved it
    (ids made before the reshard keep their number)."""
    return (row_id - 1) % count if count > 1 else 0


def shard_url(url: str, schema: str) -> str:
    """`url` with its connections' ``search_path`` set to `schema` (libpq's start-up
    ``options``; any ``search_path`` the URL's options set is replaced, other options stay)."""
    parsed = make_url(url)
    options = str(parsed.query.get("options", ""))
    kept = _without_search_path(unquote(options))
    options = " ".join([*kept, f"-csearch_path={schema}"])
    return parsed.update_query_dict({"options": options}).render_as_string(hide_password=False)


def _without_search_path(options: str) -> list[str]:
    words = options.split()
    kept: list[str] = []
    skip = False
    for index, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word.startswith("-csearch_path=") or word.startswith("--search_path="):
            continue
        following = words[index + 1] if index + 1 < len(words) else ""
        if word == "-c" and following.startswith("search_path="):
            skip = True
            continue
        kept.append(word)
    return kept


def found_shards(conn: Connection, but_own: bool = False) -> list[int]:
    """The indexes of the shard schemas the database holds (any, migrated or not). With
    `but_own` (the check of a one-shard scheduler): none when the connection's own schema is
    one of them, since a scheduler whose ``search_path`` is a shard's schema works in that
    shard alone (as one shard's Scheduler of a sharded one does, and the tests' Citus engine)."""
    found: list[int] = []
    for name, own in conn.execute(_FOUND).all():
        if own and but_own:
            return []
        suffix = str(name)[len(SCHEMA_PREFIX) :]
        if suffix.isdigit() and str(int(suffix)) == suffix:
            found.append(int(suffix))
    return sorted(found)


def parse_range(value: str, count: int, where: str = "worker --shards") -> tuple[int, ...]:
    """The shards a ``--shards`` value names: ``0-3``, ``1,3`` or ``2`` (each in 0..count-1);
    a ConfigError naming `where` otherwise."""
    chosen: list[int] = []
    for part in (p.strip() for p in value.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise ConfigError(f"{where}: {value!r} is not a list of shards (e.g. 0-3 or 0,2)")
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        if high < low or high >= count:
            raise ConfigError(
                f"{where}: {part!r} is outside the database's shards 0-{count - 1}"
                f" ([database] shards = {count})"
            )
        chosen.extend(i for i in range(low, high + 1) if i not in chosen)
    return tuple(chosen)


def create_schemas(engine: Engine, count: int) -> None:
    """Create the shard schemas that do not exist yet (on Citus: as distributed schemas,
    which needs ``citus.enable_schema_based_sharding`` on; a ConfigError if it is off)."""
    with engine.begin() as conn:
        citus = bool(conn.execute(text(_CITUS)).scalar())
        if citus:
            setting = conn.execute(
                text("SELECT current_setting(:name, true)"), {"name": CITUS_SETTING}
            ).scalar()
            if str(setting).lower() not in ("on", "true", "1"):
                raise ConfigError(
                    f"[database] shards = {count} on Citus needs schema-based sharding:"
                    f" set {CITUS_SETTING} = on (ALTER SYSTEM, or in the server's"
                    " configuration) and run `scheduler migrate` again"
                )
        existing = set(found_shards(conn))
        for index in range(count):
            if index not in existing:
                conn.execute(text(f"CREATE SCHEMA {schema_name(index)}"))


_CITUS = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"

_SEQUENCES = text(
    "SELECT format('%I.%I', schemaname, sequencename), coalesce(last_value, 0), increment_by"
    " FROM pg_sequences WHERE schemaname = current_schema()"
)


def next_id(last: int, index: int, count: int) -> int:
    """The first id after `last` that is shard `index`'s among `count` (``id - 1`` is
    `index` modulo `count`)."""
    return last + 1 + (index - last) % count


def start_sequences(conn: Connection, index: int, count: int, floor: int = 0) -> None:
    """Make shard `index`'s sequences give its own ids among `count` shards: from the first
    such id after both their last value and `floor` (a reshard's: the largest id any shard
    holds), by steps of `count` (run by ``migrate`` in the shard, after its tables).

    On Citus a distributed schema's sequences cannot be altered ("Altering a distributed
    sequence is currently not supported"): the step is changed on the coordinator alone
    (``citus.enable_ddl_propagation`` off for the transaction), which is where Citus takes
    ``nextval`` for every statement sent through it (each worker node's copy of the sequence
    keeps its own range, for inserts made on that node directly; the scheduler makes none)."""
    citus: bool | None = None
    for sequence, last, step in conn.execute(_SEQUENCES).all():
        last = max(int(last), floor)
        if int(step) == count and floor == 0 and (last == 0 or (last - 1) % count == index):
            continue  # there already
        if int(step) != count:
            if citus is None:
                citus = bool(conn.execute(text(_CITUS)).scalar())
                if citus:
                    conn.execute(text("SET LOCAL citus.enable_ddl_propagation TO off"))
            conn.execute(text(f"ALTER SEQUENCE {sequence} INCREMENT BY {count}"))
        conn.execute(
            text("SELECT setval(:seq, :value, false)"),
            {"seq": sequence, "value": next_id(last, index, count)},
        )


def layout_error(
    found: Sequence[int], count: int, base_tables: bool, resharding: bool = False
) -> str | None:
    """Why the database's shards (`found`; `base_tables`: the scheduler's tables exist outside
    them; `resharding`: a ``migrate --reshard`` did not finish) do not fit ``[database] shards
    = count``, or None if they do."""
    wanted = list(range(count))
    if resharding and count > 1:
        return (
            "a `scheduler migrate --reshard` started and did not finish: run it again (with"
            " the workers stopped) to finish moving the rows"
        )
    if count == 1:
        if found:
            return (
                f"the database holds {len(found)} shard schema(s) ({_names(found)}) but"
                " [database] shards = 1: set shards to their number, or run"
                " `scheduler migrate --reshard` with the workers stopped to move their rows back"
            )
        return None
    if list(found) == wanted:
        return None
    if not found and not base_tables:
        return None  # nothing yet: `migrate` creates them
    held = f"{len(found)} shard(s)" if found else "the tables without shards (shards = 1)"
    return (
        f"the database holds {held}, [database] shards = {count}: run"
        " `scheduler migrate --reshard` with the workers stopped to move the rows"
    )


def _names(found: Iterable[int]) -> str:
    return ", ".join(schema_name(i) for i in found)


def layout(conn: Connection) -> tuple[list[int], bool, bool]:
    """The shard schemas the database holds, whether the scheduler's tables exist in the
    connection's own schema (the layout without shards), and whether a reshard is unfinished
    (its marker table is there)."""
    base, resharding = conn.execute(
        text(
            "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema()"
            " AND tablename = :version), EXISTS (SELECT 1 FROM pg_tables"
            " WHERE schemaname = current_schema() AND tablename = :marker)"
        ),
        {"version": VERSION_TABLE, "marker": RESHARD_MARKER},
    ).one()
    return found_shards(conn), bool(base), bool(resharding)
