"""``explain``: why a task ran, or did not, and what comes next.

Users read it in docs/howto/why-didnt-my-task-run.md.

The store reads the row in three statements (``scheduler/_store/status/explain.py``); the rest
is worked out here:
the state in one sentence a person can act on, the next fire times in the row's zone and in
UTC with the DST shifts marked, and the run policies. The result is JSON-ready (ISO-8601 UTC
strings ending in ``Z``): ``scheduler explain NAME --json`` prints it as it is, and the
dashboard's Task page shows it.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from .._errors import UnknownRow
from .._model import slots as _slots
from .._model.job import Job
from .._model.limits import LimitSet
from .._model.rows import TaskRow
from .._model.time import in_zone, iso
from .._store import Store
from .._store import limits as _limits
from .._store.status.explain import RUNS, Read, read

NEXT_FIRES = _slots.NEXT_FIRES


def _clock(value: datetime | None, zone: str) -> str:
    """``2030-01-01 10:02:03 CET (09:02:03 UTC)`` in `zone` (UTC alone in UTC)."""
    if value is None:
        return "-"
    local = in_zone(value, ZoneInfo(zone))
    text = f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"
    return text if zone in ("UTC", "Etc/UTC") else f"{text} ({value:%H:%M:%S} UTC)"


def _fires(row: TaskRow, now: datetime) -> list[dict[str, Any]]:
    """The next fires of an enabled row (none for a disabled one), as ``explain`` shows them."""
    if not row.enabled:
        return []
    fires = _slots.next_fires(row, now, NEXT_FIRES, next_run_at=row.next_run_at)
    return [fire.as_dict() for fire in fires]


def policies(row: TaskRow, global_limit: int) -> dict[str, Any]:
    limit = row.max_consecutive_failures
    return {
        "overlap": row.overlap,
        "catchup_window": row.catchup_window,
        "jitter": row.jitter,
        "timeout": row.timeout,  # None: the handler's; 0: no limit
        "max_consecutive_failures": global_limit if limit is None else limit,
        "recovery": row.recovery,
        "cron": row.cron,
        "timezone": row.timezone,
        "handler": row.handler,
    }


def state_sentence(
    row: TaskRow,
    job: dict[str, Any] | None,
    now: datetime,
    limit: int,
    last: dict[str, Any] | None,
    note: str | None = None,
) -> tuple[str, str]:
    """(tone, sentence): what the row is doing now and what to do about it, in one sentence.

    Tones: ``ok``, ``run``, ``warn``, ``bad``, ``off`` (the dashboard's colours)."""
    zone = row.timezone

    def at(value: datetime | None) -> str:
        return _clock(value, zone)

    name = row.name
    if not row.enabled:
        why = row.disabled_reason or "manual"
        if note:
            why += f": {note}"
        after = (
            f" after {row.consecutive_failures} consecutive failures"
            if row.disabled_reason == "max_consecutive_failures"
            else ""
        )
        if row.probe_at is not None and row.recovery == "probe":
            ran = f"; {row.probes} probe(s) failed so far" if row.probes else ""
            return "bad", (
                f"disabled, probing: next probe at {at(row.probe_at)}{ran} (disabled"
                f" ({why}) since {at(row.disabled_at)}{after}); the first probe that succeeds"
                f" re-enables it, or `scheduler enable {name}` does now"
            )
        return ("bad" if after else "off"), (
            f"disabled ({why}) since {at(row.disabled_at)}{after}; slots pass without running"
            f" until `scheduler enable {name}` re-arms it from then"
        )
    nxt = row.next_run_at
    due = nxt is not None and nxt <= now
    when = f"next slot {at(nxt)}" if not due else f"due since {at(nxt)}"
    if job is not None and job["state"] in ("queued", "claimed"):
        jid, state = job["id"], job["state"]
        if state == "claimed":
            lease = job["lease_expires_at"]
            expired = lease is not None and lease <= now
            holder = (
                f"job {jid} is claimed by {job['lease_owner']} since {at(job['started_at'])},"
                f" lease until {at(lease)}"
                + (" (expired: a worker takes it over)" if expired else "")
            )
        elif job["attempts"]:
            holder = (
                f"job {jid} is retrying (attempt {job['attempts']} of {job['max_attempts']}"
                f" failed with {job['last_error_code']}; next attempt at {at(job['run_at'])})"
            )
        elif job.get("waiting_for"):
            holder = f"job {jid} is queued, held by a limit ({job['waiting_for']})"
        else:
            waiting = job["run_at"] <= now
            holder = f"job {jid} is queued to run at {at(job['run_at'])}" + (
                f" (not claimed yet: check that a worker serves queue {job['queue']!r})"
                if waiting
                else ""
            )
        if due and row.overlap == "hold":
            return "warn", f"held back: {holder}; the slot fires once the job ends"
        doing = "running" if state == "claimed" else "waiting"
        if row.overlap == "skip":
            return "run", f"{doing}: {holder}; slots that come meanwhile are skipped (overlap skip)"
        return "run", f"{doing}: {holder}; {when}"
    if job is not None and job["state"] == "aborted":
        failures = row.consecutive_failures + 1
        then = f"failure {failures} of {limit}" if limit else f"failure {failures}"
        return "bad", (
            f"failing: job {job['id']} aborted ({job['last_error_code']}); the {when} reruns it"
            f" in place ({then}{' before the task is disabled' if limit else ''});"
            f" `scheduler job {job['id']}` shows its attempts"
        )
    last_word = ""
    if last is not None and last["decision"] in ("skipped_overlap", "missed", "paused"):
        last_word = f"; its last slot {at(last['slot'])} was {last['decision'].replace('_', ' ')}"
        if last.get("detail"):
            last_word += f" ({last['detail']})"
    if job is None:
        return "ok", f"scheduled: no run yet; {when}{last_word}"
    return "ok", (
        f"scheduled: job {job['id']} succeeded at {at(job['finished_at'])}; {when}{last_word}"
    )


def _decision(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": entry["id"],
        "slot": iso(entry["slot"]),
        "decided_at": iso(entry["decided_at"]),
        "decision": entry["decision"],
        "job_id": entry["job_id"],
        "reason": entry["reason"],
        "detail": entry["detail"],
    }


def _run(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "job_id": run["job_id"],
        "run": run["run"],
        "attempt": run["attempt"],
        "slot": iso(run["slot"]),
        "started_at": iso(run["started_at"]),
        "finished_at": iso(run["finished_at"]),
        "outcome": run["outcome"],
        "error_code": run["error_code"],
        "worker": run["worker"],
    }


def _job_dict(job: Job | None, started_at: datetime | None) -> dict[str, Any] | None:
    if job is None:
        return None
    return {
        "id": job.id,
        "state": job.state,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "queue": job.queue,
        "slot": job.slot,
        "run_at": job.run_at,
        "lease_owner": job.lease_owner,
        "lease_expires_at": job.lease_expires_at,
        "started_at": started_at,
        "finished_at": job.finished_at,
        "last_error_code": job.last_error_code,
        "waiting_for": job.waiting_for,
    }


def build(found: Read, now: datetime, global_limit: int) -> dict[str, Any]:
    """The explain data of what :func:`read` found, at `now`."""
    row, entries = found.row, found.decisions
    job = _job_dict(found.job, found.job_started_at)
    given = policies(row, global_limit)
    last = entries[0] if entries else None
    tone, sentence = state_sentence(
        row, job, now, given["max_consecutive_failures"], last, found.note
    )
    return {
        "name": row.name,
        "source": row.source,
        "group": row.group,
        "tenant": row.tenant,
        "state": sentence,
        "tone": tone,
        "enabled": row.enabled,
        "next_run_at": iso(row.next_run_at) if row.enabled else None,
        "disabled_reason": row.disabled_reason,
        "disabled_note": found.note,
        "disabled_at": iso(row.disabled_at),
        "probe_at": iso(row.probe_at) if not row.enabled else None,
        "consecutive_failures": row.consecutive_failures,
        "policies": given,
        "last_job": None
        if job is None
        else {k: iso(v) if isinstance(v, datetime) else v for k, v in job.items()},
        # A disabled task fires nothing until enabled (which computes its next run from then).
        "next_fires": _fires(row, now),
        "decisions": [_decision(e) for e in entries],
        "runs": [_run(r) for r in found.runs[:RUNS]],
    }


def explain(
    store: Store, name: str, now: datetime, global_limit: int, limits: LimitSet | None = None
) -> dict[str, Any]:
    """What `explain NAME --json` prints; :class:`UnknownRow` for a name no row has. With
    ``limits``, a last job a limit holds back says what it waits for."""
    with store.read() as conn:
        found = read(conn, name)
        if found is not None and found.job is not None and limits:
            sentences = _limits.waiting_for(conn, limits, [found.job], now)
            if found.job.id in sentences:
                job = dataclasses.replace(found.job, waiting_for=sentences[found.job.id])
                found = dataclasses.replace(found, job=job)
    if found is None:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")
    return build(found, now, global_limit)
