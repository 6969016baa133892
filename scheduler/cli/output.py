"""What the commands print: aligned tables, ``action: names`` lines, the text of ``status`` and
``explain``, instants in UTC."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import click

from .._model.time import in_zone, iso

if TYPE_CHECKING:
    from .._model.job import Job


def lines(names: dict[str, list[str]]) -> None:
    """``action: name, name`` per line, aligned; ``-`` for none."""
    width = max(len(key) for key in names) + 1
    for key, found in names.items():
        click.echo(f"{key.replace('_', ' ') + ':':<{width}} {', '.join(found) or '-'}")


def print_explain(data: dict[str, Any]) -> None:
    p = data["policies"]
    window = f"{p['catchup_window']} s" if p["catchup_window"] else "unlimited"
    jitter = f"{p['jitter']} s" if p["jitter"] else "off"
    limit = p["max_consecutive_failures"] or "unlimited"
    click.echo(f"task {data['name']}: {data['state']}")
    if data.get("source") == "api":
        owner = "created at runtime (put_task)"
        extra = "".join(
            f", {key} {data[key]}" for key in ("group", "tenant") if data.get(key) is not None
        )
        click.echo(f"owner: {owner}{extra}")
    timeout = p.get("timeout")
    shown = "" if timeout is None else f", timeout {f'{timeout:g} s' if timeout else 'none'}"
    click.echo(
        f"policies: overlap {p['overlap']}, catchup_window {window}, jitter {jitter},"
        f" max_consecutive_failures {limit}{shown}; cron {p['cron']!r} in {p['timezone']}"
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


def table_row(row: dict[str, Any]) -> list[str]:
    when = ["-", "-"]
    if row["enabled"] and row["next_run_at"]:
        utc = datetime.fromisoformat(row["next_run_at"])
        local = in_zone(utc, ZoneInfo(row["timezone"]))
        when = [f"{local:%Y-%m-%d %H:%M:%S} {row['timezone']}", f"{utc:%Y-%m-%d %H:%M:%S}Z"]
    failures, why = str(row["consecutive_failures"]), row["disabled_reason"] or ""
    if row.get("disabled_note"):
        why = f"{why}: {row['disabled_note']}"
    if row.get("probe_at"):
        probe = datetime.fromisoformat(row["probe_at"])
        why = f"disabled, probing: next probe at {probe:%Y-%m-%d %H:%M:%S}Z ({why})"
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


def print_status(data: dict[str, Any]) -> None:
    table = [TABLE_HEADER.split("|")] + [table_row(r) for r in data["rows"]]
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
    print_health(data["health"])


def stream_status(data: dict[str, Any], rows: Iterator[dict[str, Any]]) -> None:
    """``json.dumps(data, indent=2)`` with ``rows`` as its ``rows`` list, the same text,
    written a row at a time (the rows are never all in memory)."""
    rest = json.dumps({k: v for k, v in data.items() if k != "rows"}, indent=2)
    first = next(rows, None)
    if first is None:
        click.echo('{\n  "rows": [],\n' + rest[2:])
        return
    click.echo('{\n  "rows": [')
    item = first
    for following in rows:
        click.echo(textwrap.indent(json.dumps(item, indent=2), "    ") + ",")
        item = following
    click.echo(textwrap.indent(json.dumps(item, indent=2), "    "))
    click.echo("  ],\n" + rest[2:])


def print_summary(data: dict[str, Any]) -> None:
    """``status`` past 200 tasks: counts, and the tasks that need attention."""
    counted = data["rows_counted"]
    total, enabled = data["rows_total"], data["rows_enabled"]
    click.echo(
        f"tasks: {total:,} ({enabled:,} enabled, {total - enabled:,} disabled); "
        + ", ".join(f"{kind.replace('_', ' ')} {n:,}" for kind, n in counted.items())
    )
    attention = data["attention"]
    if attention:
        shown = f"the first {len(attention)}" if data["attention_more"] else "all"
        click.echo(f"\nneed attention ({shown}; `scheduler explain NAME` says why):")
        table("NAME|WHY", [[a["name"], a["kind"].replace("_", " ")] for a in attention])
    click.echo("\njobs: " + ", ".join(f"{state} {n}" for state, n in data["jobs"].items()))
    print_health(data["health"])


def print_health(h: dict[str, Any]) -> None:
    """The health line of ``status`` (a table's or a summary's), then its warnings."""
    click.echo(
        f"health: waiting {h['waiting']}, stopped {h['stopped']}, overdue {h['overdue']},"
        f" stalled {'yes' if h['stalled'] else 'no'}; last tick {h['last_tick_at'] or '-'},"
        f" {len(h['workers'])} worker(s)"
    )
    if h.get("unserved"):
        ready = ", ".join(f"{u['handler']} ({u['ready']} ready)" for u in h["unserved"])
        click.echo(f"no live worker runs: {ready}")
    for paused in h.get("paused_queues", []):
        click.echo(paused_line(paused))
    for warning in h["warnings"]:
        click.echo(f"warning: {warning}")


def paused_line(paused: dict[str, Any]) -> str:
    """``queue Q paused since T by A: REASON`` (``status``, ``jobs``)."""
    line = f"queue {paused['queue']} paused since {paused['paused_at']} by {paused['paused_by']}"
    line += f": {paused['reason']}" if paused["reason"] else ""
    return line + " (its jobs wait; `scheduler resume` lets workers claim them)"


def utc(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def table(header: str, lines: list[list[str]]) -> None:
    """Columns aligned, the header first (``|`` separates its cells)."""
    table = [header.split("|"), *lines]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def job_dict(job: Job) -> dict[str, Any]:
    data = dataclasses.asdict(job)
    for key, value in data.items():
        if isinstance(value, datetime):
            data[key] = iso(value)
    return data


def fires_side_by_side(
    name: str,
    zone: str,
    changed: tuple[str, ...],
    before: tuple[datetime, ...],
    after: tuple[datetime, ...],
    action: str = "updated",
) -> None:
    """A change's next fires before and after it, side by side: each in the task's zone and in
    UTC, a fire where the zone's offset differs from the previous one's marked ``DST``."""
    what = ", ".join(changed) if changed else action
    click.echo(f"\n{name} ({what}), next fires in {zone} | UTC:")
    left = _fire_lines(before, zone) or ["(none: new or disabled)"]
    right = _fire_lines(after, zone) or ["(none: disabled)"]
    width = max(len(line) for line in [*left, "before"])
    click.echo(f"  {'before':<{width}}  after")
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else ""
        b = right[i] if i < len(right) else ""
        mark = "" if a == b else "  *"
        click.echo(f"  {a:<{width}}  {b}{mark}".rstrip())


def _fire_lines(fires: tuple[datetime, ...], zone: str) -> list[str]:
    found = []
    tz = ZoneInfo(zone)
    previous = None
    for at in fires:
        local = in_zone(at, tz)
        shift = " DST" if previous is not None and local.utcoffset() != previous else ""
        previous = local.utcoffset()
        found.append(f"{local:%a %Y-%m-%d %H:%M:%S %Z} | {at:%H:%M:%S}Z{shift}")
    return found
