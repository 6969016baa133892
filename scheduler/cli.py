"""The ``scheduler`` command: migrate, sync, tick, worker, status, enable, disable, trigger.

Users read "task" everywhere (help, messages, logs); "row" is the table's word, kept for the
names that are contract: the ``row_disabled`` signal and the ``rows`` key of ``status --json``.

The configuration file comes from ``--config``, else ``SCHEDULER_CONFIG``, else ``app.toml`` in
the current directory. Every error is one line on stderr (``error: ...``) and exit status 1
(2 for a usage error); ``--debug`` adds the traceback. Logging is configured here and only here.
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import gc
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn
from zoneinfo import ZoneInfo

import click

from ._errors import ConfigError, SchedulerError
from ._model.rules import AUDIT_LIMIT, BACKFILL_MAX, JOB_STATES, LIST_LIMIT
from ._model.time import in_zone, iso

if TYPE_CHECKING:
    from ._app import Scheduler
    from ._model.job import Job

# Each command imports what it needs when it runs: `scheduler --help` imports no SQLAlchemy,
# Alembic or croniter (tests/test_cli.py counts), and `status` no Alembic.

CONFIG_ENV = "SCHEDULER_CONFIG"
DEFAULT_CONFIG = "app.toml"
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
log = logging.getLogger("scheduler.cli")  # also when run as `python -m scheduler.cli`
# Set when a command imports the user's modules ([worker] imports): their objects may want
# the interpreter's teardown (see console()).
_user_code_imported = False


def describe(exc: BaseException) -> str:
    """One line saying what went wrong."""
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")  # not imported: not its error
    if sqlalchemy_exc is not None and isinstance(exc, sqlalchemy_exc.SQLAlchemyError):
        orig = getattr(exc, "orig", None)
        lines = [ln.strip() for ln in str(orig if orig is not None else exc).splitlines()]
        return f"database error: {next((ln for ln in lines if ln), type(exc).__name__)}"
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
            from ._app import Scheduler

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
        return self.app

    def import_handlers(self) -> None:
        """Import the [worker] imports, from the config file's folder or the current one."""
        from ._worker.worker import import_handlers

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
@click.version_option(None, "--version", package_name="scheduler", prog_name="scheduler")
@click.pass_context
def cli(ctx: click.Context, config: str | None, debug: bool, log_level: str) -> None:
    """Recurring tasks with rerun-in-place, on a durable SQL job queue."""
    _setup_logging("DEBUG" if debug else log_level.upper())
    given = ctx.get_parameter_source("config") == click.core.ParameterSource.COMMANDLINE
    factory = ctx.obj if callable(ctx.obj) else None  # main(app_factory=...)
    state = State(config, config_given=given, factory=factory)
    ctx.obj = state
    ctx.call_on_close(state.close)


@cli.command()
@click.option(
    "--revision",
    default="head",
    show_default=True,
    help="Target revision; an older one (or 'base') downgrades, dropping what later"
    " revisions added. Back up first.",
)
@pass_state
def migrate(state: State, revision: str) -> None:
    """Create or upgrade the database schema (or move it to --revision)."""
    from ._store import migrate as _migrate

    app = state.open(check_schema=False)
    app.migrate(revision)
    current = _migrate.current_revision(app.store)
    suffix = " (head)" if current == _migrate.head_revision() else ""
    click.echo(f"schema at revision {current or 'base'}{suffix}")


def unknown_handlers(app: Scheduler, tasks: Iterable[tuple[str, str]]) -> list[str]:
    """One line per handler that no imported module registered, naming the tasks that use it
    (the first three, and how many more: a task per customer must not print 100,000 lines)."""
    imports = app.worker_settings.imports
    where = f"[worker] imports ({', '.join(imports)})" if imports else "[worker] imports (none)"
    known = app.registry.names()
    users: dict[str, list[str]] = {}
    for name, handler in tasks:
        if handler not in app.registry:
            users.setdefault(handler, []).append(name)
    found = []
    for handler, names in users.items():
        close = difflib.get_close_matches(handler, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        if len(names) == 1:
            who = f"task {names[0]!r}: handler {handler!r}"
        else:
            shown = ", ".join(repr(n) for n in names[:3])
            more = f" and {len(names) - 3:,} more" if len(names) > 3 else ""
            who = f"tasks {shown}{more} ({len(names):,}): handler {handler!r}"
        found.append(f"{who} is not registered by {where}{hint}")
    return found


def _enabled_rows(app: Scheduler) -> list[tuple[str, str]]:
    return [(row.name, row.handler) for row in app.rows() if row.enabled]


def _lines(names: dict[str, list[str]]) -> None:
    """``action: name, name`` per line, aligned; ``-`` for none."""
    width = max(len(key) for key in names) + 1
    for key, found in names.items():
        click.echo(f"{key.replace('_', ' ') + ':':<{width}} {', '.join(found) or '-'}")


@cli.command()
@click.option("--dry-run", is_flag=True, help="Show what would change; write nothing.")
@audited
@pass_state
def sync(state: State, dry_run: bool, reason: str | None, actor: str | None) -> None:
    """Store the [[tasks]] of the file in the database.

    Inserts new tasks, updates changed ones, disables tasks no longer in the file; all or
    nothing. Prints the plan. Warns about tasks whose handler [worker] imports does not
    register.
    """
    app = state.open()
    try:
        state.import_handlers()  # to check the handlers the tasks name
    except ImportError as exc:
        problems = [f"handlers not checked: {describe(exc)}"]
    else:
        problems = unknown_handlers(app, [(t.name, t.handler) for t in app.tasks if t.enabled])
    plan = app.sync(dry_run=dry_run, reason=reason, actor=actor)
    if dry_run:
        click.echo("dry run: nothing written")
    _lines(plan.as_dict())
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def tick(state: State, as_json: bool) -> None:
    """Run one scheduler tick.

    Each due task is dispatched, rerun in place, held back or disabled; prints the task names
    per outcome. Handler modules in [worker] imports are imported first, so the jobs the tick
    creates get their handlers' defaults. The tick is recorded as a worker's is (one entry
    per host, HOST:tick), so `status` sees ticks run from cron or a systemd timer.
    """
    app = state.open()
    state.import_handlers()  # the jobs it creates take their handlers' defaults
    for problem in unknown_handlers(app, _enabled_rows(app)):
        click.echo(f"warning: {problem}", err=True)
    report = app.tick().as_dict()  # kept on record for `status`
    if as_json:
        click.echo(json.dumps(report))
        return
    # The run policies' outcomes only when they happened (most tasks have none).
    _lines({k: v for k, v in report.items() if v or k not in POLICY_OUTCOMES})


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
    "--allow-unknown-handlers",
    is_flag=True,
    help="Start even if an enabled task names a handler that no module in [worker] imports"
    " registered (its jobs then abort with no_handler); logged as a warning.",
)
@pass_state
def worker(state: State, once: bool, concurrency: int | None, allow_unknown_handlers: bool) -> None:
    """Run the worker: tick, claim and run jobs.

    Imports the [worker] imports modules, then ticks every tick_interval and runs ready jobs
    on N threads, renewing their leases, until SIGTERM or SIGINT. Then it claims nothing new,
    lets the running jobs finish within shutdown_grace_seconds (a second signal: no wait),
    leaves any still running to lease expiry and takeover, and exits 0.
    """
    from ._worker.worker import Worker

    app = state.open()
    state.import_handlers()
    problems = unknown_handlers(app, _enabled_rows(app))
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
    result = Worker(app, concurrency=concurrency).run(once=once, install_signals=True)
    if result.left_running:
        # Their threads would keep the interpreter alive; their leases expire instead.
        _hard_exit(0)


def _hard_exit(code: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def status(state: State, as_json: bool) -> None:
    """Show tasks, job counts and health warnings."""
    data = state.open().status()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    _print_status(data)


@cli.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def explain(state: State, name: str, as_json: bool) -> None:
    """Why task NAME ran, or did not, and what comes next.

    Prints its state in one sentence, its run policies, its next 10 fire times in its zone and
    in UTC (DST shifts marked), its last 20 decisions and its last 10 runs.
    """
    data = state.open().explain(name)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    _print_explain(data)


def _print_explain(data: dict[str, Any]) -> None:
    p = data["policies"]
    window = f"{p['catchup_window']} s" if p["catchup_window"] else "unlimited"
    jitter = f"{p['jitter']} s" if p["jitter"] else "off"
    limit = p["max_consecutive_failures"] or "unlimited"
    click.echo(f"task {data['name']}: {data['state']}")
    click.echo(
        f"policies: overlap {p['overlap']}, catchup_window {window}, jitter {jitter},"
        f" max_consecutive_failures {limit}; cron {p['cron']!r} in {p['timezone']}"
    )
    utc_only = p["timezone"] == "UTC"  # one column: the same instants
    click.echo(f"\nnext fires ({'UTC' if utc_only else p['timezone'] + ' | UTC'}):")
    if not data["enabled"]:
        click.echo(f"  none: the task is disabled (`scheduler enable {data['name']}` re-arms it)")
    for fire in data["next_fires"]:
        marks = []
        if fire["dst"]:
            marks.append(f"DST {fire['dst']}")
        if fire["dst_case"] == "dst_gap":
            marks.append("dst_gap: moved out of the spring-forward gap")
        if fire["skipped_repeats"]:
            marks.append("dst_repeat: the repeated hour is not fired again")
        if fire["at"] != fire["slot"]:
            marks.append(f"slot {fire['slot']} + jitter")
        local = in_zone(datetime.fromisoformat(fire["at"]), ZoneInfo(p["timezone"]))
        line = f"  {local:%Y-%m-%d %H:%M:%S %Z}" + ("" if utc_only else f"  {fire['at']}")
        click.echo(f"{line}  {'; '.join(marks)}".rstrip())
    click.echo("\ndecisions (newest first):")
    for d in data["decisions"]:
        job = f" job {d['job_id']}" if d["job_id"] is not None else ""
        why = f" ({d['reason']})" if d["reason"] else ""
        detail = f": {d['detail']}" if d["detail"] else ""
        click.echo(f"  {d['decided_at']}  {d['decision']:<15} slot {d['slot']}{job}{why}{detail}")
    if not data["decisions"]:
        click.echo("  none yet")
    click.echo("\nruns (newest first):")
    for r in data["runs"]:
        code = f" {r['error_code']}" if r["error_code"] else ""
        click.echo(
            f"  {r['finished_at']}  job {r['job_id']} run {r['run']} attempt {r['attempt']}"
            f"  {r['outcome']}{code}  {r['worker'] or ''}".rstrip()
        )
    if not data["runs"]:
        click.echo("  none yet")


POLICY_OUTCOMES = ("skipped_overlap", "missed")

TABLE_HEADER = "NAME|ENABLED|NEXT RUN (LOCAL)|NEXT RUN (UTC)|LAST JOB|FAILURES|WHY DISABLED"


def _table_row(row: dict[str, Any]) -> list[str]:
    when = ["-", "-"]
    if row["enabled"] and row["next_run_at"]:
        utc = datetime.fromisoformat(row["next_run_at"])
        local = in_zone(utc, ZoneInfo(row["timezone"]))
        when = [f"{local:%Y-%m-%d %H:%M:%S} {row['timezone']}", f"{utc:%Y-%m-%d %H:%M:%S}Z"]
    failures, why = str(row["consecutive_failures"]), row["disabled_reason"] or ""
    if row.get("disabled_note"):
        why = f"{why}: {row['disabled_note']}"
    state = row["last_job_state"] or "-"
    if row["last_job_state"] and row["last_job_id"] is None:  # its jobs are backfilled ones
        state = f"{state} (backfill)"
    return [row["name"], "yes" if row["enabled"] else "no", *when, state, failures, why]


def policy_text(row: dict[str, Any]) -> str:
    """A row's run policies in a few words: ``hold``, ``skip, window 300 s, jitter 60 s``."""
    words = [str(row.get("overlap", "hold"))]
    if row.get("catchup_window"):
        words.append(f"window {row['catchup_window']} s")
    if row.get("jitter"):
        words.append(f"jitter {row['jitter']} s")
    return ", ".join(words)


def _print_status(data: dict[str, Any]) -> None:
    table = [TABLE_HEADER.split("|")] + [_table_row(r) for r in data["rows"]]
    if any(policy_text(r) != "hold" for r in data["rows"]):  # the default needs no column
        table = [
            [*line[:-1], policy, line[-1]]
            for line, policy in zip(
                table, ["POLICY"] + [policy_text(r) for r in data["rows"]], strict=True
            )
        ]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table if data["rows"] else []:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    if not data["rows"]:
        click.echo("no tasks (run `scheduler sync`)")
    click.echo("\njobs: " + ", ".join(f"{state} {n}" for state, n in data["jobs"].items()))
    h = data["health"]
    click.echo(
        f"health: waiting {h['waiting']}, stopped {h['stopped']}, overdue {h['overdue']},"
        f" stalled {'yes' if h['stalled'] else 'no'}; last tick {h['last_tick_at'] or '-'},"
        f" {len(h['workers'])} worker(s)"
    )
    for warning in h["warnings"]:
        click.echo(f"warning: {warning}")


def _row_command(name: str, action: str, done: str, doc: str) -> None:
    """Command ``name`` calls the Scheduler's method ``action`` with the task's name."""

    @cli.command(name=name, help=doc)
    @click.argument("row", metavar="NAME")
    @audited
    @pass_state
    def command(state: State, row: str, reason: str | None, actor: str | None) -> None:
        app = state.open()
        changed = getattr(app, action)(row, reason=reason, actor=actor)
        click.echo((ALREADY if changed is False else done).format(row=repr(row)))
        if action == "enable" and changed is not False:
            after = app.get_row(row)
            if after is not None and after.last_job_state == "aborted":
                # `status` warns of it next: say it here, so "failures reset" is not a surprise.
                click.echo(ENABLED_ABORTED.format(job=after.last_job_id))


ENABLED = "enabled {row}: failures reset, next run computed from now"
ALREADY = "{row} was already enabled: nothing changed"
ENABLED_ABORTED = (
    "its last job ({job}) is aborted: its next slot reruns it in place and counts that as"
    " failure 1 (`status` warns of it meanwhile)"
)
TRIGGERED = "triggered {row}: due now; the next tick dispatches it (same gates)"
_row_command("enable", "enable", ENABLED, "Re-enable task NAME, reset its failures.")
_row_command(
    "disable",
    "disable",
    "disabled {row}",
    "Pause task NAME (until enable); --reason is shown by `status`.",
)
_row_command("trigger", "trigger", TRIGGERED, "Make task NAME due now (same gates).")


# -- operators: jobs, job, retry, cancel, backfill, audit (docs/howto/operate.md) -----------
def _iso(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(header: str, lines: list[list[str]]) -> None:
    """Columns aligned, the header first (``|`` separates its cells)."""
    table = [header.split("|"), *lines]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def _job_dict(job: Job) -> dict[str, Any]:
    data = dataclasses.asdict(job)
    for key, value in data.items():
        if isinstance(value, datetime):
            data[key] = iso(value)
    return data


def _parse_instant(value: str, option: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO-8601 date or time (2026-11-01, 2026-11-01T03:00,"
            " 2026-11-01T02:00:00Z); without an offset it is the task's local time",
            param_hint=option,
        ) from None


JOBS_HEADER = "ID|TASK|HANDLER|QUEUE|STATE|ATTEMPTS|RUN AT / FINISHED (UTC)|ERROR"


@cli.command()
@click.option(
    "--state",
    "job_state",
    type=click.Choice(JOB_STATES),
    help="Only jobs in this state.",
)
@click.option("--task", metavar="NAME", help="Only the jobs of this task.")
@click.option("--handler", metavar="H", help="Only jobs of this handler.")
@click.option("--queue", metavar="Q", help="Only jobs of this queue.")
@click.option("--tenant", metavar="T", help="Only jobs of this tenant.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=LIST_LIMIT,
    show_default=True,
    metavar="N",
    help="At most N jobs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def jobs(
    state: State,
    job_state: str | None,
    task: str | None,
    handler: str | None,
    queue: str | None,
    tenant: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first (--task reads the task's index: fast at any size)."""
    found = state.open().jobs(
        state=job_state, task=task, handler=handler, queue=queue, tenant=tenant, limit=limit
    )
    if as_json:
        click.echo(json.dumps({"jobs": [_job_dict(j) for j in found]}, indent=2))
        return
    if not found:
        click.echo("no jobs")
        return
    lines = [
        [
            str(j.id),
            j.task_name or "-",
            j.handler,
            j.queue,
            j.state,
            f"{j.attempts}/{j.max_attempts}",
            _iso(j.finished_at if j.finished_at is not None else j.run_at),
            j.last_error_code or "-",
        ]
        for j in found
    ]
    _table(JOBS_HEADER, lines)


RUNS_HEADER = "RUN|ATTEMPT|STARTED (UTC)|FINISHED (UTC)|OUTCOME|ERROR|WORKER"


@cli.command()
@click.argument("job_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def job(state: State, job_id: int, as_json: bool) -> None:
    """Show job ID and its attempts (the run history)."""
    from ._errors import JobStateError

    app = state.open()
    found = app.get_job(job_id)
    if found is None:
        raise JobStateError(f"no job {job_id}")
    runs = app.history(job_id)
    if as_json:
        data = _job_dict(found)
        data["runs"] = [
            {k: iso(v) if isinstance(v, datetime) else v for k, v in r.items()} for r in runs
        ]
        click.echo(json.dumps(data, indent=2))
        return
    fields = [
        ("job", str(found.id)),
        ("task", found.task_name or "-"),
        ("tenant", found.tenant or "-"),
        ("handler", found.handler),
        ("queue", f"{found.queue} (priority {found.priority})"),
        ("state", found.state),
        ("attempts", f"{found.attempts} of {found.max_attempts}"),
        ("error", found.last_error_code or "-"),
        ("slot", _iso(found.slot)),
        ("run at", _iso(found.run_at)),
        ("created", _iso(found.created_at)),
        ("finished", _iso(found.finished_at)),
    ]
    if found.lease_owner:
        fields.append(("lease", f"{found.lease_owner} until {_iso(found.lease_expires_at)}"))
    width = max(len(key) for key, _ in fields) + 1
    for key, value in fields:
        click.echo(f"{key + ':':<{width}} {value}")
    click.echo("")
    if not runs:
        click.echo("no attempts finished yet")
        return
    _table(
        RUNS_HEADER,
        [
            [
                str(r["run"]),
                str(r["attempt"]),
                _iso(r["started_at"]),
                _iso(r["finished_at"]),
                r["outcome"],
                r["error_code"] or "-",
                r["worker"] or "-",
            ]
            for r in runs
        ],
    )


@cli.command(name="retry")
@click.argument("job_id", metavar="ID", type=int)
@audited
@pass_state
def retry_command(state: State, job_id: int, reason: str | None, actor: str | None) -> None:
    """Requeue job ID, which must be aborted: attempts reset, run again (dead-letter retry).

    A task's job must be the task's current one (or one `backfill` made): it runs again in
    place, with the task's current handler and payload; no second job is made. Handler
    modules in [worker] imports are imported first: the job takes its handler's max_attempts
    and queue, as the worker's jobs do.
    """
    app = state.open()
    state.import_handlers()  # the job takes its handler's max_attempts and queue
    found = app.retry_job(job_id, reason=reason, actor=actor)
    click.echo(f"job {found.id} queued again: attempts reset, runs at {_iso(found.run_at)}")


@cli.command(name="cancel")
@click.argument("job_id", metavar="ID", type=int)
@audited
@pass_state
def cancel_command(state: State, job_id: int, reason: str | None, actor: str | None) -> None:
    """Cancel job ID, which must be queued: it ends aborted with code `cancelled`."""
    found = state.open().cancel_job(job_id, reason=reason, actor=actor)
    click.echo(f"job {found.id} cancelled: aborted with code {found.last_error_code}")


@cli.command()
@click.argument("name", metavar="NAME")
@click.option("--from", "start", required=True, metavar="T", help="First instant (included).")
@click.option("--to", "end", required=True, metavar="T", help="Last instant (excluded).")
@click.option("--dry-run", is_flag=True, help="List the slots; write nothing.")
@click.option(
    "--max",
    "max_slots",
    type=click.IntRange(min=1),
    default=BACKFILL_MAX,
    show_default=True,
    metavar="N",
    help="Refuse a range of more than N slots.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@audited
@pass_state
def backfill(
    state: State,
    name: str,
    start: str,
    end: str,
    dry_run: bool,
    max_slots: int,
    as_json: bool,
    reason: str | None,
    actor: str | None,
) -> None:
    """Enqueue one job per slot of task NAME in [--from, --to).

    The slots are the task's cron in its timezone; T is ISO-8601, and without an offset it is
    the task's local time. A slot that already has a job of the task is skipped, so running
    it twice enqueues nothing twice. Backfilled jobs leave the task's failure count and rerun
    in place alone; a failed one stays aborted (see `scheduler retry`). Handler modules in
    [worker] imports are imported first: the jobs take their handler's max_attempts and queue.
    """
    app = state.open()
    state.import_handlers()  # the jobs take their handler's max_attempts and queue
    row = app.get_row(name)
    result = app.backfill(
        name,
        _parse_instant(start, "--from"),
        _parse_instant(end, "--to"),
        dry_run=dry_run,
        max_slots=max_slots,
        reason=reason,
        actor=actor,
    )
    if row is not None and result.enqueued:  # their jobs would abort with no_handler
        for problem in unknown_handlers(app, [(row.name, row.handler)]):
            click.echo(f"warning: {problem}", err=True)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    zone = ZoneInfo(row.timezone if row is not None else "UTC")
    taken = set(result.taken)
    for slot in result.slots:
        local = in_zone(slot, zone)
        if slot in taken:
            what = "already has a job: skipped"
        elif dry_run:
            what = "would enqueue"
        else:
            what = f"job {result.enqueued[slot]}"
        click.echo(f"{_iso(slot)}  {local:%Y-%m-%d %H:%M:%S%z}  {what}")
    verb = "would enqueue" if dry_run else "enqueued"
    done = len(result.pending) if dry_run else len(result.enqueued)
    click.echo(
        f"{'dry run: nothing written; ' if dry_run else ''}{len(result.slots)} slot(s),"
        f" {verb} {done}, {len(result.taken)} already had a job"
    )


AUDIT_HEADER = "AT (UTC)|ACTOR|ACTION|TARGET|REASON|DETAIL"


@cli.command(name="audit")
@click.argument("name", metavar="[NAME]", required=False)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=AUDIT_LIMIT,
    show_default=True,
    metavar="N",
    help="At most N entries.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def audit_command(state: State, name: str | None, limit: int, as_json: bool) -> None:
    """Who did what, when and why: newest first; of task NAME (or `job ID`) if given."""
    found = state.open().audit(name, limit=limit)
    if as_json:
        click.echo(json.dumps({"entries": [e.as_dict() for e in found]}, indent=2))
        return
    if not found:
        click.echo("nothing audited yet")
        return
    lines = [
        [_iso(e.at), e.actor, e.action, e.target or "-", e.reason or "-", e.detail or "-"]
        for e in found
    ]
    _table(AUDIT_HEADER, lines)


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
    """Serve the web dashboard (needs: pip install 'scheduler[dashboard]').

    Read-only unless [dashboard] actions = true and a user signs in with [dashboard] username
    and password_hash (or $SCHEDULER_DASHBOARD_PASSWORD_HASH). Refuses an address other than
    loopback when no credentials are configured.
    """
    from .dashboard import _auth

    if hash_password:
        if sys.stdin.isatty():
            password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
        else:
            password = sys.stdin.readline().rstrip("\r\n")
        click.echo(_auth.hash_password(password))
        return
    try:
        import uvicorn

        from .dashboard import _web
    except ImportError as exc:
        raise ConfigError(
            f"the dashboard needs its extra: pip install 'scheduler[dashboard]' ({exc})"
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


if __name__ == "__main__":
    console()
