"""Health: rows, job counts and the warnings of ``scheduler status`` (docs/runbook.md).

:func:`status` reads in one transaction: the rows with their last job's state and error code
(for its row list), one statement of index-answered counts over the jobs and the latest
finished attempt, the rows that warn (:mod:`.warned`, one statement), the workers; ``now``
is the caller's. :func:`overview` is the dashboard's read of the same: no row list,
the first rows of each kind named and the others counted, the live states' counts only (the
finished states' are :func:`finished_counts`), three statements whatever the table sizes.
Both take the store, the instant and :class:`HealthSettings`, never the Scheduler; the
warnings are the functions in :data:`WARNINGS`.
Workers record that they are alive with :func:`touch` (``scheduler_workers``), and every tick
outside a running worker is kept with :func:`record_tick`.
"""

from __future__ import annotations

import heapq
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import case, delete, func, insert, literal, null, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from ..._model.rows import TaskRow
from ..._model.rules import ABORTED, STATES, Thresholds
from ..._model.time import in_zone, iso
from .. import handlers as _handlers
from .. import jobs as _jobs
from .. import queues as _queues
from .. import rows as _rows
from .. import wakeup as _wakeup
from ..engine import Store
from ..tables import paused_queues, workers
from . import counts as _counts
from . import horizon as _horizon
from . import shards as _shards
from . import warned as _warned
from .counts import LIVE

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
    handlers: str | None = None,
    stuck: int | None = None,
    paused: bool = False,
    probe: Any = None,
) -> Presence | None:
    """Record that ``worker_id`` is alive (and when it last ticked, and how far its host's
    clock is from the database's, when measured); registers it if needed. ``stuck``: the
    worker's attempts still running past their stop (fenced after a timeout), when given.
    ``paused``: also return the paused queues' names (``scheduler pause``), read by the same
    statement where ``UPDATE … RETURNING`` exists (PostgreSQL, SQLite), so that a worker
    learns of a pause at each write of its presence at no statement of its own; else (MariaDB)
    by a read in the same transaction. ``probe``: a boolean SQL expression (the worker's look
    for jobs under its limits, ``limits.ready_probe``) the write carries where it returns
    anything (PostgreSQL, SQLite); its answer is None elsewhere and when the worker
    registered. Returns None without ``paused``.

    Two processes may register one id at once (``scheduler tick`` runs share their host's id):
    the one that loses (a duplicate key on PostgreSQL, a deadlock on MariaDB) updates the row
    the other inserted. ``keep_latest``: an older ``last_tick_at`` than the one on record (from
    another process of the host) leaves it. ``handlers``: the names the worker runs (a JSON
    list, :func:`..handlers.names_text`), written when it registers.
    """
    values: dict[str, Any] = {"last_seen_at": now, "last_tick_at": last_tick_at}
    if clock_offset is not None:
        values["clock_offset"] = clock_offset
    if stuck is not None:
        values["stuck_attempts"] = stuck
    changes: dict[str, Any] = dict(values)
    if keep_latest and last_tick_at is not None:
        on_record = workers.c.last_tick_at
        newer = on_record.is_(None) | (on_record < last_tick_at)
        # The instant typed as the column (UTC, naive), never a bare timestamptz the server
        # would convert by the session's zone on its way into the column.
        value = literal(last_tick_at, type_=workers.c.last_tick_at.type)
        changes["last_tick_at"] = case((newer, value), else_=on_record)
    write = update(workers).where(workers.c.id == worker_id).values(**changes)
    returning = paused and store.caps.update_returning
    if returning:
        write = write.returning(
            _paused_text(store.engine.dialect.name), probe if probe is not None else null()
        )
    for attempt in range(1, REGISTER_ATTEMPTS + 1):
        registering = False
        try:
            with store.begin() as conn:
                found = conn.execute(write)
                if returning:
                    row = found.first()
                    if row is not None:  # its row updated: the paused set came with it
                        names = frozenset(filter(None, (row[0] or "").split("\n")))
                        return Presence(names, None if probe is None else bool(row[1]))
                    missing = True
                else:
                    missing = found.rowcount == 0
                if missing:  # first call, or forgotten meanwhile: register
                    registering = True
                    conn.execute(
                        insert(workers).values(
                            id=worker_id,
                            hostname=socket.gethostname(),
                            pid=os.getpid(),
                            started_at=now,
                            handlers=handlers,
                            **values,
                        )
                    )
                return Presence(_queues.paused_names(conn), None) if paused else None
        except (IntegrityError, OperationalError):
            if not registering or attempt == REGISTER_ATTEMPTS:
                raise
    return None  # not reached: the last attempt returned or raised


@dataclass(frozen=True)
class Presence:
    """What a worker's presence write brought back (:func:`touch`)."""

    paused: frozenset[str]  # the paused queues' names
    ready_under_limits: bool | None  # the probe's answer; None: not asked, or not carried


def _paused_text(dialect: str) -> Any:
    """The paused queues' names joined by newlines (a name has no control character), as a
    scalar subquery for a ``RETURNING`` clause; NULL when none is paused."""
    queue = paused_queues.c.queue
    joined = (
        func.string_agg(queue, literal("\n"))
        if dialect == "postgresql"
        else func.group_concat(queue, literal("\n"))
    )
    return select(joined).scalar_subquery()


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


def _unserved(conn: Any, now: datetime, seen: list[Any], gone_after: float) -> dict[str, int]:
    """Ready jobs by handler that no live worker runs (live: seen within ``gone_after``
    seconds, as ``status`` counts workers). A live worker that did not say which handlers it
    runs (an older release) may run any: then none is listed."""
    served: set[str] = set()
    for w in seen:
        if w.id.endswith(TICK_SUFFIX) or w.last_seen_at <= now - timedelta(seconds=gone_after):
            continue
        names = _handlers.names_of(w.handlers)
        if names is None:
            return {}
        served |= names
    return _handlers.unserved(conn, now, frozenset(served))


def _row(row: TaskRow, backfilled: str | None = None) -> dict[str, Any]:
    """A row of ``status``; ``backfilled``: the state of its newest job when it has no job of
    its own (only backfilled ones), shown as its ``last_job_state`` with ``last_job_id`` None."""
    # A disabled row's next_run_at is stale (enable computes a new one): it has no next run.
    next_run = row.next_run_at if row.enabled else None
    local = in_zone(next_run, ZoneInfo(row.timezone)) if next_run else None
    failing = row.enabled and row.last_job_state == ABORTED
    return {
        "name": row.name,
        "enabled": row.enabled,
        "next_run_at": iso(next_run),
        "last_job_state": row.last_job_state or backfilled,
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
        # recovery = "probe": when a disabled row's next probe runs (None: not probing)
        "probe_at": iso(row.probe_at) if not row.enabled else None,
        "probes": row.probes,
        "overlap": row.overlap,  # the run policies (docs/reference/toml.md)
        "catchup_window": row.catchup_window,
        "jitter": row.jitter,
        "timeout": row.timeout,  # None: the handler's; 0: no limit
        # The last run aborted; consecutive_failures counts it at the next
        # slot (docs/explanation/tick.md).
        "failing": failing,
        "last_error_code": row.last_error_code if row.last_job_state == ABORTED else None,
        "source": row.source,  # file (the TOML file) or api (put_task)
        "group": row.group,
        "tenant": row.tenant,
    }


@dataclass(frozen=True)
class HealthSettings:
    """What health needs of the application's settings (``Scheduler.health_settings()``)."""

    max_consecutive_failures: int = 5  # [scheduler]'s, for rows without their own limit
    clock_mode: str = "database"  # [scheduler] clock: whose clock decides ("database", "local")
    thresholds: Thresholds = field(default_factory=Thresholds)
    broker_url: str | None = None  # [broker] url: status pings it (wake-ups)
    wakeups: bool = True  # [scheduler] wakeups


@dataclass(frozen=True)
class Facts:
    """Everything one health read found, which the warnings are made from."""

    now: datetime
    settings: HealthSettings
    waiting: int
    overdue: int
    stopped: int
    stalled: bool
    warned: _warned.WarnedRows
    any_enabled: bool
    last_tick: datetime | None
    running: list[Any]  # the workers' own rows seen lately (scheduler_workers rows)
    seen: list[Any]  # every row of scheduler_workers, the hosts' tick records included
    lagging: list[int] = field(default_factory=list)  # shards not ticked lately (if sharded)

    @property
    def limits(self) -> Thresholds:
        return self.settings.thresholds

    def older(self, value: datetime | None, seconds: float) -> bool:
        return value is not None and value <= self.now - timedelta(seconds=seconds)

    def more(self, kind: str) -> str:
        return f" and {self.warned.more(kind)} more" if self.warned.more(kind) else ""


# -- the warnings: each a function of the Facts, in the order status prints them ---------------
def _jobs_overdue(f: Facts) -> list[str]:
    if not f.overdue:
        return []
    return [
        f"{f.overdue} job(s) ready for more than {f.limits.job_overdue:g}s and not "
        "claimed: is a worker running with concurrency > 0 on their queue?"
    ]


def _jobs_stopped(f: Facts) -> list[str]:
    if not f.stopped:
        return []
    return [
        f"{f.stopped} claimed job(s) have an expired lease (their worker stopped);"
        " a worker will take them over"
    ]


def _stalled(f: Facts) -> list[str]:
    if not f.stalled:
        return []
    return [
        f"work has stalled: {f.waiting} job(s) waiting and nothing finished for "
        f"more than {f.limits.stalled:g}s"
    ]


def _rows_overdue(f: Facts) -> list[str]:
    if not f.warned.total["overdue"]:
        return []
    return [
        f"task(s) overdue by more than {f.limits.row_overdue:g}s (is a scheduler "
        f"ticking?): {', '.join(f.warned.names('overdue'))}{f.more('overdue')}"
    ]


def _rows_held_back(f: Facts) -> list[str]:
    if not f.warned.total["held_back"]:
        return []
    return [
        f"task(s) held back for more than {f.limits.row_held_back:g}s by a job still"
        f" in flight: {', '.join(f.warned.names('held_back'))}{f.more('held_back')}"
    ]


def _rows_failing(f: Facts) -> list[str]:
    found = []
    for r in f.warned.found["failing"]:
        limit_of = (
            r.max_consecutive_failures
            if r.max_consecutive_failures is not None
            else f.settings.max_consecutive_failures
        )
        counted = r.consecutive_failures + 1
        left = f"{counted} of {limit_of} before the task is disabled" if limit_of else "no limit"
        found.append(
            f"task {r.name!r}: its last run aborted ({r.last_error_code});"
            " the failure is counted at its next slot, which reruns the job in place"
            f" ({left})"
        )
    if f.warned.more("failing"):
        found.append(f"and {f.warned.more('failing')} more task(s) whose last run aborted")
    return found


def _rows_disabled_by_failures(f: Facts) -> list[str]:
    found = [
        f"task {r.name!r} disabled ({r.disabled_reason}) after "
        f"{r.consecutive_failures} consecutive failures: fix it, then "
        f"`scheduler enable {r.name}`"
        for r in f.warned.found["disabled_by_failures"]
    ]
    if f.warned.more("disabled_by_failures"):
        found.append(
            f"and {f.warned.more('disabled_by_failures')} more task(s) disabled after"
            " consecutive failures"
        )
    return found


def _no_tick(f: Facts) -> list[str]:
    # Any process that ticks counts (a worker, `scheduler tick`, app.tick()): a recent tick is
    # all that matters here.
    if not f.any_enabled or not (f.last_tick is None or f.older(f.last_tick, f.limits.tick)):
        return []
    since = f"since {iso(f.last_tick)}" if f.last_tick else "yet"
    if f.lagging:  # sharded: the shards behind
        since += f" in shard(s) {', '.join(str(k) for k in f.lagging)}"
    if f.running:
        return [f"no scheduler tick {since}: are the workers stuck?"]
    if f.last_tick is None:
        return ["no worker is running: start `scheduler worker`"]
    return [f"no scheduler tick {since} and no worker is running: start `scheduler worker`"]


def _clocks(f: Facts) -> list[str]:
    """One warning per host whose clock, as its processes seen lately measured it, is more
    than ``thresholds.clock_offset`` off the database's (the latest measurement of the host)."""
    latest: dict[str, Any] = {}
    for w in f.seen:
        if w.clock_offset is None or f.older(w.last_seen_at, f.limits.worker_gone):
            continue
        if w.hostname not in latest or latest[w.hostname].last_seen_at < w.last_seen_at:
            latest[w.hostname] = w
    if f.settings.clock_mode == "database":
        meanwhile = (
            'with clock = "database" the scheduler decides on the database\'s clock meanwhile'
        )
    else:
        meanwhile = (
            f'with clock = "{f.settings.clock_mode}" its processes decide on its own clock:'
            " its tasks fire early or late until it is fixed"
        )
    found = []
    for host, w in sorted(latest.items()):
        off = -float(w.clock_offset)  # the host's clock minus the database's
        if abs(off) > f.limits.clock_offset:
            way = "ahead of" if off > 0 else "behind"
            found.append(
                f"host {host}'s clock is {abs(off):.1f}s {way} the database's"
                f" (more than {f.limits.clock_offset:g}s; measured by {w.id}): fix its time"
                f" sync (NTP); {meanwhile}"
            )
    return found


def _stuck_attempts(f: Facts) -> list[str]:
    """Attempts fenced after their timeout whose handler never returned: each holds one of its
    worker's threads (docs/howto/timeouts.md)."""
    return [
        f"{w.stuck_attempts} attempt(s) still running past their stop on worker {w.id}:"
        " it runs that many fewer jobs at once until they return (restart it to free them)"
        for w in f.running
        if w.stuck_attempts
    ]


WARNINGS: list[Callable[[Facts], list[str]]] = [
    _jobs_overdue,
    _jobs_stopped,
    _stalled,
    _rows_overdue,
    _rows_held_back,
    _rows_failing,
    _rows_disabled_by_failures,
    _no_tick,
    _clocks,
    _stuck_attempts,
]
"""The warnings ``status`` prints, in order. To add one: a function of :class:`Facts` that
returns its lines (none when all is well), appended here; what it needs that :func:`_read` does
not read yet becomes a field of :class:`Facts`, read in :func:`_read`'s transaction."""


def _gather(
    store: Store,
    now: datetime,
    settings: HealthSettings,
    *,
    rows: bool,
    limit: int | None,
    finished: bool,
    unserved: bool = False,
) -> _shards.Found:
    """One transaction: the row list (only with ``rows``), the job aggregates, the rows that
    warn (:mod:`.warned`), the workers, and (with ``unserved``, when jobs are ready) the ready
    jobs no live worker runs."""
    limits = settings.thresholds
    with store.read() as conn:
        task_rows = _rows.all_rows(conn, payloads=False) if rows else []
        # A task whose only jobs are backfilled ones shows its newest (rarely any task).
        backfilled = _jobs.latest_states(conn, [r.name for r in task_rows if r.last_job_id is None])
        agg = _counts.health_figures(conn, now, limits.job_overdue, finished=finished)
        paused = _queues.paused(conn) if agg.any_paused is not None else []
        if paused:  # rarely: read again, their waiting jobs neither overdue nor stalled
            agg = _counts.health_figures(
                conn, now, limits.job_overdue, finished=finished, paused=[p.queue for p in paused]
            )
        warned = _warned.read(conn, now, limits, limit=limit)
        seen = list(conn.execute(select(workers).order_by(workers.c.started_at)))
        waiting_jobs = unserved and int(agg.waiting) > 0
        unrun = _unserved(conn, now, seen, limits.worker_gone) if waiting_jobs else {}
    return _shards.Found(
        task_rows=task_rows,
        backfilled=backfilled,
        counts={state: int(agg._mapping[state]) for state in (STATES if finished else LIVE)},
        waiting=int(agg.waiting),
        overdue=int(agg.overdue),
        stopped=int(agg.stopped),
        oldest_ready=agg.oldest_ready,
        last_finished=agg.last_finished,
        any_enabled=agg.any_enabled is not None,
        paused=paused,
        warned=warned,
        seen=seen,
        unrun=unrun,
    )


def _read(
    stores: Sequence[Store],
    now: datetime,
    settings: HealthSettings,
    *,
    rows: bool,
    limit: int | None,
    finished: bool,
    unserved: bool = False,
) -> tuple[dict[str, Any], _warned.WarnedRows]:
    """``status``'s object and the rows that warn: each store's :func:`_gather` (one
    transaction each), merged when there are several (the shards, :mod:`.shards`)."""
    found = [
        _gather(store, now, settings, rows=rows, limit=limit, finished=finished, unserved=unserved)
        for store in stores
    ]
    one = found[0] if len(found) == 1 else _shards.merged(found, limit)
    limits = settings.thresholds
    waiting, overdue, stopped = one.waiting, one.overdue, one.stopped
    oldest_ready, last_finished = one.oldest_ready, one.last_finished
    stall_at = now - timedelta(seconds=limits.stalled)
    stalled = bool(
        oldest_ready is not None
        and oldest_ready <= stall_at
        and (last_finished is None or last_finished <= stall_at)
    )
    seen = one.seen
    ticks = [w.last_tick_at for w in seen if w.last_tick_at is not None]
    last_tick = max(ticks) if ticks else None
    lagging: list[int] = []
    if len(found) > 1:  # every shard ticked since the oldest of their latest ticks
        last_tick, lagging = _shards.last_tick(found, now, limits.tick)
    warned = one.warned
    facts = Facts(
        now=now,
        settings=settings,
        waiting=waiting,
        overdue=overdue,
        stopped=stopped,
        stalled=stalled,
        warned=warned,
        any_enabled=one.any_enabled,
        last_tick=last_tick,
        running=[],
        seen=seen,
        lagging=lagging,
    )
    facts.running.extend(  # workers' own rows, seen lately: not the hosts' tick records
        w
        for w in seen
        if not w.id.endswith(TICK_SUFFIX) and not facts.older(w.last_seen_at, limits.worker_gone)
    )
    warnings = [line for warning in WARNINGS for line in warning(facts)]
    store = stores[0]  # the shards share the database, its server and its broker
    warnings.extend(
        _wakeup.status_warnings(
            store.engine.dialect.name, store.database, settings.broker_url, settings.wakeups
        )
    )
    data: dict[str, Any] = {
        "rows": [_row(r, one.backfilled.get(r.name)) for r in one.task_rows],
        "jobs": one.counts,
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
            "last_tick_at": iso(facts.last_tick),
            "last_finished_at": iso(last_finished),
            "unserved": [{"handler": name, "ready": count} for name, count in one.unrun.items()],
            "paused_queues": [p.as_dict() for p in one.paused],
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
                for w in facts.running
            ],
        },
    }
    if len(found) > 1:
        data["health"]["shards"] = _shards.breakdown(found)
    return data, warned


def status(
    store: Store | Sequence[Store],
    now: datetime,
    settings: HealthSettings | None = None,
    *,
    rows: bool = True,
) -> dict[str, Any]:
    """The object ``scheduler status --json`` prints, every count exact and every name listed
    (``Scheduler.status()`` checks the schema first). Without ``rows`` its ``rows`` list is
    empty. Given several stores (the shards), it reads each and merges (:mod:`.shards`)."""
    stores = _stores(store)
    settings = settings or HealthSettings()
    data = _read(stores, now, settings, rows=rows, limit=None, finished=True, unserved=True)[0]
    data["health"]["warnings"].extend(_horizon_warnings(stores[0], settings.thresholds))
    return data


def _stores(store: Store | Sequence[Store]) -> Sequence[Store]:
    """One store, or the shards' (in shard order)."""
    return (store,) if isinstance(store, Store) else store


STATUS_PAGE = 1_000
"""Rows per read when ``status --json`` walks every row (:func:`status_rows`)."""


def status_rows(
    store: Store | Sequence[Store], page: int = STATUS_PAGE
) -> Iterator[dict[str, Any]]:
    """``status``'s ``rows`` list, one row at a time, in flat memory: pages of ``page`` rows
    by name (each read through the name's index from the last name of the previous one).
    Several stores (the shards): each walked so, merged by name (a page of each in memory)."""
    stores = _stores(store)
    if len(stores) > 1:
        return heapq.merge(*(_walk(s, page) for s in stores), key=lambda row: row["name"])
    return _walk(stores[0], page)


def _walk(store: Store, page: int) -> Iterator[dict[str, Any]]:
    after: str | None = None
    while True:
        with store.read() as conn:
            found = _rows.rows_after(conn, after, page, payloads=False)
            backfilled = _jobs.latest_states(conn, [r.name for r in found if r.last_job_id is None])
        yield from (_row(r, backfilled.get(r.name)) for r in found)
        if len(found) < page:
            return
        after = found[-1].name


SUMMARY_ABOVE = 200
"""Rows past which ``scheduler status`` prints counts and the rows that need attention."""
ATTENTION = ("failing", "disabled_by_failures", "disabled", "overdue", "held_back")
"""The kinds of rows that need attention, in the order ``status`` lists them."""


def summary(
    store: Store | Sequence[Store],
    now: datetime,
    settings: HealthSettings | None = None,
    *,
    limit: int = 50,
) -> dict[str, Any] | None:
    """``status`` past :data:`SUMMARY_ABOVE` rows (None at that many or fewer): its object
    without ``rows``, plus ``rows_total``, ``rows_enabled``, ``rows_counted`` (the rows of
    each kind of :data:`ATTENTION`) and ``attention``: at most ``limit`` rows that need it,
    each ``{"name", "kind"}``, a row once (its first kind); ``attention_more`` if there are
    more than those. Several stores (the shards): the rows of all, counted and merged."""
    stores = _stores(store)
    total = enabled = 0
    for one in stores:
        with one.read() as conn:
            counted = _rows.counted(conn)
        total, enabled = total + counted[0], enabled + counted[1]
    if total <= SUMMARY_ABOVE:
        return None
    settings = settings or HealthSettings()
    data, warned = _read(stores, now, settings, rows=False, limit=limit, finished=True)
    data["health"]["warnings"].extend(_horizon_warnings(stores[0], settings.thresholds))
    del data["rows"]
    seen: set[str] = set()
    attention: list[dict[str, str]] = []
    more = any(warned.more(kind) for kind in ATTENTION)
    for kind in ATTENTION:
        for name in warned.names(kind):
            if name in seen:
                continue
            if len(attention) == limit:
                more = True
                break
            seen.add(name)
            attention.append({"name": name, "kind": kind})
    data.update(
        rows_total=total,
        rows_enabled=enabled,
        rows_counted={kind: warned.total[kind] for kind in ATTENTION},
        attention=attention,
        attention_more=more,
    )
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
    store: Store | Sequence[Store],
    now: datetime,
    settings: HealthSettings | None = None,
    *,
    limit: int = WARNED_LIMIT,
) -> dict[str, Any]:
    """The dashboard's Workers & health read, three statements whatever the table sizes:
    :func:`status` without the row list, with the counts of the live states only (the
    finished ones are :func:`finished_counts`, which walks an index entry per finished job),
    and with the first ``limit`` rows of each kind named in its warnings and ``rows_*`` lists
    ("and N more"); ``rows_counted`` has each kind's total (:data:`.warned.KINDS`). Several
    stores (the shards): those statements in each, merged."""
    data, warned = _read(
        _stores(store), now, settings or HealthSettings(), rows=False, limit=limit, finished=False
    )
    del data["rows"]
    del data["health"]["unserved"]  # not read here (the page does not show it)
    data["rows_counted"] = dict(warned.total)
    return data
