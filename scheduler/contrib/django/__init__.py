"""Django integration (``pip install 'rerun-scheduler[django]'``).

Add ``"scheduler.contrib.django"`` to ``INSTALLED_APPS`` and describe the scheduler in
``settings.SCHEDULER``: either ``{"config": "path/to/app.toml"}`` or the TOML file's keys
themselves (``{"worker": {"concurrency": 4}, "tasks": [...]}``), plus ``"database"``: the
Django database alias whose database holds the scheduler's tables (default ``"default"``).
The alias decides the database: a ``[database] url`` in the file is not used (its other
``[database]`` keys are), nor ``SCHEDULER_DATABASE_URL``.

- :func:`get_scheduler` returns the :class:`~scheduler.Scheduler` those settings describe (one
  per process, rebuilt when a test overrides ``SCHEDULER`` or ``DATABASES``).
- Its writes (``enqueue``, ``enqueue_many``, ``trigger``, ``enable``, ``disable``,
  ``retry_job``, ``cancel_job``) made inside ``transaction.atomic()`` on that alias (or with
  ``ATOMIC_REQUESTS``) are written on Django's own connection, in the atomic block's
  transaction: they exist if and only if it commits. Outside an atomic block (Django's
  autocommit) each commits on its own, as Django's own writes do there. ``connection=`` also
  takes a Django connection (``django.db.connections["other"]``) inside its atomic block.
- ``manage.py scheduler COMMAND`` runs any ``scheduler`` command with these settings
  (``migrate`` creates the scheduler's tables with its own migrations, not Django models).

How the scheduler writes on Django's connection: a SQLAlchemy engine per alias whose
"connections" are Django's current DB-API connection for that alias (its thread's), behind a
proxy whose ``commit``, ``rollback`` and ``close`` do nothing (Django owns the transaction),
and through which SQLAlchemy cannot change the connection's settings (its own per-connection
set-up calls are ignored). Each write takes it for the call and gives it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.pool import NullPool

from ..._app import Scheduler
from ..._config import AppConfig, load_config, parse_config
from ..._errors import SchedulerError
from ..._store.caller import CallerTransaction, adopt
from ..._store.wakeup import detach as _detach_wakeup
from . import _sqlite

__all__ = ["DjangoScheduler", "get_scheduler"]

#: Django's own keys in a PostgreSQL ``OPTIONS``, which libpq does not take.
_DJANGO_PG_OPTIONS = {"isolation_level", "pool", "server_side_binding", "assume_role"}
_SETTING_KEYS = ("config", "database")


def _options(conf: Any) -> dict[str, Any]:
    if not isinstance(conf, Mapping):
        raise ImproperlyConfigured(
            f"settings.SCHEDULER: expected a dict, got {type(conf).__name__}"
        )
    return dict(conf)


def database_url(alias: str) -> URL:
    """A SQLAlchemy URL of the database Django's ``alias`` connects to (its test database
    while Django's test runner has it)."""
    if alias not in connections.settings:
        raise ImproperlyConfigured(f"settings.SCHEDULER: 'database': no Django database {alias!r}")
    db = connections[alias].settings_dict
    engine = str(db["ENGINE"])
    name = str(db.get("NAME") or "")
    if engine.endswith("sqlite3"):
        if not name or name == ":memory:" or name.startswith("file:"):
            raise ImproperlyConfigured(
                f"settings.SCHEDULER: Django database {alias!r} is an in-memory SQLite"
                " database: the scheduler needs a file, shared by its worker"
            )
        return URL.create("sqlite", database=str(Path(name).resolve()))
    common: dict[str, Any] = {
        "username": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": int(db["PORT"]) if db.get("PORT") else None,
        "database": name,
    }
    options = db.get("OPTIONS") or {}
    if "postgresql" in engine:
        query = {k: str(v) for k, v in options.items() if k not in _DJANGO_PG_OPTIONS}
        return URL.create(f"postgresql+{_pg_driver()}", query=query, **common)
    if "mysql" in engine:
        return URL.create("mysql+pymysql", query={"charset": "utf8mb4"}, **common)
    raise ImproperlyConfigured(
        f"settings.SCHEDULER: Django database {alias!r} uses {engine}: the scheduler supports"
        " SQLite, PostgreSQL and MariaDB/MySQL"
    )


def _pg_driver() -> str:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg2"
    return "psycopg"


def app_config() -> tuple[AppConfig, str]:
    """The settings' configuration, and the Django alias of its database."""
    conf = _options(getattr(settings, "SCHEDULER", {}))
    alias = conf.get("database", "default")
    if not isinstance(alias, str):
        raise ImproperlyConfigured("settings.SCHEDULER: 'database': expected an alias (a string)")
    keys = {key: value for key, value in conf.items() if key not in _SETTING_KEYS}
    if "config" in conf:
        if keys:
            raise ImproperlyConfigured(
                f"settings.SCHEDULER: give either 'config' (a TOML file) or the TOML keys"
                f" ({', '.join(sorted(keys))}), not both"
            )
        path = Path(str(conf["config"]))
        if not path.is_absolute() and getattr(settings, "BASE_DIR", None):
            path = Path(settings.BASE_DIR) / path
        config = load_config(path)
    else:
        config = parse_config(keys, "settings.SCHEDULER")
    url = database_url(alias).render_as_string(hide_password=False)
    config = dataclasses.replace(
        config, database_url=url, database_source=f"Django database {alias!r}"
    )
    return config, alias


_made: DjangoScheduler | None = None
_made_lock = threading.Lock()


def get_scheduler() -> DjangoScheduler:
    """The Scheduler that ``settings.SCHEDULER`` describes (one per process)."""
    global _made
    with _made_lock:
        if _made is None:
            config, alias = app_config()
            app = DjangoScheduler.from_config(config)
            assert isinstance(app, DjangoScheduler)
            app.django_alias = alias
            _made = app
        return _made


def _forget(setting: str, **_kw: Any) -> None:
    global _made
    if setting in ("SCHEDULER", "DATABASES"):
        with _made_lock:
            if _made is not None:
                _made.close()
            _made = None


setting_changed.connect(_forget, dispatch_uid="scheduler.contrib.django.forget")


class DjangoScheduler(Scheduler):
    """A Scheduler whose writes join Django's atomic block on its alias."""

    django_alias: str = "default"

    def _ambient_transaction(self) -> contextlib.AbstractContextManager[CallerTransaction | None]:
        wrapper = connections[self.django_alias]
        if not wrapper.in_atomic_block:
            return contextlib.nullcontext(None)  # Django's autocommit: our own transaction
        self.check_schema()  # once per Scheduler, on our own connection
        return self._on_django(wrapper)

    def _caller(
        self, connection: Any
    ) -> contextlib.AbstractContextManager[CallerTransaction | None]:
        if isinstance(connection, BaseDatabaseWrapper):
            self.check_schema()
            return self._on_django(connection)
        return super()._caller(connection)

    @contextlib.contextmanager
    def _on_django(self, wrapper: BaseDatabaseWrapper) -> Iterator[CallerTransaction]:
        if not wrapper.in_atomic_block:
            raise SchedulerError(
                f"connection=: Django's connection {wrapper.alias!r} is not inside"
                " transaction.atomic(): outside it, each statement commits at once"
            )
        wrapper.ensure_connection()
        with _borrowed_engine(wrapper).connect() as conn:
            conn.begin()  # SQLAlchemy's bookkeeping only: Django's transaction is open
            # The scheduler's database is its alias's by construction: only another alias's
            # database is compared with it.
            checked = adopt(conn, self.store, same_database=wrapper.alias == self.django_alias)
            alias = wrapper.alias
            yield CallerTransaction(checked.conn, lambda fn: transaction.on_commit(fn, using=alias))
            # Django commits, not SQLAlchemy (whose commit event would publish): the wake-up
            # of the broker and of this process's workers goes out at Django's commit.
            publish = _detach_wakeup(checked.conn)
            if publish is not None:
                transaction.on_commit(publish, using=alias)


class _Borrowed:
    """Django's DB-API connection, lent to SQLAlchemy: ``commit``, ``rollback`` and ``close``
    do nothing (Django owns them), SQLAlchemy's per-connection set-up calls are ignored, and
    attributes it sets stay on this proxy; everything else is the connection's."""

    _IGNORED = frozenset(
        ("commit", "rollback", "close", "create_function", "create_collation", "add_notice_handler")
    )

    def __init__(self, dbapi: Any) -> None:
        object.__setattr__(self, "_dbapi", dbapi)

    def __getattr__(self, name: str) -> Any:
        if name in self._IGNORED:
            return _nothing
        return getattr(self._dbapi, name)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


_engines: dict[tuple[str, str], Engine] = {}
_engines_lock = threading.Lock()


def _borrowed_engine(wrapper: BaseDatabaseWrapper) -> Engine:
    """A SQLAlchemy engine on ``wrapper``'s alias whose connection is the calling thread's
    Django connection (each connect takes it; NullPool: nothing is kept)."""
    alias = wrapper.alias
    key = (alias, wrapper.vendor)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            url = database_url(alias)
            if wrapper.vendor == "sqlite":  # its rows as Django's converters made them
                url = url.set(drivername=_sqlite.DRIVER)
            if wrapper.vendor == "mysql":  # the driver Django's connection is made with
                module = type(wrapper.connection).__module__.split(".")[0]
                url = url.set(
                    drivername="mysql+pymysql" if module == "pymysql" else "mysql+mysqldb"
                )
            options: dict[str, Any] = {}
            if wrapper.vendor == "postgresql":  # its start-up query wants psycopg's own class
                options["use_native_hstore"] = False
            engine = create_engine(
                url,
                creator=lambda: _Borrowed(connections[alias].connection),
                poolclass=NullPool,
                pool_reset_on_return=None,
                **options,
            )
            _engines[key] = engine
    return engine
