"""TOML configuration: read the file, check every key, describe the tasks to sync.

Every problem is a :class:`ConfigError`: one line naming the file, the table or task, and the key.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ._cron import validate_cron, validate_timezone
from ._errors import ConfigError, PayloadError
from ._payload import decode_payload, encode_payload, find_credential_key

DEFAULT_URL = "sqlite:///scheduler.db"
DATABASE_URL_ENV = "SCHEDULER_DATABASE_URL"
MAX_NAME_LENGTH = 200


@dataclass(frozen=True)
class TaskSpec:
    """One recurring task as declared in ``[[tasks]]``."""

    name: str
    cron: str
    handler: str
    payload: dict[str, Any]
    timezone: str
    concurrent: bool = False
    max_consecutive_failures: int | None = None  # None: use [scheduler]'s; 0 = unlimited
    enabled: bool = True


@dataclass(frozen=True)
class SchedulerSettings:
    """The ``[scheduler]`` table."""

    max_consecutive_failures: int = 5
    tick_interval: float = 1.0
    timezone: str = "UTC"
    batch_size: int = 100
    tick_connections: int = 0  # 0: 4 on PostgreSQL, else 1 (SQLite always 1)
    backoff_base_seconds: float = 60.0
    backoff_max_seconds: float = 3600.0
    payload_limit_bytes: int = 65536


@dataclass(frozen=True)
class WorkerSettings:
    """The ``[worker]`` table."""

    imports: tuple[str, ...] = ()
    concurrency: int = 4
    lease_seconds: float = 60.0
    shutdown_grace_seconds: float = 30.0
    purge_succeeded_after_days: float = 7.0
    purge_aborted_after_days: float = 30.0
    queues: tuple[str, ...] = ("default",)


@dataclass(frozen=True)
class AppConfig:
    """A whole configuration file, checked."""

    path: str | None
    database_url: str
    scheduler: SchedulerSettings
    worker: WorkerSettings
    tasks: tuple[TaskSpec, ...]


_MISSING: Any = object()
_MAX_INT = 2**31 - 1  # fits every database's INTEGER column
_KINDS = dict(bool="boolean", int="integer", str="string", dict="table", list="array")


def _kind(value: Any) -> str:
    return _KINDS.get(type(value).__name__, type(value).__name__)


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


class _Table:
    """One TOML table being read: ``defaults`` lists its keys (``_MISSING``: required), and
    every error names ``where`` (the file, and the table or task) and the key."""

    def __init__(self, data: Any, where: str, defaults: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a table, got {_kind(data)}")
        self.data: Mapping[str, Any] = data
        self.where = where
        self.defaults = defaults

    def check_keys(self) -> _Table:
        for key in self.data:
            if key not in self.defaults:
                close = difflib.get_close_matches(str(key), list(self.defaults), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.error(str(key), f"unknown key{hint}")
        return self

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(_one_line(f"{self.where}: key {key!r}: {message}"))

    def get(self, key: str, expected: str, ok: Callable[[Any], bool]) -> Any:
        if key not in self.data:
            if self.defaults[key] is _MISSING:
                raise self.error(key, "missing")
            return self.defaults[key]
        value = self.data[key]
        if not ok(value):
            raise self.error(key, f"expected {expected}, got {_kind(value)}")
        return value

    def text(self, key: str) -> str:
        value: str = self.get(key, "a string", lambda v: isinstance(v, str))
        if not value.strip():
            raise self.error(key, "must not be empty")
        return value

    def flag(self, key: str) -> bool:
        value: bool = self.get(key, "a boolean", lambda v: isinstance(v, bool))
        return value

    def integer(self, key: str, minimum: int) -> int:
        value: int = self.get(key, "an integer", lambda v: _is_number(v) and isinstance(v, int))
        if value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        if value > _MAX_INT:
            raise self.error(key, f"must be at most {_MAX_INT}")
        return value

    def number(self, key: str, minimum: float = 0, *, positive: bool = False) -> float:
        """A float at least ``minimum``, or greater than it when ``positive``."""
        value = self.get(key, "a number", _is_number)
        if abs(value) > _MAX_INT or not math.isfinite(value):
            raise self.error(key, f"must be a finite number, at most {_MAX_INT}")
        if value < minimum or (positive and value == minimum):
            bound = "greater than" if positive else "at least"
            raise self.error(key, f"must be {bound} {minimum:g}, got {value:g}")
        return float(value)

    def strings(self, key: str) -> tuple[str, ...]:
        values = self.get(key, "an array of strings", lambda v: isinstance(v, list | tuple))
        for index, value in enumerate(values):
            if not isinstance(value, str):
                raise self.error(f"{key}[{index}]", f"expected a string, got {_kind(value)}")
            if not value.strip():
                raise self.error(f"{key}[{index}]", "must not be empty")
        return tuple(values)

    def timezone(self, key: str) -> str:
        value = self.text(key)
        try:
            validate_timezone(value)
        except ValueError as exc:
            raise self.error(key, str(exc)) from exc
        return value


def _scheduler_settings(data: Any, path: str) -> SchedulerSettings:
    t = _Table(data, f"{path}: [scheduler]", asdict(SchedulerSettings())).check_keys()
    settings = SchedulerSettings(
        max_consecutive_failures=t.integer("max_consecutive_failures", 0),
        tick_interval=t.number("tick_interval", positive=True),
        timezone=t.timezone("timezone"),
        batch_size=t.integer("batch_size", 1),
        tick_connections=t.integer("tick_connections", 0),
        backoff_base_seconds=t.number("backoff_base_seconds", positive=True),
        backoff_max_seconds=t.number("backoff_max_seconds", positive=True),
        payload_limit_bytes=t.integer("payload_limit_bytes", 1),
    )
    if settings.backoff_base_seconds > settings.backoff_max_seconds:
        raise t.error("backoff_base_seconds", "must not exceed backoff_max_seconds")
    return settings


def _worker_settings(data: Any, path: str) -> WorkerSettings:
    t = _Table(data, f"{path}: [worker]", asdict(WorkerSettings())).check_keys()
    settings = WorkerSettings(
        imports=t.strings("imports"),
        concurrency=t.integer("concurrency", 0),
        lease_seconds=t.number("lease_seconds", 5),
        shutdown_grace_seconds=t.number("shutdown_grace_seconds"),
        purge_succeeded_after_days=t.number("purge_succeeded_after_days", positive=True),
        purge_aborted_after_days=t.number("purge_aborted_after_days", positive=True),
        queues=t.strings("queues"),
    )
    if not settings.queues:
        raise t.error("queues", "must name at least one queue")
    return settings


# Unicode category Cc: exactly C0, DEL and C1 (one regex search, not a lookup per character).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _task_name(t: _Table, key: str = "name") -> str:
    """A name stored in a 200-character column: the task's name, or its handler's."""
    name = t.text(key)
    if len(name) > MAX_NAME_LENGTH:
        raise t.error(key, f"longer than {MAX_NAME_LENGTH} characters")
    if name != name.strip() or _CONTROL.search(name):
        raise t.error(key, "must not have leading or trailing whitespace or control characters")
    return name


def _task(t: _Table, name: str, settings: SchedulerSettings) -> TaskSpec:
    cron = t.text("cron")
    if len(cron) > MAX_NAME_LENGTH:
        raise t.error("cron", f"longer than {MAX_NAME_LENGTH} characters")
    try:
        validate_cron(cron, name)
    except ValueError as exc:
        raise t.error("cron", str(exc)) from exc
    handler = _task_name(t, "handler")
    payload = t.get("payload", "a table", _is_table)
    credential = find_credential_key(payload)
    if credential:
        raise t.error(
            f"payload.{credential}",
            "looks like a credential; pass a reference (a secret's name), never the secret itself",
        )
    try:
        encoded = encode_payload(payload, settings.payload_limit_bytes)
    except PayloadError as exc:
        raise t.error("payload", str(exc)) from exc
    limit = "max_consecutive_failures"
    return TaskSpec(
        name=name,
        cron=cron,
        handler=handler,
        payload=decode_payload(encoded),  # normalised: exactly what the database will hold
        timezone=t.timezone("timezone"),
        concurrent=t.flag("concurrent"),
        max_consecutive_failures=t.integer(limit, 0) if limit in t.data else None,
        enabled=t.flag("enabled"),
    )


def _tasks(data: list[Any], path: str, settings: SchedulerSettings) -> tuple[TaskSpec, ...]:
    defaults = dict.fromkeys(("name", "cron", "handler"), _MISSING) | {
        "payload": {},
        "timezone": settings.timezone,
        "concurrent": False,
        "max_consecutive_failures": None,
        "enabled": True,
    }
    seen: dict[str, int] = {}
    specs = []
    for index, item in enumerate(data):
        table = _Table(item, f"{path}: tasks[{index}]", defaults)
        try:
            name = _task_name(table)
        except ConfigError:
            table.check_keys()  # a misspelt key explains a missing name best
            raise
        table.where = f"{path}: task {name!r}"  # later errors name the task
        table.check_keys()
        if name in seen:
            raise table.error("name", f"duplicate task name (also tasks[{seen[name]}])")
        seen[name] = index
        specs.append(_task(table, name, settings))
    return tuple(specs)


def parse_config(data: Mapping[str, Any], path: str = "<config>") -> AppConfig:
    """Check already-parsed TOML ``data``; ``path`` names the source in error messages.

    ``SCHEDULER_DATABASE_URL``, when set and non-empty, overrides ``[database] url``.
    ``AppConfig.path`` is ``path``, or None when left at ``"<config>"`` (no file).
    """
    top = _Table(data, path, {"database": {}, "scheduler": {}, "worker": {}, "tasks": []})
    top.check_keys()
    database = _Table(
        top.get("database", "a table", _is_table), f"{path}: [database]", {"url": DEFAULT_URL}
    )
    url = database.check_keys().text("url")
    settings = _scheduler_settings(top.get("scheduler", "a table", _is_table), path)
    tasks = top.get("tasks", "an array of tables", lambda v: isinstance(v, list))
    return AppConfig(
        path=None if path == "<config>" else path,
        database_url=os.environ.get(DATABASE_URL_ENV) or url,
        scheduler=settings,
        worker=_worker_settings(top.get("worker", "a table", _is_table), path),
        tasks=_tasks(tasks, path, settings),
    )


def load_config(path: str | os.PathLike[str]) -> AppConfig:
    """Read and check the TOML file at ``path``."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: invalid TOML: not UTF-8 text ({exc.reason})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(_one_line(f"{name}: invalid TOML: {exc}")) from exc
    except RecursionError:
        raise ConfigError(f"{name}: invalid TOML: arrays or tables nested too deeply") from None
    return parse_config(data, name)
