"""Scheduler rows: the read-only view, TOML sync, and enable / disable / trigger."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update

from . import _cron
from ._errors import ConfigError, SchedulerError, UnknownRow
from ._payload import decode_payload, encode_payload
from ._store.tables import jobs, rows

REASON_MANUAL = "manual"
REASON_CONFIG = "disabled_in_config"
REASON_REMOVED = "removed_from_config"
# Disables that the file put there and the file may lift again.
_CONFIG_REASONS = (REASON_CONFIG, REASON_REMOVED)


@dataclass(frozen=True)
class TaskRow:
    """A read-only view of a scheduler row."""

    name: str
    handler: str
    payload: dict[str, Any]
    cron: str
    timezone: str
    concurrent: bool
    enabled: bool
    next_run_at: datetime | None
    last_job_id: int | None
    last_job_state: str | None
    consecutive_failures: int
    max_consecutive_failures: int | None
    disabled_reason: str | None
    disabled_at: datetime | None
    version: int


def _select_rows() -> Any:
    return select(rows, jobs.c.state.label("last_job_state")).select_from(
        rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id)
    )


def _view(r: Any) -> TaskRow:
    m = r._mapping
    return TaskRow(
        name=m["name"],
        handler=m["handler"],
        payload=decode_payload(m["payload"]),
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
    )


def get_row(conn: Connection, name: str) -> TaskRow | None:
    found = conn.execute(_select_rows().where(rows.c.name == name)).first()
    return _view(found) if found is not None else None


def all_rows(conn: Connection) -> list[TaskRow]:
    return [_view(r) for r in conn.execute(_select_rows().order_by(rows.c.name))]


def _write(conn: Connection, name: str, now: datetime, **values: Any) -> None:
    result = conn.execute(
        update(rows)
        .where(rows.c.name == name)
        .values(version=rows.c.version + 1, updated_at=now, **values)
    )
    if result.rowcount != 1:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")


def enable(conn: Connection, name: str, now: datetime) -> bool:
    """Re-enable: reset the failure count and re-arm from now."""
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
        consecutive_failures=0,
        next_run_at=_cron.next_after(row.cron, row.timezone, now, row.name),
    )
    return True


def disable(conn: Connection, name: str, now: datetime, reason: str = REASON_MANUAL) -> None:
    _write(conn, name, now, enabled=False, disabled_reason=reason, disabled_at=now)


def trigger(conn: Connection, name: str, now: datetime) -> None:
    """Make the row due now; the tick's gates still apply."""
    row = get_row(conn, name)
    if row is None:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")
    if not row.enabled:
        raise SchedulerError(f"task {name!r} is disabled ({row.disabled_reason}): enable it first")
    _write(conn, name, now, next_run_at=now)


# -- sync ---------------------------------------------------------------------------------
@dataclass
class SyncPlan:
    """What ``sync`` does (or, on a dry run, would do): row names per action."""

    insert: list[str] = field(default_factory=list)
    update: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    disable: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "insert": self.insert,
            "update": self.update,
            "unchanged": self.unchanged,
            "disable": self.disable,
        }


def _definition(task: Any, payload_limit: int) -> dict[str, Any]:
    return {
        "handler": task.handler,
        "payload": encode_payload(task.payload, payload_limit),
        "cron": task.cron,
        "timezone": task.timezone,
        "concurrent": bool(task.concurrent),
        "max_consecutive_failures": task.max_consecutive_failures,
    }


def check_task(task: Any, payload_limit: int) -> None:
    """Validate a task built in Python the way the TOML loader validates the file's."""
    checks: list[tuple[str, Callable[[], object]]] = [
        ("cron", lambda: _cron.validate_cron(task.cron, task.name)),
        ("timezone", lambda: _cron.validate_timezone(task.timezone)),
        ("payload", lambda: encode_payload(task.payload, payload_limit)),
    ]
    for key, check in checks:
        try:
            check()
        except ValueError as exc:
            raise ConfigError(f"task {task.name!r}: key {key!r}: {exc}") from None


def sync(
    conn: Connection,
    tasks: Iterable[Any],
    *,
    now: datetime,
    payload_limit: int,
    dry_run: bool = False,
) -> SyncPlan:
    """Make the rows match ``tasks`` (validated ``TaskSpec`` objects) in one transaction."""
    tasks = list(tasks)
    for task in tasks:
        check_task(task, payload_limit)
    plan = SyncPlan()
    existing = {r.name: r for r in conn.execute(select(rows))}
    wanted: set[str] = set()
    for task in tasks:
        wanted.add(task.name)
        definition = _definition(task, payload_limit)
        current = existing.get(task.name)
        if current is None:
            plan.insert.append(task.name)
            if not dry_run:
                conn.execute(
                    insert(rows).values(
                        name=task.name,
                        **definition,
                        enabled=task.enabled,
                        disabled_reason=None if task.enabled else REASON_CONFIG,
                        disabled_at=None if task.enabled else now,
                        next_run_at=_cron.next_after(task.cron, task.timezone, now, task.name),
                        consecutive_failures=0,
                        version=1,
                        created_at=now,
                        updated_at=now,
                    )
                )
            continue
        changes = {k: v for k, v in definition.items() if getattr(current, k) != v}
        if "cron" in changes or "timezone" in changes:
            changes["next_run_at"] = _cron.next_after(task.cron, task.timezone, now, task.name)
        if task.enabled and not current.enabled and current.disabled_reason in _CONFIG_REASONS:
            changes.update(
                enabled=True,
                disabled_reason=None,
                disabled_at=None,
                consecutive_failures=0,
                next_run_at=_cron.next_after(task.cron, task.timezone, now, task.name),
            )
        elif not task.enabled and current.enabled:
            changes.update(enabled=False, disabled_reason=REASON_CONFIG, disabled_at=now)
        if not changes:
            plan.unchanged.append(task.name)
            continue
        plan.update.append(task.name)
        if not dry_run:
            _write(conn, task.name, now, **changes)
    for name, current in existing.items():
        if name in wanted:
            continue
        if current.enabled:
            plan.disable.append(name)
            if not dry_run:
                disable(conn, name, now, REASON_REMOVED)
        else:
            plan.unchanged.append(name)
    return plan
