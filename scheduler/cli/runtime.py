"""``scheduler tasks``: the tasks an application creates at runtime (``source`` ``api``),
listed, put and removed from the command line, as ``put_task`` and ``remove_task`` do it."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

import click

from .._model.time import iso
from . import output
from ._group import State, audited, cli, pass_state

TASKS_HEADER = "NAME|SOURCE|GROUP|TENANT|CRON|ZONE|ENABLED|NEXT RUN (UTC)"


@cli.group(name="tasks")
def tasks_group() -> None:
    """The tasks an application creates at runtime: list, put, remove.

    The file's tasks (source file) are listed too; only `sync` changes them.
    """


def row_dict(row: Any) -> dict[str, Any]:
    """A row's fields by name, instants in ISO-8601 UTC (``tasks list --json``)."""
    data = dataclasses.asdict(row)
    for key, value in data.items():
        if isinstance(value, datetime):
            data[key] = iso(value)
    return data


@tasks_group.command(name="list")
@click.option("--source", type=click.Choice(["file", "api"]), help="Only the file's, or the app's.")
@click.option("--group", metavar="G", help="Only the tasks of this group.")
@click.option("--tenant", metavar="T", help="Only the tasks of this tenant.")
@click.option("--prefix", metavar="P", help="Only the tasks whose name starts with P.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    metavar="N",
    help="At most N tasks.",
)
@click.option("--after", metavar="NAME", help="The tasks after this name (the next page).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of rows.")
@pass_state
def list_command(
    state: State,
    source: str | None,
    group: str | None,
    tenant: str | None,
    prefix: str | None,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    """List tasks by name, filtered; --after pages on."""
    found = state.open().rows(
        source=source, group=group, tenant=tenant, prefix=prefix, limit=limit, after=after
    )
    if as_json:
        click.echo(json.dumps([row_dict(row) for row in found], indent=2))
        return
    if not found:
        click.echo("no tasks")
        return
    lines = [
        [
            row.name,
            row.source,
            row.group or "-",
            row.tenant or "-",
            row.cron,
            row.timezone,
            "yes" if row.enabled else "no",
            output.utc(row.next_run_at if row.enabled else None),
        ]
        for row in found
    ]
    output.table(TASKS_HEADER, lines)
    if len(found) == limit:
        click.echo(f"(more after {found[-1].name!r}: --after {found[-1].name!r})")


def _payload(text: str, name: str) -> dict[str, Any]:
    from .._errors import ConfigError

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"task {name!r}: key 'payload': not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"task {name!r}: key 'payload': expected a JSON object")
    return value


@tasks_group.command(name="put")
@click.argument("name", metavar="NAME")
@click.option("--cron", metavar="C", help="Its cron expression (required for a new task).")
@click.option("--handler", metavar="H", help="Its handler (required for a new task).")
@click.option("--timezone", metavar="Z", help="Its IANA zone [default: [scheduler] timezone].")
@click.option("--payload", metavar="JSON", help="Its payload, a JSON object.")
@click.option("--tenant", metavar="T", help="Whose task it is.")
@click.option("--group", metavar="G", help="Its group.")
@click.option(
    "--overlap", type=click.Choice(["hold", "skip", "allow", "replace"]), help="Its overlap policy."
)
@click.option("--enabled/--disabled", default=None, help="Enable or disable it.")
@click.option("--dry-run", is_flag=True, help="Show the change and its fires; write nothing.")
@audited
@pass_state
def put_command(
    state: State,
    name: str,
    cron: str | None,
    handler: str | None,
    timezone: str | None,
    payload: str | None,
    tenant: str | None,
    group: str | None,
    overlap: str | None,
    enabled: bool | None,
    dry_run: bool,
    reason: str | None,
    actor: str | None,
) -> None:
    """Create task NAME, or change it: on an existing task only the options given change.

    Prints what changed and its next 5 fires before and after, side by side, in its zone and
    in UTC. A task of the file cannot be put (its file is its owner).
    """
    from .._errors import ConfigError
    from .._model.rows import TaskSpec, unformed

    app = state.open()
    current = app.get_row(name)
    given: dict[str, Any] = {
        key: value
        for key, value in (
            ("cron", cron),
            ("handler", handler),
            ("timezone", timezone),
            ("tenant", tenant),
            ("group", group),
            ("overlap", overlap),
            ("enabled", enabled),
        )
        if value is not None
    }
    if payload is not None:
        given["payload"] = _payload(payload, name)
    if current is None:
        missing = [f"--{key}" for key in ("cron", "handler") if key not in given]
        if missing:
            raise ConfigError(f"task {name!r}: a new task needs {' and '.join(missing)}")
        spec = TaskSpec(name=name, **given)
    else:
        kept = {
            "cron": current.cron,
            "handler": current.handler,
            "timezone": current.timezone,
            "payload": current.payload,
            "tenant": current.tenant,
            "group": current.group,
            "overlap": current.overlap,
            "enabled": current.enabled,
            "concurrent": current.concurrent,
            "max_consecutive_failures": current.max_consecutive_failures,
            "catchup_window": current.catchup_window,
            "jitter": current.jitter,
            **unformed(current),
        }
        if "overlap" in given and given["overlap"] != "allow":
            kept["concurrent"] = False  # the new policy, not the alias of the old one
        spec = TaskSpec(name=name, **(kept | given))
    change = app.put_task(spec, dry_run=dry_run, reason=reason, actor=actor)
    prefix = "dry run: nothing written; would be " if dry_run else ""
    what = f": {', '.join(change.changed)}" if change.changed else ""
    click.echo(f"{prefix}{change.action} {name}{what}")
    zone = spec.timezone or app.settings.timezone
    output.fires_side_by_side(
        name, zone, change.changed, change.fires_before, change.fires_after, change.action
    )


@tasks_group.command(name="remove")
@click.argument("name", metavar="NAME")
@audited
@pass_state
def remove_command(state: State, name: str, reason: str | None, actor: str | None) -> None:
    """Remove task NAME, created at runtime: it fires no more, its queued jobs are cancelled;
    its history stays until its retention."""
    from .._errors import UnknownRow

    if not state.open().remove_task(name, reason=reason, actor=actor):
        raise UnknownRow(f"no task created at runtime named {name!r} (see `scheduler tasks list`)")
    click.echo(f"removed {name}: no slot of it runs from now; its queued jobs are cancelled")
