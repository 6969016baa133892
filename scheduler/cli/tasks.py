"""The commands about tasks: ``sync``, ``tick``, ``status``, ``explain``, ``enable``,
``disable``, ``trigger``."""

from __future__ import annotations

import json

import click

from . import output
from ._group import (
    State,
    audited,
    cli,
    describe,
    enabled_rows,
    pass_state,
    unknown_handlers,
    users_of,
)
from .output import POLICY_OUTCOMES


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
        enabled = [(t.name, t.handler) for t in app.tasks if t.enabled]
        problems = unknown_handlers(app, users_of(enabled))
    plan = app.sync(dry_run=dry_run, reason=reason, actor=actor)
    if dry_run:
        click.echo("dry run: nothing written")
    output.lines(plan.as_dict())
    zones = {task.name: task.timezone or app.settings.timezone for task in app.tasks}
    for change in plan.changes if dry_run else ():  # each change's fires, before and after
        output.fires_side_by_side(
            change.name,
            zones.get(change.name, "UTC"),
            change.changed,
            change.fires_before,
            change.fires_after,
            change.action,
        )
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
    for problem in unknown_handlers(app, enabled_rows(app)):
        click.echo(f"warning: {problem}", err=True)
    report = app.tick().as_dict()  # kept on record for `status`
    if as_json:
        click.echo(json.dumps(report))
        return
    # The run policies' outcomes only when they happened (most tasks have none).
    output.lines({k: v for k, v in report.items() if v or k not in POLICY_OUTCOMES})


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def status(state: State, as_json: bool) -> None:
    """Show tasks, job counts and health warnings.

    Past 200 tasks: their counts, and at most 50 that need attention (failing, disabled,
    overdue, held back); --json lists every task (streamed). Also lists the ready jobs whose
    handler no live worker runs, by handler (in --json: health.unserved, [{"handler": ...,
    "ready": N}]). With [database] shards above 1, reads every shard and merges them (in
    --json also health.shards: each shard's job counts and last tick).
    """
    app = state.open()
    if as_json:
        output.stream_status(app.status(rows=False), app.status_rows())
        return
    summary = app.status_summary()
    if summary is not None:
        output.print_summary(summary)
        return
    output.print_status(app.status())


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
    output.print_explain(data)


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
