"""TOML configuration: read the file, check every key, describe the tasks to sync.

Every problem is a :class:`ConfigError`: one line naming the file, the table or task, and the key.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ._errors import ConfigError, PayloadError
from ._model.cron import validate_cron, validate_timezone
from ._model.limits import Limit, parse_limits
from ._model.passwords import check_hash_format
from ._model.payload import decode_payload, encode_payload, find_credential_key
from ._model.redact import ERROR_MESSAGES
from ._model.rows import TaskSpec
from ._model.rules import (
    MANUAL,
    MAX_NAME,
    MISSING,
    PROBE_INTERVALS,
    Keys,
    is_table,
    one_line,
    overlap_problem,
    probe_intervals_problem,
    recovery_problem,
    tenant_problem,
    timeout_problem,
)
from ._store.settings import (
    DEFAULT_URL,
    DatabaseSettings,
    database_settings,
    normalize_database_url,
    relative_sqlite_url,
)

DATABASE_URL_ENV = "SCHEDULER_DATABASE_URL"
METRICS_PORT_ENV = "SCHEDULER_METRICS_PORT"  # one port per worker of a systemd template unit
DASHBOARD_PASSWORD_ENV = "SCHEDULER_DASHBOARD_PASSWORD_HASH"
CLOCK_MODES = ("database", "local")  # [scheduler] clock (scheduler/_store/clock.py)
BROKER_URL_ENV = "SCHEDULER_BROKER_URL"  # wins over [broker] url
BROKER_SCHEMES = ("redis", "rediss", "unix")  # what redis-py's from_url opens


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
    clock: str = "database"  # or "local"; SQLite's is always local; env SCHEDULER_CLOCK wins
    wakeups: bool = True  # announce new jobs to idle workers (NOTIFY, broker); false: poll only


@dataclass(frozen=True)
class WorkerSettings:
    """The ``[worker]`` table."""

    imports: tuple[str, ...] = ()
    concurrency: int = 4
    async_concurrency: int = 100  # async def handlers running at once on the event loop
    lease_seconds: float = 60.0
    shutdown_grace_seconds: float = 30.0
    cancel_grace: float = 10.0  # seconds a timed-out attempt has to stop before it is fenced
    purge_succeeded_after_days: float = 7.0
    purge_aborted_after_days: float = 30.0
    purge_audit_after_days: float = 365.0  # 0 = keep the audit log for ever
    queues: tuple[str, ...] = ("default",)
    # What a failed run keeps of the exception's message: "none" (its error code only) or
    # "first-line" (the first line, redacted, at most 300 characters).
    error_messages: str = "none"


@dataclass(frozen=True)
class BrokerSettings:
    """The ``[broker]`` table: what carries wake-ups between processes besides the database."""

    url: str | None = None  # redis://HOST:PORT/DB; None: no broker
    prefix: str = "scheduler"  # the Redis keys' prefix: one per database sharing a Redis


@dataclass(frozen=True)
class MetricsSettings:
    """The ``[metrics]`` table (docs/reference/toml.md)."""

    port: int = 0  # the worker serves Prometheus text at /metrics on it; 0 = off
    host: str = "0.0.0.0"  # the address it listens on
    cache_seconds: float = 5.0  # the gauges read from the database are this old at most


@dataclass(frozen=True)
class DashboardSettings:
    """The ``[dashboard]`` table (docs/reference/toml.md)."""

    host: str = "127.0.0.1"
    port: int = 8787
    actions: bool = False
    username: str | None = None
    password_hash: str | None = None  # env SCHEDULER_DASHBOARD_PASSWORD_HASH overrides it
    refresh_seconds: float = 5.0


@dataclass(frozen=True)
class AppConfig:
    """A whole configuration file, checked."""

    path: str | None
    database_url: str
    scheduler: SchedulerSettings
    worker: WorkerSettings
    tasks: tuple[TaskSpec, ...]
    metrics: MetricsSettings = MetricsSettings()
    dashboard: DashboardSettings = DashboardSettings()
    #: Where ``database_url`` came from, for messages: ``[database] url in FILE`` or
    #: ``SCHEDULER_DATABASE_URL``.
    database_source: str = "[database] url"
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    broker: BrokerSettings = BrokerSettings()
    limits: tuple[Limit, ...] = ()


def _timezone(t: Keys, key: str) -> str:
    """A zone name checked as a zone (croniter's module: imported where a file is read)."""
    value = t.text(key)
    try:
        validate_timezone(value)
    except ValueError as exc:
        raise t.error(key, str(exc)) from exc
    return value


def _database_settings(t: Keys, path: str) -> DatabaseSettings:
    return database_settings(t.data, t.where)


def _scheduler_settings(data: Any, path: str) -> SchedulerSettings:
    t = Keys(data, f"{path}: [scheduler]", asdict(SchedulerSettings())).check_keys()
    settings = SchedulerSettings(
        max_consecutive_failures=t.integer("max_consecutive_failures", 0),
        tick_interval=t.number("tick_interval", positive=True),
        timezone=_timezone(t, "timezone"),
        batch_size=t.integer("batch_size", 1),
        tick_connections=t.integer("tick_connections", 0),
        backoff_base_seconds=t.number("backoff_base_seconds", positive=True),
        backoff_max_seconds=t.number("backoff_max_seconds", positive=True),
        payload_limit_bytes=t.integer("payload_limit_bytes", 1),
        clock=t.text("clock"),
        wakeups=t.flag("wakeups"),
    )
    if settings.clock not in CLOCK_MODES:
        raise t.error("clock", f"expected 'database' or 'local', got {settings.clock!r}")
    if settings.backoff_base_seconds > settings.backoff_max_seconds:
        raise t.error("backoff_base_seconds", "must not exceed backoff_max_seconds")
    return settings


def _worker_settings(data: Any, path: str) -> WorkerSettings:
    t = Keys(data, f"{path}: [worker]", asdict(WorkerSettings())).check_keys()
    settings = WorkerSettings(
        imports=t.strings("imports"),
        concurrency=t.integer("concurrency", 0),
        async_concurrency=t.integer("async_concurrency", 1),
        lease_seconds=t.number("lease_seconds", 5),
        shutdown_grace_seconds=t.number("shutdown_grace_seconds"),
        cancel_grace=t.number("cancel_grace"),
        purge_succeeded_after_days=t.number("purge_succeeded_after_days", positive=True),
        purge_aborted_after_days=t.number("purge_aborted_after_days", positive=True),
        purge_audit_after_days=t.number("purge_audit_after_days"),
        queues=t.strings("queues"),
        error_messages=t.text("error_messages"),
    )
    if not settings.queues:
        raise t.error("queues", "must name at least one queue")
    if settings.error_messages not in ERROR_MESSAGES:
        raise t.error(
            "error_messages", f"expected 'none' or 'first-line', got {settings.error_messages!r}"
        )
    return settings


def worker_options(
    settings: WorkerSettings, *, queues: str | None = None, concurrency: int | None = None
) -> WorkerSettings:
    """``scheduler worker``'s ``--queues`` (comma-separated) and ``--concurrency`` over the
    file's ``[worker]`` values, checked as the file's keys are (the same error lines)."""
    if queues is None and concurrency is None:
        return settings
    merged: dict[str, Any] = asdict(settings)
    if queues is not None:
        merged["queues"] = [part.strip() for part in queues.split(",")]
    if concurrency is not None:
        merged["concurrency"] = concurrency
    return _worker_settings(merged, "command line (--queues, --concurrency)")


def broker_url_problem(url: str) -> str | None:
    """Why ``url`` is not a broker URL (redis://, rediss:// or unix://), or None."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in BROKER_SCHEMES:
        expected = ", ".join(f"{scheme}://" for scheme in BROKER_SCHEMES)
        return f"expected a Redis URL ({expected}), got {parts.scheme or 'no'} scheme"
    if parts.scheme != "unix" and not parts.hostname:
        return "expected a host: redis://HOST:PORT/DB"
    return None


def broker_settings(data: Mapping[str, Any], where: str = "[broker]") -> BrokerSettings:
    """Check the ``[broker]`` keys in ``data``; ``SCHEDULER_BROKER_URL`` (set and not empty)
    wins over ``url``."""
    t = Keys(data, where, asdict(BrokerSettings())).check_keys()
    url = t.text("url") if "url" in t.data else None
    source = t
    if env := os.environ.get(BROKER_URL_ENV, "").strip():
        url, source = env, Keys({"url": env}, BROKER_URL_ENV, t.defaults)
    if url is not None and (problem := broker_url_problem(url)) is not None:
        raise source.error("url", problem)
    prefix = t.text("prefix")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,100}", prefix):
        raise t.error(
            "prefix", f"expected 1 to 100 letters, digits, '_', '.', ':', '-', got {prefix!r}"
        )
    return BrokerSettings(url=url, prefix=prefix)


def _metrics_settings(data: Any, path: str) -> MetricsSettings:
    t = Keys(data, f"{path}: [metrics]", asdict(MetricsSettings())).check_keys()
    port = t.integer("port", 0)
    if port > 65535:
        raise t.error("port", f"must be at most 65535, got {port}")
    if env := os.environ.get(METRICS_PORT_ENV, "").strip():
        if not env.isdigit() or int(env) > 65535:
            raise ConfigError(f"{METRICS_PORT_ENV}: expected a port (0 to 65535), got {env!r}")
        port = int(env)
    return MetricsSettings(
        port=port, host=t.text("host"), cache_seconds=t.number("cache_seconds", positive=True)
    )


def _dashboard_settings(data: Any, path: str) -> DashboardSettings:
    t = Keys(data, f"{path}: [dashboard]", asdict(DashboardSettings())).check_keys()
    optional = {
        key: t.text(key) if key in t.data else None for key in ("username", "password_hash")
    }
    if optional["password_hash"] is not None:
        try:
            check_hash_format(optional["password_hash"])
        except ValueError as exc:
            raise t.error("password_hash", str(exc)) from None
    # A username alone is complete here: its hash may be in the environment of the one process
    # that needs it, `scheduler dashboard`, which refuses to start without it.
    if optional["password_hash"] is not None and optional["username"] is None:
        raise t.error("username", "missing: username and password_hash go together")
    port = t.integer("port", 1)
    if port > 65535:
        raise t.error("port", f"must be at most 65535, got {port}")
    return DashboardSettings(
        host=t.text("host"),
        port=port,
        actions=t.flag("actions"),
        username=optional["username"],
        password_hash=optional["password_hash"],
        refresh_seconds=t.number("refresh_seconds", 1),
    )


def _task(t: Keys, name: str, settings: SchedulerSettings) -> TaskSpec:
    cron = t.text("cron")
    if len(cron) > MAX_NAME:
        raise t.error("cron", f"longer than {MAX_NAME} characters")
    try:
        validate_cron(cron, name)
    except ValueError as exc:
        raise t.error("cron", str(exc)) from exc
    handler = t.name("handler")
    payload = t.get("payload", "a table", is_table)
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
    tenant = None
    if "tenant" in t.data:
        tenant = t.get("tenant", "a string", lambda v: isinstance(v, str))
        problem = tenant_problem(tenant)
        if problem is not None:
            raise t.error("tenant", problem)
    return TaskSpec(
        name=name,
        cron=cron,
        handler=handler,
        payload=decode_payload(encoded),  # normalised: exactly what the database will hold
        timezone=_timezone(t, "timezone"),
        concurrent=t.flag("concurrent"),
        max_consecutive_failures=t.integer(limit, 0) if limit in t.data else None,
        enabled=t.flag("enabled"),
        overlap=_overlap(t) or ("allow" if t.flag("concurrent") else "hold"),
        catchup_window=t.integer("catchup_window", 0),
        jitter=t.integer("jitter", 0),
        tenant=tenant,
        **_recovery(t),
        timeout=_task_timeout(t),
    )


def _recovery(t: Keys) -> dict[str, Any]:
    """The task's ``recovery`` and ``probe_intervals``."""
    recovery = t.data.get("recovery", MANUAL)
    problem = recovery_problem(recovery)
    if problem is not None:
        raise t.error("recovery", problem)
    intervals = t.data.get("probe_intervals", PROBE_INTERVALS)
    problem = probe_intervals_problem(intervals)
    if problem is not None:
        raise t.error("probe_intervals", problem)
    return {"recovery": recovery, "probe_intervals": tuple(float(v) for v in intervals)}


def _task_timeout(t: Keys) -> float | None:
    """A task's ``timeout``: absent (its handler's), 0 (no limit) or positive seconds."""
    if "timeout" not in t.data:
        return None
    value = t.data["timeout"]
    problem = timeout_problem(value)
    if problem is not None:
        raise t.error("timeout", problem)
    return float(value)


def _overlap(t: Keys) -> str | None:
    if "overlap" not in t.data:
        return None
    value = t.data["overlap"]
    problem = overlap_problem(value, t.flag("concurrent"))
    if problem is not None:
        raise t.error(*problem)
    return str(value)


def _tasks(data: list[Any], path: str, settings: SchedulerSettings) -> tuple[TaskSpec, ...]:
    defaults = dict.fromkeys(("name", "cron", "handler"), MISSING) | {
        "payload": {},
        "timezone": settings.timezone,
        "concurrent": False,
        "max_consecutive_failures": None,
        "enabled": True,
        "overlap": None,
        "catchup_window": 0,
        "jitter": 0,
        "tenant": None,
        "recovery": "manual",
        "probe_intervals": list(PROBE_INTERVALS),
        "timeout": None,
    }
    seen: dict[str, int] = {}
    specs = []
    for index, item in enumerate(data):
        table = Keys(item, f"{path}: tasks[{index}]", defaults)
        try:
            name = table.name("name")
        except ConfigError:
            table.check_keys()  # a misspelt key explains a missing name best
            raise
        table.where = f"{path}: task {name!r}"  # later errors name the task
        if isinstance(item, dict) and "group" in item:
            raise table.error(
                "group", "only a task created at runtime (put_task) has a group, not the file's"
            )
        table.check_keys()
        if name in seen:
            raise table.error("name", f"duplicate task name (also tasks[{seen[name]}])")
        seen[name] = index
        specs.append(_task(table, name, settings))
    return tuple(specs)


def parse_config(data: Mapping[str, Any], path: str = "<config>") -> AppConfig:
    """Check already-parsed TOML ``data``; ``path`` names the source in error messages.

    ``SCHEDULER_DATABASE_URL``, when set and non-empty, overrides ``[database] url`` (and is
    taken as given: a relative SQLite path is the working directory's). A relative SQLite path
    in the file is relative to the file's folder. ``AppConfig.path`` is ``path``, or None when
    left at ``"<config>"`` (no file).
    """
    sections: dict[str, Any] = {
        "database": {},
        "scheduler": {},
        "worker": {},
        "metrics": {},
        "dashboard": {},
        "broker": {},
        "tasks": [],
        "limits": [],
    }
    top = Keys(data, path, sections)
    top.check_keys()
    database = Keys(
        top.get("database", "a table", is_table),
        f"{path}: [database]",
        {"url": DEFAULT_URL, **asdict(DatabaseSettings())},
    )
    database_settings = _database_settings(database.check_keys(), path)
    url = database.text("url")
    source = "[database] url" if path == "<config>" else f"[database] url in {path}"
    if path != "<config>":
        url = relative_sqlite_url(url, os.path.dirname(os.path.abspath(path)))
    if os.environ.get(DATABASE_URL_ENV):
        url, source = os.environ[DATABASE_URL_ENV], DATABASE_URL_ENV
    url = normalize_database_url(url, source)
    settings = _scheduler_settings(top.get("scheduler", "a table", is_table), path)
    tasks = top.get("tasks", "an array of tables", lambda v: isinstance(v, list))
    return AppConfig(
        path=None if path == "<config>" else path,
        database_url=url,
        database_source=source,
        scheduler=settings,
        worker=_worker_settings(top.get("worker", "a table", is_table), path),
        tasks=_tasks(tasks, path, settings),
        metrics=_metrics_settings(top.get("metrics", "a table", is_table), path),
        dashboard=_dashboard_settings(top.get("dashboard", "a table", is_table), path),
        database=database_settings,
        broker=broker_settings(top.get("broker", "a table", is_table), f"{path}: [broker]"),
        limits=parse_limits(
            top.get("limits", "an array of tables", lambda v: isinstance(v, list)), path
        ),
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
        raise ConfigError(one_line(f"{name}: invalid TOML: {exc}")) from exc
    except RecursionError:
        raise ConfigError(f"{name}: invalid TOML: arrays or tables nested too deeply") from None
    return parse_config(data, name)
