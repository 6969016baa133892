"""The commands that set up and serve: ``migrate``, ``worker``, ``dashboard``."""

from __future__ import annotations

import gc
import sys

import click

from .._errors import ConfigError
from ._group import State, cli, enabled_rows, hard_exit, log, pass_state, unknown_handlers


@cli.command()
@click.option(
    "--revision",
    default="head",
    show_default=True,
    help="Target revision; an older one (or 'base') downgrades, dropping what later"
    " revisions added. Back up first.",
)
@click.option(
    "--reshard",
    is_flag=True,
    help="Move the tasks, with their jobs, runs, decisions and audit entries, from the shards"
    " the database has to the [database] shards the file asks (PostgreSQL; every worker"
    " stopped, no job running); emptied shards are dropped.",
)
@pass_state
def migrate(state: State, revision: str, reshard: bool) -> None:
    """Create or upgrade the database schema (or move it to --revision, or --reshard)."""
    from .._store import migrate as _migrate

    app = state.open(check_schema=False)
    if reshard:
        if revision != "head":
            raise click.UsageError("--reshard moves rows at the head revision: drop --revision")
        click.echo(app.reshard().summary())
        return
    app.migrate(revision)
    current = _migrate.current_revision(app.shards[0].store)
    suffix = " (head)" if current == _migrate.head_revision() else ""
    where = f" in {len(app.shards)} shards" if app.sharded else ""
    click.echo(f"schema at revision {current or 'base'}{suffix}{where}")


@cli.command()
@click.option(
    "--once",
    is_flag=True,
    help="One round: take over, tick, run every ready job, then exit; the tick stays on"
    " record for `status` (HOST:tick, as `scheduler tick` records it).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=0),
    metavar="N",
    help="Jobs run at once (0: tick only) [default: [worker] concurrency].",
)
@click.option(
    "--queues",
    metavar="Q[,Q...]",
    help="Claim jobs of these queues only, comma-separated [default: [worker] queues].",
)
@click.option(
    "--allow-unknown-handlers",
    is_flag=True,
    help="Start even if an enabled task names a handler that no module in [worker] imports"
    " registered (its jobs then abort with no_handler); logged as a warning.",
)
@click.option(
    "--shards",
    metavar="RANGE",
    help="Serve these shards only, e.g. 0-3 or 0,2 ([database] shards above 1)"
    " [default: every shard].",
)
@pass_state
def worker(
    state: State,
    once: bool,
    concurrency: int | None,
    queues: str | None,
    allow_unknown_handlers: bool,
    shards: str | None,
) -> None:
    """Run the worker: tick, claim and run jobs.

    Imports the [worker] imports modules, then ticks every tick_interval and runs ready jobs
    on N threads, renewing their leases, until SIGTERM or SIGINT. Then it claims nothing new,
    lets the running jobs finish within shutdown_grace_seconds (a second signal: no wait),
    leaves any still running to lease expiry and takeover, and exits 0.
    """
    from .._config import worker_options
    from .._store.shards import parse_range
    from .._worker.shards import ShardedWorker
    from .._worker.worker import Worker

    app = state.open()
    served = None
    if shards is not None:
        served = parse_range(shards, len(app.shards), "worker --shards")
    # The options win over the file's [worker] values (checked alike).
    app.worker_settings = worker_options(
        app.worker_settings, queues=queues, concurrency=concurrency
    )
    state.import_handlers()
    problems = unknown_handlers(app, enabled_rows(app))
    if problems and not allow_unknown_handlers:
        for problem in problems:
            click.echo(f"error: {problem}", err=True)
        click.echo(
            "error: the worker does not start with unknown handlers: fix the tasks or"
            " [worker] imports, or pass --allow-unknown-handlers",
            err=True,
        )
        sys.exit(1)
    for problem in problems:
        log.warning("%s", problem)
    runs: Worker | ShardedWorker = ShardedWorker(app, shards=served) if app.sharded else Worker(app)
    result = runs.run(once=once, install_signals=True)
    if result.left_running:
        # Their threads would keep the interpreter alive; their leases expire instead.
        hard_exit(0)


@cli.command()
@click.option(
    "--host", metavar="ADDRESS", help="Address to bind [default: [dashboard] host, 127.0.0.1]."
)
@click.option(
    "--port", type=click.IntRange(1, 65535), help="Port [default: [dashboard] port, 8787]."
)
@click.option(
    "--hash-password",
    is_flag=True,
    help="Read a password (prompted, or from stdin) and print its hash for"
    " [dashboard] password_hash; serves nothing.",
)
@pass_state
def dashboard(state: State, host: str | None, port: int | None, hash_password: bool) -> None:
    """Serve the web dashboard (needs: pip install 'rerun-scheduler[dashboard]').

    Read-only unless [dashboard] actions = true and a user signs in with [dashboard] username
    and password_hash (or $SCHEDULER_DASHBOARD_PASSWORD_HASH). Refuses an address other than
    loopback when no credentials are configured.
    """
    from ..dashboard import _auth

    if hash_password:
        if sys.stdin.isatty():
            password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
        else:
            password = sys.stdin.readline().rstrip("\r\n")
        click.echo(_auth.hash_password(password))
        return
    try:
        import uvicorn

        from ..dashboard import _web
    except ImportError as exc:
        raise ConfigError(
            f"the dashboard needs its extra: pip install 'rerun-scheduler[dashboard]' ({exc})"
        ) from exc
    app = state.open()
    settings = app.dashboard_settings
    bind = host or settings.host
    _auth.check_bind(bind, settings, f"{app.config_path}: [dashboard]")
    asgi = _web.create_app(app, settings)
    click.echo(f"dashboard on http://{bind}:{port or settings.port}/ (Ctrl-C stops it)", err=True)
    # What start-up made (modules, templates, the schema) lives as long as the server: out of
    # the collector's way, so that a full collection, which otherwise walks all of it (about
    # 45 ms here), does not land inside a page's request.
    gc.freeze()
    uvicorn.run(asgi, host=bind, port=port or settings.port, log_level="warning")
