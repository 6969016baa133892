"""Scheduler rows: the read-only view, TOML sync, and enable / disable / trigger."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    Connection,
    Text,
    any_,
    bindparam,
    case,
    delete,
    func,
    insert,
    select,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError

from .._errors import ConfigError, SchedulerError, UnknownRow
from .._model import probes as _probes
from .._model.payload import decode_payload
from .._model.rows import CREATED, UPDATED, SyncPlan, TaskChange, TaskRow
from .._model.rules import MANUAL, PROBE_INTERVALS
from . import decisions as _decisions
from . import jobs as _jobs
from .tables import jobs, rows

# The model's slot and check modules (croniter's callers) are imported by the functions that
# use them: `scheduler status` reads rows and needs neither.

REASON_MANUAL = "manual"
REASON_CONFIG = "disabled_in_config"
REASON_REMOVED = "removed_from_config"
# Disables that the file put there and the file may lift again.
_CONFIG_REASONS = (REASON_CONFIG, REASON_REMOVED)


# The row's columns a TaskRow shows, and no others (each timestamp read costs a conversion).
_VIEWED = (*(f.name for f in fields(TaskRow) if f.name in rows.c), "task_group")


def _select_rows(*, payloads: bool = True) -> Any:
    return select(
        *(rows.c[c] for c in _VIEWED if payloads or c != "payload"),
        jobs.c.state.label("last_job_state"),
        jobs.c.last_error_code.label("last_job_error"),
    ).select_from(rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id))


def _view(r: Any) -> TaskRow:
    m = r._mapping
    return TaskRow(
        name=m["name"],
        handler=m["handler"],
        payload=decode_payload(m["payload"]) if "payload" in m else {},
        cron=m["cron"],
        timezone=m["timezone"],
        concurrent=bool(m["concurrent"]),
        enabled=bool(m["enabled"]),
        next_run_at=m["next_run_at"],
        last_job_id=m["last_job_id"],
        last_job_state=m["last_job_state"],
        consecutive_failures=m["consecutive_failures"],
        max_consecutive_failures=m["max_consecutive_failures"],
        disabled_reason=m["disabled_reason"],
        disabled_at=m["disabled_at"],
        version=m["version"],
        last_error_code=m["last_job_error"],
        overlap=m["overlap"],
        catchup_window=m["catchup_window"],
        jitter=m["jitter"],
        disabled_note=m["disabled_note"],
        tenant=m["tenant"],
        source=m["source"],
        group=m["task_group"],
        recovery=m["recovery"],
        probe_at=m["probe_at"],
        probes=m["probes"],
        probe_intervals=_probes.decode_intervals(m["probe_intervals"]),
        timeout=m["timeout"],
    )


def _timeout(task: Any) -> float | None:
    """A task's ``timeout`` as stored (a float; None: its handler's)."""
    value = getattr(task, "timeout", None)
    return None if value is None else float(value)


def task_timeouts(conn: Connection, names: Iterable[str]) -> dict[str, float]:
    """The ``timeout`` of each of the tasks ``names`` that has one (0: no limit)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    found = conn.execute(
        select(rows.c.name, rows.c.timeout).where(
            rows.c.name.in_(wanted), rows.c.timeout.is_not(None)
        )
    )
    return {name: float(timeout) for name, timeout in found}


def get_row(conn: Connection, name: str) -> TaskRow | None:
    found = conn.execute(_select_rows().where(rows.c.name == name)).first()
    return _view(found) if found is not None else None


def all_rows(conn: Connection, *, payloads: bool = True) -> list[TaskRow]:
    """Every row, by name; without ``payloads`` their views' payloads are empty (``status``,
    which shows none: decoding 10,000 of them was a third of its time)."""
    return [_view(r) for r in conn.execute(_select_rows(payloads=payloads).order_by(rows.c.name))]


def rows_after(
    conn: Connection, after: str | None, limit: int, *, payloads: bool = True
) -> list[TaskRow]:
    """The next ``limit`` rows by name after ``after`` (from the first if None): a page of a
    walk through every row in flat memory (``status --json``)."""
    stmt = _select_rows(payloads=payloads).order_by(rows.c.name).limit(limit)
    if after is not None:
        stmt = stmt.where(rows.c.name > after)
    return [_view(r) for r in conn.execute(stmt)]


def counted(conn: Connection) -> tuple[int, int]:
    """How many rows there are, and how many of them are enabled (one statement)."""
    enabled = func.sum(case((rows.c.enabled == true(), 1), else_=0))
    total, on = conn.execute(select(func.count(), enabled).select_from(rows)).one()
    return int(total), int(on or 0)


def _write(conn: Connection, name: str, now: datetime, **values: Any) -> None:
    result = conn.execute(
        update(rows)
        .where(rows.c.name == name)
        .values(version=rows.c.version + 1, updated_at=now, **values)
    )
    if result.rowcount != 1:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")


def _log_paused(
    conn: Connection, name: str, slots: list[datetime], more: int, reason: str, now: datetime
) -> None:
    from .._model import slots as _slots

    entries = [
        _decisions.entry_params(name, "paused", slot, now, None, reason, None) for slot in slots
    ]
    if more:
        entries[-1]["d_detail"] = f"and {more:,}{'+' if more >= _slots.PAUSED_COUNTED else ''} more"
    _decisions.write(conn, entries)


def enable(
    conn: Connection,
    name: str,
    now: datetime,
    paused: list[tuple[datetime, str]] | None = None,
) -> bool:
    """Re-enable: reset the failure count and re-arm from now. The slots that passed while the
    row was disabled are logged as ``paused`` (and appended to `paused`, for the signals)."""
    from .._model import slots as _slots

    row = get_row(conn, name)
    if row is None:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")
    if row.enabled:
        return False  # already enabled: keep its count and its (perhaps held-back) slot
    _write(
        conn,
        name,
        now,
        enabled=True,
        disabled_reason=None,
        disabled_at=None,
        disabled_note=None,
        consecutive_failures=0,
        next_run_at=_slots.first_run(row.cron, row.timezone, row.name, now, row.jitter),
        probe_at=None,
        probes=0,
    )
    slots, more = _slots.passed_slots(row, row.next_run_at, now)
    reason = row.disabled_reason or REASON_MANUAL
    _log_paused(conn, name, slots, more, reason, now)
    if paused is not None:
        paused.extend((slot, reason) for slot in slots)
    return True


def disable(
    conn: Connection,
    name: str,
    now: datetime,
    reason: str = REASON_MANUAL,
    note: str | None = None,
) -> None:
    """Pause the row; ``note`` is the operator's reason (``disabled_note``, shown by status).
    A ``disabled`` entry goes in the decision log (reason `reason`, detail the note), for the
    slot the row was due at next (none for a row that was disabled already). Disabling a row
    that is disabled already without a note keeps the note it has."""
    from .._model import slots as _slots

    row = get_row(conn, name)
    if row is None:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")
    if note is None and not row.enabled:
        note = row.disabled_note
    _write(  # a manual disable stops probing
        conn,
        name,
        now,
        enabled=False,
        disabled_reason=reason,
        disabled_at=now,
        disabled_note=note,
        probe_at=None,
    )
    if row.enabled:
        slot = row.next_run_at
        if slot is not None:
            slot = _slots.slot_of(row.cron, row.timezone, row.name, slot, row.jitter)
        _decisions.record(conn, name, "disabled", slot, now, reason=reason, detail=note)


def trigger(conn: Connection, name: str, now: datetime) -> None:
    """Make the row due now; the tick's gates still apply."""
    row = get_row(conn, name)
    if row is None:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")
    if not row.enabled:
        raise SchedulerError(f"task {name!r} is disabled ({row.disabled_reason}): enable it first")
    _write(conn, name, now, next_run_at=now)
    _decisions.record(conn, name, "triggered", now, now, reason=REASON_MANUAL)


# -- sync and put: the rows of one owner made to match a list of tasks ----------------------
FILE, API = "file", "api"
"""The owners of rows: the file (``sync``) and the application (``put_task``, ``put_tasks``)."""
SOURCES = (FILE, API)
REASON_API = "disabled_by_api"
"""Why an ``api`` row is disabled when its spec says ``enabled=False``."""
# Disables that an owner put there and may lift again (a disable by the failure limit or by an
# operator survives a sync or a put that does not change ``enabled``).
_OWN_REASONS = {FILE: (REASON_CONFIG, REASON_REMOVED), API: (REASON_API,)}
_DISABLED_BY = {FILE: REASON_CONFIG, API: REASON_API}

# The columns a task's definition sets, compared in this order against the stored row.
_DEFINITION: tuple[str, ...] = ("handler", "payload", "cron", "timezone", "concurrent")
_DEFINITION += ("max_consecutive_failures", "tenant", "overlap", "catchup_window", "jitter")
_DEFINITION += ("timeout", "task_group", "recovery", "probe_intervals")
# A change of one of these moves ``next_run_at``.
_SCHEDULE = ("cron", "timezone", "jitter")
# Not next_run_at: converting 100,000 instants costs a re-sync a fifth of its time, and only a
# row the file re-enables needs it (read for those alone, before the writes).
_READ = ("name", *_DEFINITION, "enabled", "disabled_reason", "source")
_ENABLED, _REASON, _SOURCE = (len(_DEFINITION) + n for n in (1, 2, 3))
_HANDLER, _CRON, _ZONE, _GROUP = (
    _READ.index(c) for c in ("handler", "cron", "timezone", "task_group")
)
# A new row's columns, in the order of the tuples sync builds.
_INSERTED = (
    "name",
    *_DEFINITION,
    "enabled",
    "disabled_reason",
    "disabled_at",
    "next_run_at",
    "consecutive_failures",
    "version",
    "created_at",
    "updated_at",
    "source",
)
# Placeholders for positional parameters, by DB-API paramstyle.
_PLACEHOLDER = {"qmark": "?", "format": "%s", "pyformat": "%s"}
# Names per IN list when the rows of a few tasks are read by name.
_CHUNK = 500
# On PostgreSQL the names go as one array (``name = ANY(:names)``), this many at a time: an IN
# list of 500 placeholders is parsed by the driver in Python, ~2.5 ms of CPU per statement
# (2,000 of them to look up a million new names).
_ARRAY_CHUNK = 20_000


def _names_in(conn: Connection, names: list[str]) -> Iterator[Any]:
    """``rows.name IN names`` as one condition per chunk of ``names``."""
    if conn.dialect.name == "postgresql":
        for i in range(0, len(names), _ARRAY_CHUNK):
            chunk = names[i : i + _ARRAY_CHUNK]
            yield rows.c.name == any_(bindparam("p_names", chunk, type_=ARRAY(Text)))
        return
    for i in range(0, len(names), _CHUNK):
        chunk = names[i : i + _CHUNK]
        yield rows.c.name.in_(chunk)


# With more tasks than this, every row of the owner is read in one statement instead.
_READ_ALL_ABOVE = 5_000
MAX_GROUP = 200


class NameTaken(SchedulerError):
    """A new row's name is already a row of the other owner (found by the INSERT: the
    transaction is lost; :func:`taken_name` says which, in a new one)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__("a task's name is taken by a task of the other owner")
        self.names = names


def taken_name(conn: Connection, names: list[str], source: str) -> str | None:
    """The first of ``names`` that a row of another owner than ``source`` has."""
    for named in _names_in(conn, names):
        stmt = select(rows.c.name).where(named, rows.c.source != source)
        found = conn.execute(stmt.order_by(rows.c.name).limit(1)).first()
        if found is not None:
            return str(found[0])
    return None


def name_taken_error(name: str) -> ConfigError:
    """A task of the file whose name is the application's (put_task) task."""
    return ConfigError(
        f"task {name!r}: key 'name': a task created at runtime (put_task) has this name;"
        " rename the file's task or remove that one first"
    )


class ManagedElsewhere(SchedulerError):
    """The row belongs to the other owner (the file's to ``sync``, the application's to
    ``put_task``)."""


def check_task(task: Any, payload_limit: int, stored: Any = None) -> tuple[str, str | None]:
    """:func:`~scheduler._model.check.check_task`, told whether ``stored`` (the task's row as
    read, in ``_READ`` order, if it has one) keeps the task's handler, cron and timezone."""
    from .._model import check as _check

    kept = (
        stored is not None
        and stored[_HANDLER] == task.handler
        and stored[_CRON] == task.cron
        and stored[_ZONE] == task.timezone
    )
    return _check.check_task(task, payload_limit, kept)


def check_group(task: Any, source: str) -> str | None:
    """The task's group, checked for its owner: a ``ConfigError`` naming the task and the
    key for a group on a file task, or one over 200 characters."""
    group = getattr(task, "group", None)
    if group is None:
        return None
    if source == FILE:
        raise ConfigError(
            f"task {task.name!r}: key 'group': only a task created at runtime (put_task) has a"
            " group"
        )
    if not isinstance(group, str) or not group.strip():
        raise ConfigError(f"task {task.name!r}: key 'group': must be a non-empty string")
    if len(group) > MAX_GROUP:
        raise ConfigError(
            f"task {task.name!r}: key 'group': longer than {MAX_GROUP} characters ({len(group)})"
        )
    return group


def _read_existing(
    conn: Connection,
    names: list[str],
    source: str,
    group: str | None,
    replace: bool,
    others: bool = True,
    lock: bool = False,
) -> dict[str, Any]:
    """The stored rows (``_READ`` tuples) of the tasks' names, whoever owns them; and every
    row of the owner that a sync (the file's rows) or a group's replacement may change.
    Without ``others``, the owner's rows only (a sync, whose INSERT then finds a name that
    the other owner holds: :class:`NameTaken`). With ``lock``, the owner's rows are read
    ``FOR UPDATE`` (by name order: two callers lock in the same order), so that no tick moves
    them between this read and the writes that follow it."""
    columns = [rows.c[c] for c in _READ]
    found: dict[str, Any] = {}

    def owned(stmt: Any) -> Any:
        return stmt.order_by(rows.c.name).with_for_update() if lock else stmt

    if source == FILE or len(names) > _READ_ALL_ABOVE:
        # The owner's rows in one read (the file's: through (source, name)).
        for row in conn.execute(owned(select(*columns).where(rows.c.source == source))):
            found[row[0]] = row
        others_names = [n for n in names if n not in found] if others else []
        for named in _names_in(conn, others_names):  # the names among the other owner's
            stmt = select(*columns).where(named, rows.c.source != source)
            found.update((row[0], row) for row in conn.execute(stmt))
    else:
        # A few names (the application's calls): their next_run_at comes along, after the
        # ``_READ`` columns, for the preview's fires before (no read of its own).
        ordered = sorted(names) if lock else names
        for named in _names_in(conn, ordered):
            stmt = select(*columns, rows.c.next_run_at).where(named)
            found.update((row[0], row) for row in conn.execute(owned(stmt)))
    if replace and group is not None:
        stmt = select(*columns).where(rows.c.task_group == group, rows.c.source == API)
        found.update((row[0], row) for row in conn.execute(owned(stmt)))
    return found


def _next_runs_of(conn: Connection, names: list[str]) -> dict[str, datetime | None]:
    """The stored ``next_run_at`` of these rows."""
    found: dict[str, datetime | None] = {}
    for named in _names_in(conn, names):
        stmt = select(rows.c.name, rows.c.next_run_at).where(named)
        found.update((name, due) for name, due in conn.execute(stmt))
    return found


def apply(
    conn: Connection,
    tasks: Iterable[Any],
    *,
    now: datetime | Callable[[], datetime],
    payload_limit: int,
    source: str,
    dry_run: bool = False,
    group: str | None = None,
    replace: bool = False,
    owner_name: str = "app.toml",
    preview: bool = False,
) -> SyncPlan:
    """Make one owner's rows match ``tasks`` (``TaskSpec`` objects) in this transaction.

    ``source`` ``file`` is ``sync``: new tasks are inserted, changed ones updated, the file's
    rows no longer in ``tasks`` disabled (``removed_from_config``); a task whose name is an
    ``api`` row fails it (``ConfigError`` naming the task and ``name``). ``source`` ``api`` is
    ``put_tasks``: each task is inserted or updated; with ``group`` every task gets that group,
    and with ``replace`` the group's rows not in ``tasks`` are removed (their queued jobs
    cancelled); a name of the file's rows is a :class:`ManagedElsewhere` (``owner_name``: the
    file, for the message).

    Every task is checked before anything is written. The rows are read once; then one
    executemany writes the new rows, one per set of changed columns writes the changed ones,
    and one disables (or removes) the rows gone. Unchanged rows get no statement at all.
    ``preview`` fills ``plan.changes`` with each changed task's fires before and after.

    ``now`` may be the clock itself: it is then read once the rows are read, and the owner
    ``api``'s rows are read ``FOR UPDATE`` (unless ``dry_run``). A tick that moved a row past
    a slot it dispatched has then committed before the read, at an instant of the clock before
    this one; or it waits, and loses its compare-and-swap. A changed schedule's first slot,
    computed from ``now``, can so never be a slot a tick has already dispatched (an instant
    read before the row was, and a tick committing in between, made it one: issue 33).
    """
    from .._model import slots as _slots

    tasks = list(tasks)
    if group is not None and source == API:
        tasks = [_in_group(task, group) for task in tasks]
    names = [task.name for task in tasks]
    # A sync reads the file's rows alone (one statement); a name of the application's makes
    # its INSERT fail (NameTaken, told apart by the caller). A dry run looks it up instead.
    # Either owner's rows are read FOR UPDATE before the clock is (a sync's too: the same race).
    lock = not dry_run and callable(now)
    existing = _read_existing(
        conn, names, source, group, replace, source != FILE or dry_run, lock=lock
    )
    if callable(now):
        now = now()
    checked: list[tuple[str, str | None, str | None]] = []
    seen: set[str] = set()
    for task in tasks:
        current = existing.get(task.name)
        if current is not None and current[_SOURCE] != source:
            if source == FILE:
                raise name_taken_error(task.name)
            raise ManagedElsewhere(f"task {task.name!r} is managed by {owner_name}")
        payload, free = check_task(task, payload_limit, current)
        checked.append((payload, free, check_group(task, source)))
        if task.name in seen:
            raise ConfigError(f"task {task.name!r}: key 'name': duplicate task name")
        seen.add(task.name)
    plan = SyncPlan()
    own_reasons, disabled_by = _OWN_REASONS[source], _DISABLED_BY[source]
    paused: list[tuple[Any, datetime | None, str]] = []
    slots = _slots.FirstRuns(now)
    inserts: list[tuple[Any, ...]] = []
    updates: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    # (task, the keys it changes, its new next_run_at if it moves, whether it moves)
    changed_tasks: list[tuple[Any, tuple[str, ...], datetime | None, bool]] = []
    for task, (payload, free, task_group) in zip(tasks, checked, strict=True):
        definition = (
            task.handler,
            payload,
            task.cron,
            task.timezone,
            task.policy == "allow",  # concurrent: kept in step with overlap
            task.max_consecutive_failures,
            getattr(task, "tenant", None),
            task.policy,
            task.catchup_window,
            task.jitter,
            _timeout(task),
            task_group,
            getattr(task, "recovery", MANUAL),
            _probes.encode_intervals(getattr(task, "probe_intervals", PROBE_INTERVALS)),
        )
        current = existing.get(task.name)
        if current is None:
            plan.insert.append(task.name)
            enabled = bool(task.enabled)
            first = slots.next(task, free) if enabled or preview else None
            if preview:
                changed_tasks.append((task, (), first, True))
            if not dry_run:
                inserts.append(
                    (
                        task.name,
                        *definition,
                        enabled,
                        None if enabled else disabled_by,
                        None if enabled else now,
                        slots.next(task, free),
                        0,  # consecutive_failures
                        1,  # version
                        now,  # created_at
                        now,  # updated_at
                        source,
                    )
                )
            continue
        changes: dict[str, Any] = {}
        if current[1:_ENABLED] != definition:
            changes = {
                column: value
                for column, value, old in zip(
                    _DEFINITION, definition, current[1:_ENABLED], strict=True
                )
                if old != value
            }
            if any(key in changes for key in _SCHEDULE):
                changes["next_run_at"] = None  # computed below
        was_enabled = bool(current[_ENABLED])
        if task.enabled and not was_enabled and current[_REASON] in own_reasons:
            if not dry_run:  # the slots that passed while the owner had it disabled
                paused.append((task, None, current[_REASON]))
            changes.update(
                enabled=True,
                disabled_reason=None,
                disabled_at=None,
                consecutive_failures=0,
                next_run_at=None,
                probe_at=None,
                probes=0,
            )
        elif not task.enabled and was_enabled:
            changes.update(enabled=False, disabled_reason=disabled_by, disabled_at=now)
        if not changes:
            plan.unchanged.append(task.name)
            continue
        plan.update.append(task.name)
        if "next_run_at" in changes:
            changes["next_run_at"] = slots.next(task, free)
        if preview:
            keys = tuple(sorted(_shown(c) for c in changes if c in _SHOWN))
            moves = "next_run_at" in changes
            changed_tasks.append((task, keys, changes.get("next_run_at"), moves))
        if not dry_run:
            params = {f"b_{column}": value for column, value in changes.items()}
            params["b_name"] = task.name
            updates.setdefault(tuple(changes), []).append(params)
    removed: list[dict[str, Any]] = []
    gone: list[str] = []
    for name, current in existing.items():
        if name in seen or current[_SOURCE] != source:
            continue
        if source == FILE:
            if current[_ENABLED]:
                plan.disable.append(name)
                removed.append({"b_name": name})
            else:
                plan.unchanged.append(name)
        elif replace and group is not None and current[_GROUP] == group:
            plan.remove.append(name)
            gone.append(name)
    if preview:
        plan.changes = _previews(conn, changed_tasks, existing, now)
    if dry_run:
        return plan
    if paused:  # the re-enabled rows' due instants, before the updates below move them
        was = _next_runs_of(conn, [task.name for task, _due, _reason in paused])
        paused = [(task, was.get(task.name), reason) for task, _due, reason in paused]
    if inserts:
        try:
            _insert_many(conn, inserts)
        except IntegrityError as exc:  # a name unique among the owner's is the other's
            raise NameTaken([row[0] for row in inserts]) from exc
    for columns, changed in updates.items():
        conn.execute(_update_by_name(now, columns), changed)
    if removed:
        fixed = dict(enabled=False, disabled_reason=REASON_REMOVED, disabled_at=now)
        conn.execute(_update_by_name(now, (), **fixed), removed)
    for name in gone:
        remove(conn, name, now)
    for task, was_due, reason in paused:
        passed, more = _slots.passed_slots(task, was_due, now)
        _log_paused(conn, task.name, passed, more, reason, now)
        plan.paused.extend((task.name, slot, reason) for slot in passed)
    return plan


def sync(
    conn: Connection,
    tasks: Iterable[Any],
    *,
    now: datetime | Callable[[], datetime],
    payload_limit: int,
    dry_run: bool = False,
    preview: bool = False,
) -> SyncPlan:
    """Make the file's rows match ``tasks``: :func:`apply` for the owner ``file`` (``now``
    the clock itself: read once the rows are, as for the application's rows)."""
    return apply(
        conn,
        tasks,
        now=now,
        payload_limit=payload_limit,
        source=FILE,
        dry_run=dry_run,
        preview=preview,
    )


# The keys a change names (the columns of the definition, as the spec calls them).
_SHOWN = {c: c for c in (*_DEFINITION, "enabled")} | {"task_group": "group"}


def _shown(column: str) -> str:
    return _SHOWN[column]


def _in_group(task: Any, group: str) -> Any:
    """``task`` with ``group`` (put_tasks(group=...)): a spec given another group is refused."""
    own = getattr(task, "group", None)
    if own is not None and own != group:
        raise ConfigError(
            f"task {task.name!r}: key 'group': {own!r}, but put_tasks was given group {group!r}"
        )
    return task if own == group else dataclasses.replace(task, group=group)


PREVIEW_FIRES = 5
"""Fires a change shows before and after."""


def _previews(
    conn: Connection,
    changed: list[tuple[Any, tuple[str, ...], datetime | None, bool]],
    existing: dict[str, Any],
    now: datetime,
) -> list[TaskChange]:
    """Each changed task's fires before (its stored schedule) and after (the new one)."""
    from .._model import slots as _slots

    known = [t.name for t, _k, _a, _m in changed if t.name in existing]
    stored = {n: existing[n][len(_READ)] for n in known if len(existing[n]) > len(_READ)}
    stored.update(_next_runs_of(conn, [n for n in known if n not in stored]))
    found: list[TaskChange] = []
    for task, keys, after_due, moves in changed:
        current = existing.get(task.name)
        before: tuple[datetime, ...] = ()
        if current is not None and current[_ENABLED]:
            jitter = current[_READ.index("jitter")]
            old = _Schedule(task.name, current[_CRON], current[_ZONE], jitter)
            fires = _slots.next_fires(old, now, PREVIEW_FIRES, next_run_at=stored.get(task.name))
            before = tuple(fire.at for fire in fires)
        enabled = task.enabled if current is None or "enabled" in keys else bool(current[_ENABLED])
        after: tuple[datetime, ...] = ()
        if enabled:
            due = after_due if moves else stored.get(task.name)
            fires = _slots.next_fires(task, now, PREVIEW_FIRES, next_run_at=due)
            after = tuple(fire.at for fire in fires)
        action = CREATED if current is None else UPDATED
        found.append(TaskChange(action, None, before, after, task.name, keys))
    return found


@dataclasses.dataclass(frozen=True)
class _Schedule:
    name: str
    cron: str
    timezone: str
    jitter: int


def enabled_handlers(
    conn: Connection, unknown: Callable[[str], bool] = lambda _handler: True
) -> dict[str, tuple[list[str], int]]:
    """Per handler the enabled rows name: how many do, and, for the handlers ``unknown``
    says yes to, the first three of their names (one statement, and one per such handler)."""
    first = func.min(rows.c.name)
    counted = conn.execute(
        select(rows.c.handler, func.count(), first)
        .where(rows.c.enabled == true())
        .group_by(rows.c.handler)
        .order_by(first)  # in the order of the tasks that name them
    ).all()
    found: dict[str, tuple[list[str], int]] = {}
    for handler, count, _first in counted:
        names: list[str] = []
        if unknown(handler):
            stmt = select(rows.c.name).where(rows.c.enabled == true(), rows.c.handler == handler)
            names = list(conn.execute(stmt.order_by(rows.c.name).limit(3)).scalars())
        found[handler] = (names, int(count))
    return found


def fires_of(row: TaskRow, now: datetime) -> tuple[datetime, ...]:
    """A stored row's next :data:`PREVIEW_FIRES` fires (none while it is disabled)."""
    from .._model import slots as _slots

    if not row.enabled:
        return ()
    fires = _slots.next_fires(row, now, PREVIEW_FIRES, next_run_at=row.next_run_at)
    return tuple(fire.at for fire in fires)


def list_rows(
    conn: Connection,
    *,
    source: str | None = None,
    group: str | None = None,
    tenant: str | None = None,
    prefix: str | None = None,
    limit: int | None = 50,
    after: str | None = None,
) -> list[TaskRow]:
    """Rows by name, filtered by each argument given, from the name after ``after``: one
    statement through the name's index (or the group's, the tenant's: each pages by name)."""
    stmt = _select_rows().order_by(rows.c.name)
    if source is not None:
        stmt = stmt.where(rows.c.source == source)
    if group is not None:
        stmt = stmt.where(rows.c.task_group == group)
    if tenant is not None:
        stmt = stmt.where(rows.c.tenant == tenant)
    if prefix:
        # The lower bound positions the scan in the name's index whatever the collation; the
        # LIKE keeps the names that start with the prefix.
        stmt = stmt.where(rows.c.name >= prefix, rows.c.name.startswith(prefix, autoescape=True))
    if after is not None:
        stmt = stmt.where(rows.c.name > after)
    if limit is not None:
        stmt = stmt.limit(limit)
    return [_view(r) for r in conn.execute(stmt)]


# -- removal -------------------------------------------------------------------------------
def remove(conn: Connection, name: str, now: datetime) -> int:
    """Delete the ``api`` row ``name`` and cancel its queued jobs (code ``cancelled``); its
    jobs, runs, decisions and audit entries stay until their retention. A tick that read the
    row before this commits writes nothing for it (its compare-and-swap finds no row). Returns
    how many rows were deleted (0 or 1)."""
    deleted = conn.execute(delete(rows).where(rows.c.name == name, rows.c.source == API)).rowcount
    if deleted:
        _jobs.cancel_task_jobs(conn, name, now)
    return int(deleted)


def source_of(conn: Connection, name: str) -> str | None:
    """Who owns the row ``name`` (``file`` or ``api``), or None without one."""
    found = conn.execute(select(rows.c.source).where(rows.c.name == name)).first()
    return None if found is None else str(found[0])


def _insert_many(conn: Connection, values: list[tuple[Any, ...]]) -> None:
    """INSERT ``values`` (tuples in ``_INSERTED`` order) in one executemany.

    Core runs every column of every row through its type's bind processing; for 100,000 rows
    that cost more than the insert itself (5.3 s CPU against 2.1 s on SQLite). Here the SQL is
    written once, and each column's own processor (``bind_processor``, the conversion Core
    applies) runs once per distinct value: a sync's rows share a few instants and booleans.
    """
    dialect = conn.dialect
    placeholder = _PLACEHOLDER.get(dialect.paramstyle)
    if placeholder is None:  # a driver with named parameters only: the plain Core path
        conn.execute(insert(rows), [dict(zip(_INSERTED, row, strict=True)) for row in values])
        return
    processors = [
        (i, p)
        for i, column in enumerate(_INSERTED)
        if (p := rows.c[column].type.dialect_impl(dialect).bind_processor(dialect)) is not None
    ]
    if processors:  # convert column by column, each distinct value once
        columns = list(zip(*values, strict=True))
        for i, process in processors:
            done = {v: None if v is None else process(v) for v in set(columns[i])}
            columns[i] = tuple(map(done.__getitem__, columns[i]))
        values = list(zip(*columns, strict=True))
    quote = dialect.identifier_preparer.quote
    sql = "INSERT INTO {} ({}) VALUES ({})".format(
        quote(rows.name),
        ", ".join(quote(column) for column in _INSERTED),
        ", ".join([placeholder] * len(_INSERTED)),
    )
    conn.exec_driver_sql(sql, values)


def _by_name(column: str) -> Any:
    return bindparam(f"b_{column}", type_=rows.c[column].type)


def _update_by_name(now: datetime, columns: Iterable[str], **fixed: Any) -> Any:
    """One UPDATE of the row named ``b_name``, run once per parameter set (executemany)."""
    values = {column: _by_name(column) for column in columns}
    return (
        update(rows)
        .where(rows.c.name == _by_name("name"))
        .values(version=rows.c.version + 1, updated_at=now, **values, **fixed)
    )
