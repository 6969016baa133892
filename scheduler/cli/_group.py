"""The ``scheduler`` group: the options every command shares, the :class:`State` that builds the
Scheduler when a command first needs it, one error line per failure, and the entry points
(:func:`main`, :func:`console`). The commands are in the modules beside this one.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

import click

from .._errors import ConfigError, SchedulerError

if TYPE_CHECKING:
    from .._app import Scheduler

# Each command imports what it needs when it runs: `scheduler --help` imports no SQLAlchemy,
# Alembic or croniter (the CLI's tests count), and `status` no Alembic.

CONFIG_ENV = "SCHEDULER_CONFIG"
DEFAULT_CONFIG = "app.toml"
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
log = logging.getLogger("scheduler.cli")  # also when run as `python -m scheduler.cli`
# Set when a command imports the user's modules ([worker] imports): their objects may want
# the interpreter's teardown (see console()).
_user_code_imported = False


def _database_line(exc: BaseException) -> str:
    """The first line of a database error (the driver's own, when SQLAlchemy wraps one)."""
    orig = getattr(exc, "orig", None)
    lines = [ln.strip() for ln in str(orig if orig is not None else exc).splitlines()]
    return next((ln for ln in lines if ln), type(exc).__name__)


def _unreachable(exc: BaseException) -> bool:
    """True for the error of a server that could not be reached or used (refused, timed out,
    a wrong password): SQLAlchemy's OperationalError or InterfaceError."""
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")  # not imported: not its error
    return sqlalchemy_exc is not None and isinstance(
        exc, sqlalchemy_exc.OperationalError | sqlalchemy_exc.InterfaceError
    )


def describe(exc: BaseException) -> str:
    """One line saying what went wrong."""
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")  # not imported: not its error
    if sqlalchemy_exc is not None and isinstance(exc, sqlalchemy_exc.SQLAlchemyError):
        return f"database error: {_database_line(exc)}"
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    if isinstance(exc, SchedulerError | ImportError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Group(click.Group):
    """Turns any error of a command into one line on stderr, exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, BrokenPipeError):
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                traceback.print_exc()
            click.echo(f"error: {describe(exc)}", err=True)
            ctx.exit(1)


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    if level != "DEBUG":  # alembic chats at INFO on every schema check
        logging.getLogger("alembic").setLevel(logging.WARNING)


class State:
    """The configuration path; the Scheduler is built when a command first needs it."""

    def __init__(
        self,
        config: str | None,
        config_given: bool = False,
        factory: Callable[[], Scheduler] | None = None,
    ) -> None:
        self.config = config
        self.config_given = config_given  # by --config (not the environment)
        self.factory = factory  # builds the Scheduler instead of the file (manage.py scheduler)
        self.app: Scheduler | None = None

    def open(self, check_schema: bool = True) -> Scheduler:
        if self.app is None and self.factory is not None:
            self.app = self.factory()
        if self.app is None:
            if self.config is None and not os.path.exists(DEFAULT_CONFIG):
                raise ConfigError(
                    f"no configuration: pass --config FILE, set {CONFIG_ENV}, or create"
                    f" {DEFAULT_CONFIG} in the current directory"
                )
            path = os.path.abspath(self.config or DEFAULT_CONFIG)
            from .._app import Scheduler

            self.app = Scheduler.from_toml(path)
            os.environ[CONFIG_ENV] = path  # handler modules may build their own app from it
        if check_schema:
            try:
                self.app.check_schema()  # refuse an outdated schema: "run `scheduler migrate`"
            except SchedulerError as exc:
                if not self.config_given:
                    raise
                # `scheduler migrate` alone would read ./app.toml: name the file in use.
                again = f"`scheduler --config {self.config} migrate`"
                raise type(exc)(str(exc).replace("`scheduler migrate`", again)) from None
            except Exception as exc:
                if not _unreachable(exc):
                    raise
                # The first contact with the server: say which database, and where its URL
                # came from, as the other database errors do.
                where = f"database {self.app.database_name} ({self.app.database_source})"
                raise SchedulerError(f"{where}: {_database_line(exc)}") from exc
        return self.app

    def import_handlers(self) -> None:
        """Import the [worker] imports, from the config file's folder or the current one."""
        from .._worker.worker import import_handlers

        global _user_code_imported
        app = self.open()
        folder = os.path.dirname(app.config_path) if app.config_path else None
        _user_code_imported = True
        import_handlers(app.worker_settings.imports, folder)

    def close(self) -> None:
        if self.app is not None:
            self.app.close()


pass_state = click.make_pass_decorator(State)


def audited(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--reason`` and ``--actor``: the audit entry the command writes (docs/howto/operate.md)."""
    command = click.option(
        "--actor",
        metavar="WHO",
        help="Who acts, for the audit log [default: $SCHEDULER_ACTOR, else user@host].",
    )(command)
    return click.option("--reason", metavar="TEXT", help="Why, for the audit log.")(command)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "-c",
    metavar="FILE",
    envvar=CONFIG_ENV,
    show_envvar=True,
    help=f"TOML configuration file [default: ./{DEFAULT_CONFIG}].",
)
@click.option("--debug", is_flag=True, help="Debug logging, and tracebacks on errors.")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    envvar="SCHEDULER_LOG_LEVEL",
    help="Log level (logs go to stderr).",
)
@click.version_option(None, "--version", package_name="rerun-scheduler", prog_name="scheduler")
@click.pass_context
def cli(ctx: click.Context, config: str | None, debug: bool, log_level: str) -> None:
    """Recurring tasks with rerun-in-place, on a durable SQL job queue."""
    _setup_logging("DEBUG" if debug else log_level.upper())
    given = ctx.get_parameter_source("config") == click.core.ParameterSource.COMMANDLINE
    factory = ctx.obj if callable(ctx.obj) else None  # main(app_factory=...)
    state = State(config, config_given=given, factory=factory)
    ctx.obj = state
    ctx.call_on_close(state.close)


Users = dict[str, tuple[list[str], int]]
"""Per handler: the first names of the tasks that use it (up to three), and how many do."""


def users_of(tasks: Iterable[tuple[str, str]]) -> Users:
    """:data:`Users` of a list of (task name, handler)."""
    found: Users = {}
    for name, handler in tasks:
        names, count = found.get(handler, ([], 0))
        if len(names) < 3:
            names.append(name)
        found[handler] = (names, count + 1)
    return found


def unknown_handlers(app: Scheduler, users: Users) -> list[str]:
    """One line per handler that no imported module registered, naming the tasks that use it
    (the first three, and how many more: a task per customer must not print 100,000 lines)."""
    imports = app.worker_settings.imports
    where = f"[worker] imports ({', '.join(imports)})" if imports else "[worker] imports (none)"
    known = app.registry.names()
    found = []
    for handler, (names, count) in users.items():
        if handler in app.registry:
            continue
        import difflib  # only for a mistake

        close = difflib.get_close_matches(handler, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        if count == 1:
            who = f"task {names[0]!r}: handler {handler!r}"
        else:
            shown = ", ".join(repr(n) for n in names[:3])
            more = f" and {count - 3:,} more" if count > 3 else ""
            who = f"tasks {shown}{more} ({count:,}): handler {handler!r}"
        found.append(f"{who} is not registered by {where}{hint}")
    return found


def enabled_rows(app: Scheduler) -> Users:
    """The handlers the enabled rows name (two statements whatever the number of rows; per
    shard with ``[database] shards`` above 1)."""
    from .._store import rows as _rows

    found: Users = {}
    for shard in app.shards:
        with shard.store.read() as conn:
            named = _rows.enabled_handlers(conn, unknown=lambda h: h not in app.registry)
        for handler, (names, count) in named.items():
            known, total = found.get(handler, ([], 0))
            found[handler] = (sorted(known + names)[:3], total + count)
    return found


def hard_exit(code: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(
    argv: list[str] | None = None,
    *,
    app_factory: Callable[[], Scheduler] | None = None,
    prog_name: str = "scheduler",
) -> None:
    """Entry point of the ``scheduler`` command. ``app_factory`` builds the Scheduler that the
    commands use, instead of the configuration file (``manage.py scheduler`` passes
    ``scheduler.contrib.django.get_scheduler``)."""
    # A closed stdout (`scheduler status | head`) is left to click: exit 1, nothing printed.
    cli.main(args=argv, prog_name=prog_name, obj=app_factory)


def console() -> NoReturn:
    """The ``scheduler`` console script: :func:`main`, then the process ends without the
    interpreter's teardown when that is safe.

    Freeing every module and object one by one at exit (SQLAlchemy's above all) took about a
    sixth of a short command's time here (``benchmarks/cli_startup.py``). The command has
    closed its database by then (the app is closed with click's context: SQLite checkpoints
    its WAL at that close); the ``atexit`` handlers run (logging's flush, the wake-up
    publisher's), then the output is flushed and the process exits with ``os._exit``. The
    full exit is kept when another thread than the main one is still running (normal exit
    joins it), or when the command imported the user's modules, whose objects (an open file
    never flushed) may count on their finalizers."""
    try:
        main()
    except SystemExit as stop:
        code = stop.code
    else:
        code = 0
    if not isinstance(code, int):
        if code is not None:  # sys.exit("message"): printed, status 1
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    main_thread = threading.main_thread()
    running = any(t is not main_thread and not t.daemon for t in threading.enumerate())
    if _user_code_imported or running:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): what normal exit ignores too
            code = code or 1
    os._exit(code)
