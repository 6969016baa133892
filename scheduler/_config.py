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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ._cron import validate_cron, validate_timezone
from ._errors import ConfigError, PayloadError
from ._passwords import check_hash_format
from ._payload import decode_payload, encode_payload, find_credential_key
from ._store.engine import DatabaseSettings
from ._store.jobs import tenant_problem

DEFAULT_URL = "sqlite:///scheduler.db"
DATABASE_URL_ENV = "SCHEDULER_DATABASE_URL"
METRICS_PORT_ENV = "SCHEDULER_METRICS_PORT"  # one port per worker of a systemd template unit
DASHBOARD_PASSWORD_ENV = "SCHEDULER_DASHBOARD_PASSWORD_HASH"
MAX_NAME_LENGTH = 200
CLOCK_MODES = ("database", "local")  # [scheduler] clock (scheduler/_store/clock.py)
POOLER_MODES = ("none", "transaction")  # [database] pooler
DATABASE_ENV_PREFIX = "SCHEDULER_DATABASE_"  # SCHEDULER_DATABASE_<KEY> wins over [database] KEY
BROKER_URL_ENV = "SCHEDULER_BROKER_URL"  # wins over [broker] url
BROKER_SCHEMES = ("redis", "rediss", "unix")  # what redis-py's from_url opens


@dataclass(frozen=True)
class TaskSpec:
    """One recurring task as declared in ``[[tasks]]``, with the file's defaults.

    ``timezone`` None means the Scheduler's ``[scheduler] timezone`` (UTC unless set), as
    for a task in the file without one; ``Scheduler.sync`` fills it in.
    """

    name: str
    cron: str
    handler: str
    payload: dict[str, Any] = field(default_factory=dict)
    timezone: str | None = None
    concurrent: bool = False
    max_consecutive_failures: int | None = None  # None: use [scheduler]'s; 0 = unlimited
    enabled: bool = True
    overlap: str = "hold"
    """While the last job is in flight: "hold" (the default), "skip" or "allow".
    ``concurrent=True`` is its alias: it makes the default "allow" (and another value beside
    it is refused by ``sync``, as in the file); None is taken as the default."""
    catchup_window: int = 0
    """Seconds a slot may be late before it is missed instead of run; 0: unlimited."""
    jitter: int = 0
    """Each slot fires at a deterministic delay in [0, jitter) seconds; 0: none."""

    def __post_init__(self) -> None:
        if self.overlap is None or (self.concurrent and self.overlap == "hold"):
            object.__setattr__(self, "overlap", "allow" if self.concurrent else "hold")

    @property
    def policy(self) -> str:
        """The overlap policy in force (``overlap``; kept for older callers)."""
        return self.overlap

    tenant: str | None = None  # whose task: its jobs carry it (``job.tenant``)


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
    purge_succeeded_after_days: float = 7.0
    purge_aborted_after_days: float = 30.0
    purge_audit_after_days: float = 365.0  # 0 = keep the audit log for ever
    queues: tuple[str, ...] = ("default",)


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

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.text(key)
        if value not in choices:
            expected = " or ".join(repr(choice) for choice in choices)
            raise self.error(key, f"expected {expected}, got {value!r}")
        return value

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


def _database_value(t: _Table, key: str) -> Any:
    """``[database] key``, or ``SCHEDULER_DATABASE_<KEY>`` when that is set (it wins)."""
    readers: dict[str, Callable[[_Table], Any]] = {
        "pool_size": lambda table: table.integer("pool_size", 1),
        "max_overflow": lambda table: table.integer("max_overflow", 0),
        "connect_timeout": lambda table: table.number("connect_timeout", positive=True),
        "statement_timeout": lambda table: table.number("statement_timeout"),
        "pooler": lambda table: table.choice("pooler", POOLER_MODES),
        "listen_url": lambda table: (
            table.text("listen_url") if "listen_url" in table.data else None
        ),
    }
    name = DATABASE_ENV_PREFIX + key.upper()
    raw = os.environ.get(name, "").strip()
    if not raw:
        return readers[key](t)
    value: Any = raw
    if isinstance(t.defaults[key], int | float) and not isinstance(t.defaults[key], bool):
        try:
            value = int(raw) if isinstance(t.defaults[key], int) else float(raw)
        except ValueError:
            kind = "an integer" if isinstance(t.defaults[key], int) else "a number"
            raise ConfigError(f"{name}: expected {kind}, got {raw!r}") from None
    return readers[key](_Table({key: value}, name, t.defaults))


def database_settings(data: Mapping[str, Any], where: str = "[database]") -> DatabaseSettings:
    """Check the ``[database]`` keys besides ``url`` in ``data`` (a TOML table, or the keyword
    arguments of ``Scheduler(...)``); ``SCHEDULER_DATABASE_<KEY>`` overrides each."""
    defaults = {"url": DEFAULT_URL, **asdict(DatabaseSettings())}
    t = _Table(data, where, defaults).check_keys()
    keys = [key for key in defaults if key != "url"]
    settings = DatabaseSettings(**{key: _database_value(t, key) for key in keys})
    if settings.listen_url is not None:
        listen = normalize_database_url(settings.listen_url, f"{where}: key 'listen_url'")
        if not listen.startswith("postgresql"):
            raise t.error("listen_url", "must be a PostgreSQL URL (only PostgreSQL can LISTEN)")
        settings = replace(settings, listen_url=listen)
    return settings


def _database_settings(t: _Table, path: str) -> DatabaseSettings:
    return database_settings(t.data, t.where)


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
        clock=t.text("clock"),
        wakeups=t.flag("wakeups"),
    )
    if settings.clock not in CLOCK_MODES:
        raise t.error("clock", f"expected 'database' or 'local', got {settings.clock!r}")
    if settings.backoff_base_seconds > settings.backoff_max_seconds:
        raise t.error("backoff_base_seconds", "must not exceed backoff_max_seconds")
    return settings


def _worker_settings(data: Any, path: str) -> WorkerSettings:
    t = _Table(data, f"{path}: [worker]", asdict(WorkerSettings())).check_keys()
    settings = WorkerSettings(
        imports=t.strings("imports"),
        concurrency=t.integer("concurrency", 0),
        async_concurrency=t.integer("async_concurrency", 1),
        lease_seconds=t.number("lease_seconds", 5),
        shutdown_grace_seconds=t.number("shutdown_grace_seconds"),
        purge_succeeded_after_days=t.number("purge_succeeded_after_days", positive=True),
        purge_aborted_after_days=t.number("purge_aborted_after_days", positive=True),
        purge_audit_after_days=t.number("purge_audit_after_days"),
        queues=t.strings("queues"),
    )
    if not settings.queues:
        raise t.error("queues", "must name at least one queue")
    return settings


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
    t = _Table(data, where, asdict(BrokerSettings())).check_keys()
    url = t.text("url") if "url" in t.data else None
    source = t
    if env := os.environ.get(BROKER_URL_ENV, "").strip():
        url, source = env, _Table({"url": env}, BROKER_URL_ENV, t.defaults)
    if url is not None and (problem := broker_url_problem(url)) is not None:
        raise source.error("url", problem)
    prefix = t.text("prefix")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,100}", prefix):
        raise t.error(
            "prefix", f"expected 1 to 100 letters, digits, '_', '.', ':', '-', got {prefix!r}"
        )
    return BrokerSettings(url=url, prefix=prefix)


def _metrics_settings(data: Any, path: str) -> MetricsSettings:
    t = _Table(data, f"{path}: [metrics]", asdict(MetricsSettings())).check_keys()
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
    t = _Table(data, f"{path}: [dashboard]", asdict(DashboardSettings())).check_keys()
    optional = {
        key: t.text(key) if key in t.data else None for key in ("username", "password_hash")
    }
    if optional["password_hash"] is not None:
        try:
            check_hash_format(optional["password_hash"])
        except ValueError as exc:
            raise t.error("password_hash", str(exc)) from None
    if (optional["username"] is None) != (optional["password_hash"] is None) and not os.environ.get(
        DASHBOARD_PASSWORD_ENV
    ):
        missing = "password_hash" if optional["password_hash"] is None else "username"
        raise t.error(missing, "missing: username and password_hash go together")
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
        timezone=t.timezone("timezone"),
        concurrent=t.flag("concurrent"),
        max_consecutive_failures=t.integer(limit, 0) if limit in t.data else None,
        enabled=t.flag("enabled"),
        overlap=_overlap(t) or ("allow" if t.flag("concurrent") else "hold"),
        catchup_window=t.integer("catchup_window", 0),
        jitter=t.integer("jitter", 0),
        tenant=tenant,
    )


OVERLAPS = ("hold", "skip", "allow")


def overlap_problem(overlap: Any, concurrent: Any) -> tuple[str, str] | None:
    """(key, why) when `overlap` is not a policy or contradicts `concurrent`; else None."""
    if overlap is None:
        return None
    if not isinstance(overlap, str) or overlap not in OVERLAPS:
        shown = repr(overlap) if isinstance(overlap, str) else _kind(overlap)
        return "overlap", f"expected one of {', '.join(map(repr, OVERLAPS))}, got {shown}"
    if concurrent and overlap != "allow":
        return "concurrent", f"concurrent = true is overlap = 'allow', contradicting {overlap!r}"
    return None


def _overlap(t: _Table) -> str | None:
    if "overlap" not in t.data:
        return None
    value = t.data["overlap"]
    problem = overlap_problem(value, t.flag("concurrent"))
    if problem is not None:
        raise t.error(*problem)
    return str(value)


def _tasks(data: list[Any], path: str, settings: SchedulerSettings) -> tuple[TaskSpec, ...]:
    defaults = dict.fromkeys(("name", "cron", "handler"), _MISSING) | {
        "payload": {},
        "timezone": settings.timezone,
        "concurrent": False,
        "max_consecutive_failures": None,
        "enabled": True,
        "overlap": None,
        "catchup_window": 0,
        "jitter": 0,
        "tenant": None,
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


#: Spellings of a database URL without a driver, and the driver the scheduler uses for each.
_DRIVERS = {
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}
_EXAMPLES = "sqlite:///FILE.db, postgresql://USER@HOST/DBNAME or mysql://USER@HOST/DBNAME"


def normalize_database_url(url: str, source: str) -> str:
    """``url`` with the scheduler's driver for the common spellings (``postgres://``,
    ``postgresql://``: psycopg; ``mysql://``, ``mariadb://``: PyMySQL); a ConfigError naming
    ``source`` for a URL that is not one SQLAlchemy can open."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"{source}: not a database URL: expected {_EXAMPLES}") from None
    scheme = parsed.drivername
    if scheme in _DRIVERS:
        return url.replace(f"{scheme}:", f"{_DRIVERS[scheme]}:", 1)
    try:
        parsed.get_dialect()
    except Exception:  # NoSuchModuleError and its kin: the scheme names no dialect
        raise ConfigError(
            f"{source}: unknown database kind {scheme!r}: expected {_EXAMPLES}"
        ) from None
    return url


def _relative_to(url: str, folder: str) -> str:
    """A SQLite URL's relative file path made relative to ``folder`` (the config file's)."""
    if not url.startswith("sqlite"):
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return url  # normalize_database_url says what is wrong with it
    database = parsed.database
    if (
        not database
        or database == ":memory:"
        or database.startswith("file:")
        or os.path.isabs(database)
    ):
        return url
    return parsed.set(database=os.path.join(folder, database)).render_as_string(hide_password=False)


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
    }
    top = _Table(data, path, sections)
    top.check_keys()
    database = _Table(
        top.get("database", "a table", _is_table),
        f"{path}: [database]",
        {"url": DEFAULT_URL, **asdict(DatabaseSettings())},
    )
    database_settings = _database_settings(database.check_keys(), path)
    url = database.text("url")
    source = "[database] url" if path == "<config>" else f"[database] url in {path}"
    if path != "<config>":
        url = _relative_to(url, os.path.dirname(os.path.abspath(path)))
    if os.environ.get(DATABASE_URL_ENV):
        url, source = os.environ[DATABASE_URL_ENV], DATABASE_URL_ENV
    url = normalize_database_url(url, source)
    settings = _scheduler_settings(top.get("scheduler", "a table", _is_table), path)
    tasks = top.get("tasks", "an array of tables", lambda v: isinstance(v, list))
    return AppConfig(
        path=None if path == "<config>" else path,
        database_url=url,
        database_source=source,
        scheduler=settings,
        worker=_worker_settings(top.get("worker", "a table", _is_table), path),
        tasks=_tasks(tasks, path, settings),
        metrics=_metrics_settings(top.get("metrics", "a table", _is_table), path),
        dashboard=_dashboard_settings(top.get("dashboard", "a table", _is_table), path),
        database=database_settings,
        broker=broker_settings(top.get("broker", "a table", _is_table), f"{path}: [broker]"),
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
