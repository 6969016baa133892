"""The operators' commands about jobs: ``jobs``, ``job``, ``retry``, ``cancel``, ``pause``,
``resume``, ``backfill``, ``audit`` (docs/howto/operate.md)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click

from .._errors import ConfigError
from .._model.defaults import AUDIT_LIMIT, BACKFILL_MAX, JOB_STATES, LIST_LIMIT
from .._model.job import Job
from .._model.time import in_zone, iso
from ._group import State, audited, cli, pass_state, unknown_handlers, users_of
from .output import job_dict, paused_line, table, utc


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
    app = state.open()
    found = app.jobs(
        state=job_state, task=task, handler=handler, queue=queue, tenant=tenant, limit=limit
    )
    paused = {p.queue: p for p in app.paused_queues()}
    if as_json:
        shown = [p.as_dict() for p in paused.values()]
        click.echo(
            json.dumps({"jobs": [job_dict(j) for j in found], "paused_queues": shown}, indent=2)
        )
        return
    if not found:
        click.echo("no jobs")
    else:
        table(JOBS_HEADER, [_job_line(j, j.queue in paused) for j in found])
    for name in sorted(({j.queue for j in found} | {queue or ""}) & paused.keys()):
        click.echo(paused_line(paused[name].as_dict()))


def _job_line(j: Job, paused: bool) -> list[str]:
    return [
        str(j.id),
        j.task_name or "-",
        j.handler,
        f"{j.queue} (paused)" if paused else j.queue,
        j.state,
        f"{j.attempts}/{j.max_attempts}",
        utc(j.finished_at if j.finished_at is not None else j.run_at),
        j.last_error_code or "-",
    ]


RUNS_HEADER = "RUN|ATTEMPT|STARTED (UTC)|FINISHED (UTC)|OUTCOME|ERROR|WORKER"


@cli.command()
@click.argument("job_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def job(state: State, job_id: int, as_json: bool) -> None:
    """Show job ID and its attempts (the run history).

    With [worker] error_messages = "first-line", each failed attempt's message (its first
    line, secrets redacted) is listed under the attempts.
    """
    from .._errors import JobStateError

    app = state.open()
    found = app.get_job(job_id)
    if found is None:
        raise JobStateError(f"no job {job_id}")
    runs = app.history(job_id)
    if as_json:
        data = job_dict(found)
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
        ("slot", utc(found.slot)),
        ("run at", utc(found.run_at)),
        ("created", utc(found.created_at)),
        ("finished", utc(found.finished_at)),
    ]
    if found.lease_owner:
        fields.append(("lease", f"{found.lease_owner} until {utc(found.lease_expires_at)}"))
    if found.waiting_for:
        fields.append(("waiting for", found.waiting_for))
    width = max(len(key) for key, _ in fields) + 1
    for key, value in fields:
        click.echo(f"{key + ':':<{width}} {value}")
    click.echo("")
    if not runs:
        click.echo("no attempts finished yet")
        return
    table(
        RUNS_HEADER,
        [
            [
                str(r["run"]),
                str(r["attempt"]),
                utc(r["started_at"]),
                utc(r["finished_at"]),
                r["outcome"],
                r["error_code"] or "-",
                r["worker"] or "-",
            ]
            for r in runs
        ],
    )
    # [worker] error_messages = "first-line": each failed attempt's message, already redacted.
    explained = [r for r in runs if r.get("error_message")]
    if explained:
        click.echo("")
        for r in explained:
            click.echo(f"run {r['run']} attempt {r['attempt']}: {r['error_message']}")


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
    click.echo(f"job {found.id} queued again: attempts reset, runs at {utc(found.run_at)}")


CANCEL_WAIT_SECONDS = 60.0  # cancel --wait: how long a running job may take to stop


@cli.command(name="cancel")
@click.argument("job_id", metavar="ID", type=int)
@click.option(
    "--wait",
    is_flag=True,
    help=f"For a running job: return once it has stopped (at most {CANCEL_WAIT_SECONDS:g}s).",
)
@audited
@pass_state
def cancel_command(
    state: State, job_id: int, wait: bool, reason: str | None, actor: str | None
) -> None:
    """Cancel job ID: a queued job ends aborted with code `cancelled`; a running (claimed) one
    is stopped by its worker within about 2 seconds, then ends the same way."""
    app = state.open()
    found = app.cancel_job(job_id, reason=reason, actor=actor)
    if found.state == "claimed" and wait:
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        while found.state == "claimed" and time.monotonic() < deadline:
            time.sleep(0.1)
            found = app.get_job(job_id) or found
        if found.state == "claimed":
            raise click.ClickException(
                f"job {job_id} is still running {CANCEL_WAIT_SECONDS:g}s after the cancel: is its"
                f" worker {found.lease_owner} alive?"
            )
        click.echo(f"job {found.id} stopped: {found.state} with code {found.last_error_code}")
        return
    if found.state == "claimed":
        click.echo(
            f"job {found.id} is running on {found.lease_owner}: cancel requested; its worker"
            " stops it and it ends aborted with code cancelled"
        )
        return
    click.echo(f"job {found.id} cancelled: aborted with code {found.last_error_code}")


@cli.command(name="pause")
@click.argument("queue", metavar="QUEUE")
@audited
@pass_state
def pause_command(state: State, queue: str, reason: str | None, actor: str | None) -> None:
    """Pause QUEUE: every worker stops claiming its jobs within a second (running jobs
    finish); ticks still dispatch into it. Kept in the database until `resume`."""
    if state.open().pause_queue(queue, reason=reason, actor=actor):
        click.echo(f"queue {queue} paused: workers claim none of its jobs until `resume {queue}`")
    else:
        click.echo(f"queue {queue} was paused already")


@cli.command(name="resume")
@click.argument("queue", metavar="QUEUE")
@audited
@pass_state
def resume_command(state: State, queue: str, reason: str | None, actor: str | None) -> None:
    """Resume QUEUE: workers claim its jobs again within a second."""
    if state.open().resume_queue(queue, reason=reason, actor=actor):
        click.echo(f"queue {queue} resumed")
    else:
        click.echo(f"queue {queue} was not paused")


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
        for problem in unknown_handlers(app, users_of([(row.name, row.handler)])):
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
        click.echo(f"{utc(slot)}  {local:%Y-%m-%d %H:%M:%S%z}  {what}")
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
        [utc(e.at), e.actor, e.action, e.target or "-", e.reason or "-", e.detail or "-"]
        for e in found
    ]
    table(AUDIT_HEADER, lines)


def _enqueue_payload(text: str | None, handler: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"enqueue {handler!r}: --payload: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"enqueue {handler!r}: --payload: expected a JSON object")
    return value


def _enqueue_time(text: str | None, handler: str, zone: str) -> datetime | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"enqueue {handler!r}: --run-at: {text!r} is not an ISO-8601 date or time"
            " (2026-11-01T03:00, 2026-11-01T02:00:00Z)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=ZoneInfo(zone))


@cli.command(name="enqueue")
@click.argument("handler", metavar="HANDLER")
@click.option("--payload", metavar="JSON", help="The job's payload, a JSON object.")
@click.option(
    "--run-at",
    metavar="T",
    help="Not before T (ISO-8601; without an offset, [scheduler] timezone) [default: now].",
)
@click.option(
    "--queue", metavar="Q", help="Its queue [default: the handler's, as a worker registered it]."
)
@click.option(
    "--dedupe-key",
    metavar="K",
    help="At most one active job per key: if one holds K, nothing is enqueued (exit 1).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def enqueue_command(
    state: State,
    handler: str,
    payload: str | None,
    run_at: str | None,
    queue: str | None,
    dedupe_key: str | None,
    as_json: bool,
) -> None:
    """Enqueue a job of HANDLER and print its id.

    Its queue and max_attempts are the handler's, as the workers registered it when they
    started (no handler module is imported here). A handler that no worker has registered is
    still enqueued, with a warning. With --dedupe-key K held by an active (queued or claimed)
    job, nothing is enqueued: the existing job's id is printed (stdout) with one error line
    (stderr) and the command exits 1. --json prints {"id": N, "enqueued": true|false, "job":
    {...}}.
    """
    import warnings

    from .._errors import UnknownHandlerWarning

    app = state.open()
    values = _enqueue_payload(payload, handler)
    when = _enqueue_time(run_at, handler, app.settings.timezone)
    began = app.clock()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnknownHandlerWarning)
        job_id = app.enqueue(handler, values, run_at=when, queue=queue, dedupe_key=dedupe_key)
    for warning in caught:
        click.echo(f"warning: {warning.message}", err=True)
    job = app.get_job(job_id)
    # A job made before this command began holds the key: this one was not enqueued.
    held = dedupe_key is not None and job is not None and job.created_at < began
    if as_json:
        found: dict[str, Any] = job_dict(job) if job is not None else {"id": job_id}
        click.echo(json.dumps({"id": job_id, "enqueued": not held, "job": found}, indent=2))
    else:
        click.echo(str(job_id))
    if held:
        assert job is not None
        click.echo(
            f"error: dedupe key {dedupe_key!r} is held by job {job_id} ({job.state}):"
            " nothing enqueued",
            err=True,
        )
        sys.exit(1)
