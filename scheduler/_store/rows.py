"""Scheduler rows: the read-only view, TOML sync, and enable / disable / trigger."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from .._errors import ConfigError, SchedulerError, UnknownRow
from .._model.payload import decode_payload
from .._model.rows import SyncPlan, TaskRow
from . import decisions as _decisions
from .tables import jobs, rows

# The model's slot and check modules (croniter's callers) are imported by the functions that
# use them: `scheduler status` reads rows and needs neither.

REASON_MANUAL = "manual"
REASON_CONFIG = "disabled_in_config"
REASON_REMOVED = "removed_from_config"
# Disables that the file put there and the file may lift again.
_CONFIG_REASONS = (REASON_CONFIG, REASON_REMOVED)


# The row's columns a TaskRow shows, and no others (each timestamp read costs a conversion).
_VIEWED = tuple(f.name for f in fields(TaskRow) if f.name in rows.c)


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
    )


def get_row(conn: Connection, name: str) -> TaskRow | None:
    found = conn.execute(_select_rows().where(rows.c.name == name)).first()
    return _view(found) if found is not None else None


def all_rows(conn: Connection, *, payloads: bool = True) -> list[TaskRow]:
    """Every row, by name; without ``payloads`` their views' payloads are empty (``status``,
    which shows none: decoding 10,000 of them was a third of its time)."""
    return [_view(r) for r in conn.execute(_select_rows(payloads=payloads).order_by(rows.c.name))]


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
    slot the row was due at next (none for a row that was disabled already)."""
    from .._model import slots as _slots

    row = get_row(conn, name)
    if row is None:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")
    _write(
        conn, name, now, enabled=False, disabled_reason=reason, disabled_at=now, disabled_note=note
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


# -- sync ---------------------------------------------------------------------------------
# The columns a task's definition sets, compared in this order against the stored row.
_DEFINITION: tuple[str, ...] = ("handler", "payload", "cron", "timezone", "concurrent")
_DEFINITION += ("max_consecutive_failures", "tenant", "overlap", "catchup_window", "jitter")
# A change of one of these moves ``next_run_at``.
_SCHEDULE = ("cron", "timezone", "jitter")
# Not next_run_at: converting 100,000 instants costs a re-sync a fifth of its time, and only a
# row the file re-enables needs it (read for those alone, before the writes).
_READ = ("name", *_DEFINITION, "enabled", "disabled_reason")
_ENABLED, _REASON = len(_DEFINITION) + 1, len(_DEFINITION) + 2
_HANDLER, _CRON, _ZONE = (_READ.index(c) for c in ("handler", "cron", "timezone"))
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
)
# Placeholders for positional parameters, by DB-API paramstyle.
_PLACEHOLDER = {"qmark": "?", "format": "%s", "pyformat": "%s"}


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


def sync(
    conn: Connection,
    tasks: Iterable[Any],
    *,
    now: datetime,
    payload_limit: int,
    dry_run: bool = False,
) -> SyncPlan:
    """Make the rows match ``tasks`` (validated ``TaskSpec`` objects) in one transaction.

    Every task is checked before anything is written. The rows are read once; then one
    executemany writes the new rows, one per set of changed columns writes the changed ones,
    and one disables the rows gone from ``tasks``. Unchanged rows get no statement at all.
    """
    from .._model import slots as _slots

    tasks = list(tasks)
    read = conn.execute(select(*(rows.c[c] for c in _READ))).all()
    existing = {r[0]: r for r in read}
    checked: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    for task in tasks:
        checked.append(check_task(task, payload_limit, existing.get(task.name)))
        if task.name in seen:
            raise ConfigError(f"task {task.name!r}: key 'name': duplicate task name")
        seen.add(task.name)
    plan = SyncPlan()
    paused: list[tuple[Any, datetime | None, str]] = []
    slots = _slots.FirstRuns(now)
    inserts: list[tuple[Any, ...]] = []
    updates: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for task, (payload, free) in zip(tasks, checked, strict=True):
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
        )
        current = existing.get(task.name)
        if current is None:
            plan.insert.append(task.name)
            if not dry_run:
                enabled = bool(task.enabled)
                inserts.append(
                    (
                        task.name,
                        *definition,
                        enabled,
                        None if enabled else REASON_CONFIG,
                        None if enabled else now,
                        slots.next(task, free),
                        0,  # consecutive_failures
                        1,  # version
                        now,  # created_at
                        now,  # updated_at
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
                changes["next_run_at"] = None  # computed below, unless dry
        was_enabled = bool(current[_ENABLED])
        if task.enabled and not was_enabled and current[_REASON] in _CONFIG_REASONS:
            if not dry_run:  # the slots that passed while the file had it disabled
                paused.append((task, None, current[_REASON]))
            changes.update(
                enabled=True,
                disabled_reason=None,
                disabled_at=None,
                consecutive_failures=0,
                next_run_at=None,
            )
        elif not task.enabled and was_enabled:
            changes.update(enabled=False, disabled_reason=REASON_CONFIG, disabled_at=now)
        if not changes:
            plan.unchanged.append(task.name)
            continue
        plan.update.append(task.name)
        if not dry_run:
            if "next_run_at" in changes:
                changes["next_run_at"] = slots.next(task, free)
            params = {f"b_{column}": value for column, value in changes.items()}
            params["b_name"] = task.name
            updates.setdefault(tuple(changes), []).append(params)
    removed: list[dict[str, Any]] = []
    for name, current in existing.items():
        if name in seen:
            continue
        if current[_ENABLED]:
            plan.disable.append(name)
            removed.append({"b_name": name})
        else:
            plan.unchanged.append(name)
    if dry_run:
        return plan
    if paused:  # the re-enabled rows' due instants, before the updates below move them
        names = [task.name for task, _due, _reason in paused]
        found = conn.execute(select(rows.c.name, rows.c.next_run_at).where(rows.c.name.in_(names)))
        was = {name: due for name, due in found}
        paused = [(task, was.get(task.name), reason) for task, _due, reason in paused]
    if inserts:
        _insert_many(conn, inserts)
    for columns, changed in updates.items():
        conn.execute(_update_by_name(now, columns), changed)
    if removed:
        fixed = dict(enabled=False, disabled_reason=REASON_REMOVED, disabled_at=now)
        conn.execute(_update_by_name(now, (), **fixed), removed)
    for task, was_due, reason in paused:
        passed, more = _slots.passed_slots(task, was_due, now)
        _log_paused(conn, task.name, passed, more, reason, now)
        plan.paused.extend((task.name, slot, reason) for slot in passed)
    return plan
