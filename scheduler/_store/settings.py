"""How the store connects: the ``[database]`` keys besides ``url`` (each also
``SCHEDULER_DATABASE_<KEY>`` in the environment, which wins), and the database URL itself,
checked and given the scheduler's driver."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from .._model.rules import Keys

if TYPE_CHECKING:
    from sqlalchemy import URL

DEFAULT_URL = "sqlite:///scheduler.db"
POOLER_MODES = ("none", "transaction")  # [database] pooler
DATABASE_ENV_PREFIX = "SCHEDULER_DATABASE_"  # SCHEDULER_DATABASE_<KEY> wins over [database] KEY


@dataclass(frozen=True)
class DatabaseSettings:
    """The ``[database]`` table's keys besides ``url``: how the scheduler connects."""

    pool_size: int = 5  # connections one process keeps open
    max_overflow: int = 10  # extra connections under load, closed when idle
    connect_timeout: float = 10.0  # seconds for one connection attempt
    statement_timeout: float = 0.0  # seconds any one statement of ours may run; 0 = off
    pooler: str = "none"  # or "transaction": the URL is a transaction-mode pooler (PgBouncer)
    listen_url: str | None = None  # a direct URL for the connection that listens for wake-ups
    shards: int = 1  # PostgreSQL: the tables once per shard, in schemas scheduler_shard_0..N-1


def _database_value(t: Keys, key: str) -> Any:
    """``[database] key``, or ``SCHEDULER_DATABASE_<KEY>`` when that is set (it wins)."""
    readers: dict[str, Callable[[Keys], Any]] = {
        "pool_size": lambda table: table.integer("pool_size", 1),
        "max_overflow": lambda table: table.integer("max_overflow", 0),
        "connect_timeout": lambda table: table.number("connect_timeout", positive=True),
        "statement_timeout": lambda table: table.number("statement_timeout"),
        "pooler": lambda table: table.choice("pooler", POOLER_MODES),
        "listen_url": lambda table: (
            table.text("listen_url") if "listen_url" in table.data else None
        ),
        "shards": lambda table: table.integer("shards", 1),
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
    return readers[key](Keys({key: value}, name, t.defaults))


def database_settings(data: Mapping[str, Any], where: str = "[database]") -> DatabaseSettings:
    """Check the ``[database]`` keys besides ``url`` in ``data`` (a TOML table, or the keyword
    arguments of ``Scheduler(...)``); ``SCHEDULER_DATABASE_<KEY>`` overrides each."""
    defaults = {"url": DEFAULT_URL, **asdict(DatabaseSettings())}
    t = Keys(data, where, defaults).check_keys()
    keys = [key for key in defaults if key != "url"]
    settings = DatabaseSettings(**{key: _database_value(t, key) for key in keys})
    if settings.listen_url is not None:
        listen = normalize_database_url(settings.listen_url, f"{where}: key 'listen_url'")
        if not listen.startswith("postgresql"):
            raise t.error("listen_url", "must be a PostgreSQL URL (only PostgreSQL can LISTEN)")
        settings = replace(settings, listen_url=listen)
    return settings


def settings_from_environment() -> DatabaseSettings:
    """The ``[database]`` defaults with ``SCHEDULER_DATABASE_<KEY>`` applied (what an engine
    made without settings uses)."""
    return database_settings({}, "environment")


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


def relative_sqlite_url(url: str, folder: str) -> str:
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


def missing_driver(url: str, source: str, exc: ImportError) -> str:
    """What to install for a URL whose driver is not installed, naming where the URL came
    from."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    ours = {"postgresql": ("postgres", "psycopg"), "mysql": ("mysql", "pymysql")}
    extra, driver = ours.get(parsed.get_backend_name().replace("mariadb", "mysql"), ("", ""))
    hint = ""
    if extra and parsed.get_driver_name() == driver:
        hint = f": pip install 'rerun-scheduler[{extra}]'"
    elif extra:
        scheme = parsed.get_backend_name()
        hint = (
            f": install it, or write {scheme}://… for {driver}"
            f" (pip install 'rerun-scheduler[{extra}]')"
        )
    return f"{source}: the database driver is not installed ({exc}){hint}"


def missing_database(url: URL, exc: BaseException) -> str | None:
    """For a server that says the database does not exist: how to create it; else None."""
    from sqlalchemy.exc import OperationalError

    if not isinstance(exc, OperationalError):
        return None
    text = str(exc.orig)
    backend, name = url.get_backend_name(), url.database or ""
    host = f"-h {url.host or 'localhost'}" + (f" -p {url.port}" if url.port else "")
    if backend == "postgresql" and f'database "{name}" does not exist' in text:
        user = f" -U {url.username}" if url.username else ""
        return f"create it with `createdb {host}{user} {name}`, then run `scheduler migrate`"
    if backend in ("mysql", "mariadb") and "Unknown database" in text:
        host = host.replace("-p ", "-P ")
        user = f" -u {url.username}" if url.username else ""
        create = f'mysql {host}{user} -e "CREATE DATABASE {name}"'
        return f"create it with `{create}`, then run `scheduler migrate`"
    return None
