"""``explain``: why a task ran, or did not, and what comes next (SPEC §9).

:func:`explain` reads four statements, each through an index (the row with its last job; the
row's newest decisions; the task's newest jobs; their runs), and works out the rest in Python:
the state in one sentence a person can act on, the next fire times in the row's zone and in
UTC with the DST shifts marked, and the run policies. The result is JSON-ready (ISO-8601 UTC
strings ending in ``Z``): ``scheduler explain NAME --json`` prints it as it is, and the
dashboard's Task page shows it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Connection, bindparam, select

from . import _cron
from ._errors import UnknownRow
from ._store import decisions as _decisions
from ._store.rows import TaskRow, get_row
from ._store.tables import jobs, runs

NEXT_FIRES = 10
DECISIONS = 20
RUNS = 10

_JOB = select(jobs).where(jobs.c.id == bindparam("p_id"))
_TASK_JOBS = (  # the task's newest jobs, through ix_scheduler_jobs_task (task_name, id)
    select(jobs.c.id)
    .where(jobs.c.task_name == bindparam("p_name"))
    .order_by(jobs.c.id.desc())
    .limit(bindparam("p_limit"))
)
_RUNS = (
    select(runs)
    .where(runs.c.job_id.in_(bindparam("p_ids", expanding=True)))
    .order_by(runs.c.id.desc())
    .limit(bindparam("p_limit"))
)


def iso(value: datetime | None) -> str | None:
    """ISO-8601 in UTC with a ``Z``, or None."""
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def _clock(value: datetime | None, zone: str) -> str:
    """``2030-01-01 10:02:03 CET (09:02:03 UTC)`` in `zone` (UTC alone in UTC)."""
    if value is None:
        return "-"
    local = value.astimezone(ZoneInfo(zone))
    text = f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"
    return text if zone in ("UTC", "Etc/UTC") else f"{text} ({value:%H:%M:%S} UTC)"


def _offset(delta: timedelta | None) -> str:
    minutes = int((delta or timedelta(0)).total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def next_fires(row: TaskRow, now: datetime, count: int = NEXT_FIRES) -> list[dict[str, Any]]:
    """The row's next `count` slots from its ``next_run_at`` (from `now` when disabled): each
    with its nominal slot, the instant it fires (jitter added), local and UTC, and ``dst``
    set where the zone's UTC offset differs from the previous fire's (``UTC+01:00 →
    UTC+02:00``); ``dst_case`` is ``dst_gap`` for a slot moved out of a spring-forward gap."""
    zone = ZoneInfo(row.timezone)
    if row.enabled and row.next_run_at is not None:
        slot = _cron.slot_of(row.cron, row.timezone, row.name, row.next_run_at, row.jitter)
        start = min(slot, now)
    else:
        start = now
        slot = _cron.next_after(row.cron, row.timezone, now, row.name)
    fires: list[dict[str, Any]] = []
    previous = start.astimezone(zone).utcoffset()
    before = start
    for _ in range(count):
        at = slot + _cron.jitter_delay(row.name, slot, row.jitter)
        offset = slot.astimezone(zone).utcoffset()
        cases = _cron.dst_notes(row.cron, row.timezone, row.name, before, slot)
        fires.append(
            {
                "slot": iso(slot),
                "at": iso(at),
                "local": at.astimezone(zone).isoformat(),
                "dst": None if offset == previous else f"{_offset(previous)} → {_offset(offset)}",
                "dst_case": next((kind for kind, when in cases if when == slot), None),
                "skipped_repeats": [iso(when) for kind, when in cases if kind == "dst_repeat"],
            }
        )
        previous, before = offset, slot
        slot = _cron.next_after(row.cron, row.timezone, slot, row.name)
    return fires


def policies(row: TaskRow, global_limit: int) -> dict[str, Any]:
    limit = row.max_consecutive_failures
    return {
        "overlap": row.overlap,
        "catchup_window": row.catchup_window,
        "jitter": row.jitter,
        "max_consecutive_failures": global_limit if limit is None else limit,
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
        else:
            waiting = job["run_at"] <= now
            holder = f"job {jid} is queued to run at {at(job['run_at'])}" + (
                f" (not claimed yet: check that a worker serves queue {job['queue']!r})"
                if waiting
                else ""
            )
        if due and row.overlap == "hold":
            return "warn", f"held back: {holder}; the slot fires once the job ends"
        if row.overlap == "skip":
            return "run", f"{holder}; slots that come while it runs are skipped (overlap skip)"
        return "run", f"running: {holder}; {when}"
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
        "attempt": run["attempt"],
        "slot": iso(run["slot"]),
        "started_at": iso(run["started_at"]),
        "finished_at": iso(run["finished_at"]),
        "outcome": run["outcome"],
        "error_code": run["error_code"],
        "worker": run["worker"],
    }


def explain(conn: Connection, name: str, now: datetime, global_limit: int) -> dict[str, Any]:
    """What `explain NAME --json` prints; :class:`UnknownRow` for a name no row has."""
    row = get_row(conn, name)
    if row is None:
        raise UnknownRow(f"no task named {name!r} (run `scheduler sync`?)")
    job: dict[str, Any] | None = None
    if row.last_job_id is not None:
        found = conn.execute(_JOB, {"p_id": row.last_job_id}).first()
        job = dict(found._mapping) if found is not None else None
    entries = _decisions.recent(conn, name, DECISIONS)
    ids = list(conn.execute(_TASK_JOBS, {"p_name": name, "p_limit": RUNS}).scalars())
    found_runs = (
        [dict(r._mapping) for r in conn.execute(_RUNS, {"p_ids": ids, "p_limit": RUNS})]
        if ids
        else []
    )
    note = getattr(row, "disabled_note", None)
    limit = policies(row, global_limit)["max_consecutive_failures"]
    last = entries[0] if entries else None
    tone, sentence = state_sentence(row, job, now, limit, last, note)
    return {
        "name": row.name,
        "state": sentence,
        "tone": tone,
        "enabled": row.enabled,
        "next_run_at": iso(row.next_run_at) if row.enabled else None,
        "disabled_reason": row.disabled_reason,
        "disabled_note": note,
        "disabled_at": iso(row.disabled_at),
        "consecutive_failures": row.consecutive_failures,
        "policies": policies(row, global_limit),
        "last_job": None
        if job is None
        else {
            "id": job["id"],
            "state": job["state"],
            "attempts": job["attempts"],
            "max_attempts": job["max_attempts"],
            "slot": iso(job["slot"]),
            "run_at": iso(job["run_at"]),
            "lease_owner": job["lease_owner"],
            "lease_expires_at": iso(job["lease_expires_at"]),
            "started_at": iso(job["started_at"]),
            "finished_at": iso(job["finished_at"]),
            "last_error_code": job["last_error_code"],
        },
        "next_fires": next_fires(row, now),
        "decisions": [_decision(e) for e in entries],
        "runs": [_run(r) for r in found_runs],
    }
