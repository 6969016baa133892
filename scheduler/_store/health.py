"""Health: rows, job counts and the warnings of ``scheduler status`` (docs/runbook.md).

:func:`status` reads in one transaction: the rows with their last job's state and error code
(for its row list), one statement of index-answered counts over the jobs and the latest
finished attempt, the rows that warn (:mod:`.warned`, one statement), the workers; ``now``
defaults to the app's clock. :func:`overview` is the dashboard's read of the same: no row list,
the first rows of each kind named and the others counted, the live states' counts only (the
finished states' are :func:`finished_counts`), three statements whatever the table sizes.
Workers record that they are alive with :func:`touch` (``scheduler_workers``), and every tick
outside a running worker is kept with :func:`record_tick`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sqlalchemy import case, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from .._time import iso
from . import horizon as _horizon
from . import rows as _rows
from . import warned as _warned
from .engine import Store
from .jobs import ABORTED, CLAIMED, QUEUED, STATES, SUCCEEDED
from .tables import jobs, runs, workers
from .tables import rows as task_rows

if TYPE_CHECKING:
    from .._app import Scheduler

LIVE = (QUEUED, CLAIMED)  # few: counted exactly on every read
FINISHED = (SUCCEEDED, ABORTED)  # as many as the jobs kept


@dataclass(frozen=True)
class Thresholds:
    """How long before something counts as unhealthy, in seconds."""

    job_overdue: float = 300.0  # a ready job not claimed for this long
    row_overdue: float = 300.0  # an enabled row due this long ago and not dispatched
    row_held_back: float = 3600.0  # a row waiting this long on its in-flight job
    stalled: float = 600.0  # jobs waiting this long and nothing finished meanwhile
    tick: float = 120.0  # no scheduler tick for this long
    worker_gone: float = 30.0  # a worker not seen for this long is not running (kill -9)
    clock_offset: float = 2.0  # a host's clock this far off the database's (CLOCK_WARN_SECONDS)
    horizon: float = 300.0  # a transaction holding the MVCC horizon this long (horizon.py)


CLOCK_WARN_SECONDS = Thresholds.clock_offset
"""``status`` warns about a host whose clock is more than this off the database's."""


# -- presence: each worker keeps a row in scheduler_workers --------------------------------
REGISTER_ATTEMPTS = 5  # a lost race to register an id is retried as an update


def touch(
    store: Store,
    worker_id: str,
    now: datetime,
    last_tick_at: datetime | None,
    *,
    keep_latest: bool = False,
    clock_offset: float | None = None,
) -> None:
    """Record that ``worker_id`` is alive (and when it last ticked, and how far its host's
    clock is from the database's, when measured); registers it if needed.

    Two processes may register one id at once (``scheduler tick`` runs share their host's id):
    the one that loses (a duplicate key on PostgreSQL, a deadlock on MariaDB) updates the row
    the other inserted. ``keep_latest``: an older ``last_tick_at`` than the one on record (from
    another process of the host) leaves it.
    """
    values: dict[str, Any] = {"last_seen_at": now, "last_tick_at": last_tick_at}
    if clock_offset is not None:
        values["clock_offset"] = clock_offset
    changes: dict[str, Any] = dict(values)
    if keep_latest and last_tick_at is not None:
        on_record = workers.c.last_tick_at
        newer = on_record.is_(None) | (on_record < last_tick_at)
        changes["last_tick_at"] = case((newer, last_tick_at), else_=on_record)
    for attempt in range(1, REGISTER_ATTEMPTS + 1):
        registering = False
        try:
            with store.begin() as conn:
                found = conn.execute(
                    update(workers).where(workers.c.id == worker_id).values(**changes)
                )
                if found.rowcount == 0:  # first call, or forgotten meanwhile: register
                    registering = True
                    conn.execute(
                        insert(workers).values(
                            id=worker_id,
                            hostname=socket.gethostname(),
                            pid=os.getpid(),
                            started_at=now,
                            **values,
                        )
                    )
            return
        except (IntegrityError, OperationalError):
            if not registering or attempt == REGISTER_ATTEMPTS:
                raise


TICK_SUFFIX = ":tick"


def tick_record_id() -> str:
    """The id the host's ticks are kept on record under, one row per host: those of
    ``scheduler tick``, of ``app.tick()`` in any process, and the last tick of a worker that
    stopped. Not a worker: :func:`status` counts only the workers' own rows."""
    return f"{socket.gethostname()}{TICK_SUFFIX}"


def record_tick(
    store: Store, now: datetime, ticked_at: datetime, *, clock_offset: float | None = None
) -> None:
    """Keep a tick on record under :func:`tick_record_id` (the latest of the host's wins), so
    that ``status`` sees ticks run from the Python API, cron(8) or a timer, and the last
    tick of a worker after it stopped."""
    touch(store, tick_record_id(), now, ticked_at, keep_latest=True, clock_offset=clock_offset)


def forget(
    store: Store, worker_id: str | None = None, *, seen_before: datetime | None = None
) -> None:
    """Delete one worker's row, or every row not seen since ``seen_before``."""
    condition = (
        (workers.c.id == worker_id)
        if worker_id is not None
        else (workers.c.last_seen_at < seen_before)
    )
    with store.begin() as conn:
        conn.execute(delete(workers).where(condition))


def _row(row: _rows.TaskRow) -> dict[str, Any]:
    # A disabled row's next_run_at is stale (enable computes a new one): it has no next run.
    next_run = row.next_run_at if row.enabled else None
    local = next_run.astimezone(ZoneInfo(row.timezone)) if next_run else None
    failing = row.enabled and row.last_job_state == ABORTED
    return {
        "name": row.name,
        "enabled": row.enabled,
        "next_run_at": iso(next_run),
        "last_job_state": row.last_job_state,
        "consecutive_failures": row.consecutive_failures,
        "disabled_reason": row.disabled_reason,
        # extra keys
        "disabled_note": row.disabled_note,
        "timezone": row.timezone,
        "next_run_local": local.isoformat() if local else None,
        "cron": row.cron,
        "handler": row.handler,
        "last_job_id": row.last_job_id,
        "disabled_at": iso(row.disabled_at),
        "overlap": row.overlap,  # the run policies (SPEC §8)
        "catchup_window": row.catchup_window,
        "jitter": row.jitter,
        # The last run aborted; consecutive_failures counts it at the next slot (SPEC §2).
        "failing": failing,
        "last_error_code": row.last_error_code if row.last_job_state == ABORTED else None,
    }


def _count(*where: Any) -> Any:
    return select(func.count()).select_from(jobs).where(*where).scalar_subquery()


def _job_aggregates(conn: Any, now: datetime, limits: Thresholds, *, finished: bool) -> Any:
    """One statement of scalar subqueries, each answered from an index, never a scan of the
    jobs' rows: the counts per state (without ``finished``, only the live states', which are
    few) and the queued and claimed figures from the ready index (``state`` first), the latest
    finished attempt from the history's newest row (runs are appended as attempts finish, so
    the highest id is the latest within a few seconds), and whether any row is enabled."""
    overdue_at = now - timedelta(seconds=limits.job_overdue)
    queued, ready = jobs.c.state == QUEUED, jobs.c.run_at <= now
    stmt = select(
        *(_count(jobs.c.state == state).label(state) for state in (STATES if finished else LIVE)),
        _count(queued, ready).label("waiting"),
        _count(queued, jobs.c.run_at <= overdue_at).label("overdue"),
        _count(jobs.c.state == CLAIMED, jobs.c.lease_expires_at <= now).label("stopped"),
        select(func.min(jobs.c.run_at))
        .where(queued, ready)
        .scalar_subquery()
        .label("oldest_ready"),
        select(runs.c.finished_at)
        .order_by(runs.c.id.desc())
        .limit(1)
        .scalar_subquery()
        .label("last_finished"),
        select(task_rows.c.id)
        .where(task_rows.c.enabled.is_(True))
        .limit(1)
        .scalar_subquery()
        .label("any_enabled"),
    )
    return conn.execute(stmt).one()


def finished_counts(conn: Any) -> dict[str, int]:
    """One statement: how many jobs are in each finished state. Each count walks the state's
    entries in an index: about 100 ms per million jobs, so the dashboard takes it in the
    background (``scheduler status`` takes it with the rest)."""
    found = conn.execute(
        select(*(_count(jobs.c.state == state).label(state) for state in FINISHED))
    ).one()
    return {state: int(found._mapping[state]) for state in FINISHED}


def _clock_warnings(seen: list[Any], older: Any, limits: Thresholds) -> list[str]:
    """One warning per host whose clock, as its processes seen lately measured it, is more
    than ``limits.clock_offset`` off the database's (the latest measurement of the host)."""
    latest: dict[str, Any] = {}
    for w in seen:
        if w.clock_offset is None or older(w.last_seen_at, limits.worker_gone):
            continue
        if w.hostname not in latest or latest[w.hostname].last_seen_at < w.last_seen_at:
            latest[w.hostname] = w
    found = []
    for host, w in sorted(latest.items()):
        off = -float(w.clock_offset)  # the host's clock minus the database's
        if abs(off) > limits.clock_offset:
            way = "ahead of" if off > 0 else "behind"
            found.append(
                f"host {host}'s clock is {abs(off):.1f}s {way} the database's"
                f" (more than {limits.clock_offset:g}s; measured by {w.id}): fix its time"
                ' sync (NTP); with clock = "database" the scheduler decides on the'
                " database's clock meanwhile"
            )
    return found


def _read(
    app: Scheduler,
    now: datetime | None,
    thresholds: Thresholds | None,
    *,
    rows: bool,
    limit: int | None,
    finished: bool,
) -> tuple[dict[str, Any], _warned.WarnedRows]:
    """``status``'s object and the rows that warn, read in one transaction: the row list (only
    with ``rows``), the job aggregates, the rows that warn (:mod:`.warned`), the workers."""
    app.check_schema()
    now = now if now is not None else app.clock()
    limits = thresholds or Thresholds()
    with app.store.read() as conn:
        task_rows = _rows.all_rows(conn, payloads=False) if rows else []
        agg = _job_aggregates(conn, now, limits, finished=finished)
        warned = _warned.read(conn, now, limits, limit=limit)
        seen = list(conn.execute(select(workers).order_by(workers.c.started_at)))
    counts = {state: int(agg._mapping[state]) for state in (STATES if finished else LIVE)}
    waiting, overdue, stopped = int(agg.waiting), int(agg.overdue), int(agg.stopped)
    oldest_ready, last_finished = agg.oldest_ready, agg.last_finished
    stall_at = now - timedelta(seconds=limits.stalled)
    stalled = bool(
        oldest_ready is not None
        and oldest_ready <= stall_at
        and (last_finished is None or last_finished <= stall_at)
    )

    def older(value: datetime | None, seconds: float) -> bool:
        return value is not None and value <= now - timedelta(seconds=seconds)

    ticks = [w.last_tick_at for w in seen if w.last_tick_at is not None]
    last_tick = max(ticks) if ticks else None
    running = [  # workers' own rows, seen lately: not the hosts' tick records
        w
        for w in seen
        if not w.id.endswith(TICK_SUFFIX) and not older(w.last_seen_at, limits.worker_gone)
    ]

    def more(kind: str) -> str:
        return f" and {warned.more(kind)} more" if warned.more(kind) else ""

    warnings: list[str] = []
    if overdue:
        warnings.append(
            f"{overdue} job(s) ready for more than {limits.job_overdue:g}s and not "
            "claimed: is a worker running with concurrency > 0 on their queue?"
        )
    if stopped:
        warnings.append(
            f"{stopped} claimed job(s) have an expired lease (their worker stopped);"
            " a worker will take them over"
        )
    if stalled:
        warnings.append(
            f"work has stalled: {waiting} job(s) waiting and nothing finished for "
            f"more than {limits.stalled:g}s"
        )
    if warned.total["overdue"]:
        warnings.append(
            f"task(s) overdue by more than {limits.row_overdue:g}s (is a scheduler "
            f"ticking?): {', '.join(warned.names('overdue'))}{more('overdue')}"
        )
    if warned.total["held_back"]:
        warnings.append(
            f"task(s) held back for more than {limits.row_held_back:g}s by a job still"
            f" in flight: {', '.join(warned.names('held_back'))}{more('held_back')}"
        )
    for r in warned.found["failing"]:
        limit_of = (
            r.max_consecutive_failures
            if r.max_consecutive_failures is not None
            else app.settings.max_consecutive_failures
        )
        counted = r.consecutive_failures + 1
        left = f"{counted} of {limit_of} before the task is disabled" if limit_of else "no limit"
        warnings.append(
            f"task {r.name!r}: its last run aborted ({r.last_error_code});"
            " the failure is counted at its next slot, which reruns the job in place"
            f" ({left})"
        )
    if warned.more("failing"):
        warnings.append(f"and {warned.more('failing')} more task(s) whose last run aborted")
    for r in warned.found["disabled_by_failures"]:
        warnings.append(
            f"task {r.name!r} disabled ({r.disabled_reason}) after "
            f"{r.consecutive_failures} consecutive failures: fix it, then "
            f"`scheduler enable {r.name}`"
        )
    if warned.more("disabled_by_failures"):
        warnings.append(
            f"and {warned.more('disabled_by_failures')} more task(s) disabled after"
            " consecutive failures"
        )
    # Any process that ticks counts (SPEC §13): a recent tick is all that matters here.
    if agg.any_enabled is not None and (last_tick is None or older(last_tick, limits.tick)):
        since = f"since {iso(last_tick)}" if last_tick else "yet"
        if running:
            warnings.append(f"no scheduler tick {since}: are the workers stuck?")
        elif last_tick is None:
            warnings.append("no worker is running: start `scheduler worker`")
        else:
            warnings.append(
                f"no scheduler tick {since} and no worker is running: start `scheduler worker`"
            )

    warnings.extend(_clock_warnings(seen, older, limits))

    data = {
        "rows": [_row(r) for r in task_rows],
        "jobs": counts,
        "health": {
            "waiting": waiting,
            "stopped": stopped,
            "overdue": overdue,
            "stalled": stalled,
            "warnings": warnings,
            # extra keys
            "now": iso(now),
            "rows_overdue": warned.names("overdue"),
            "rows_held_back": warned.names("held_back"),
            "rows_disabled": warned.names("disabled"),
            "last_tick_at": iso(last_tick),
            "last_finished_at": iso(last_finished),
            "workers": [
                {
                    "id": w.id,
                    "hostname": w.hostname,
                    "pid": w.pid,
                    "started_at": iso(w.started_at),
                    "last_seen_at": iso(w.last_seen_at),
                    "last_tick_at": iso(w.last_tick_at),
                    "clock_offset": w.clock_offset,
                }
                for w in running
            ],
        },
    }
    return data, warned


def status(
    app: Scheduler,
    now: datetime | None = None,
    thresholds: Thresholds | None = None,
    *,
    rows: bool = True,
) -> dict[str, Any]:
    """The object ``scheduler status --json`` prints, every count exact and every name listed;
    refuses an outdated schema. Without ``rows`` its ``rows`` list is empty."""
    data = _read(app, now, thresholds, rows=rows, limit=None, finished=True)[0]
    data["health"]["warnings"].extend(_horizon_warnings(app.store, thresholds or Thresholds()))
    return data


def _horizon_warnings(store: Store, limits: Thresholds) -> list[str]:
    """PostgreSQL: a transaction holding the MVCC horizon too long (horizon.py); one more
    read, apart from the others (it reads the server's activity, not the scheduler's
    tables)."""
    if store.caps.dialect != "postgresql":
        return []
    with store.read() as conn:
        return _horizon.warnings(_horizon.holders(conn), limits.horizon)


WARNED_LIMIT = 20
"""Rows of each kind the dashboard names (:func:`overview`); the others are counted."""


def overview(
    app: Scheduler,
    now: datetime | None = None,
    thresholds: Thresholds | None = None,
    *,
    limit: int = WARNED_LIMIT,
) -> dict[str, Any]:
    """The dashboard's Workers & health read, three statements whatever the table sizes:
    :func:`status` without the row list, with the counts of the live states only (the
    finished ones are :func:`finished_counts`, which walks an index entry per finished job),
    and with the first ``limit`` rows of each kind named in its warnings and ``rows_*`` lists
    ("and N more"); ``rows_counted`` has each kind's total (:data:`.warned.KINDS`)."""
    data, warned = _read(app, now, thresholds, rows=False, limit=limit, finished=False)
    del data["rows"]
    data["rows_counted"] = dict(warned.total)
    return data
