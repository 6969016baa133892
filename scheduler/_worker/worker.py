"""The long-running worker: tick, claim and run jobs on threads, heartbeats, housekeeping.

Every ``tick_interval`` the worker ticks, on its own thread, on the wall clock's multiples of
it plus a small offset of its own (see :func:`tick_offset`); at least every second (and
without waiting for the tick) it takes over jobs whose
lease expired and claims ready ones, never more than it has free threads (``concurrency``; 0 =
tick only). A heartbeat thread renews the leases of the running jobs every third of a lease.
Every minute it purges old jobs and delivers ``row_disabled`` alerts a crash left undelivered.
It keeps a row in ``scheduler_workers`` (``scheduler status`` reads it) and deletes it on exit,
leaving its last tick on record for ``status`` (``_health.record_tick``).

``async def`` handlers run on one event loop per process, on a thread of its own
(:mod:`scheduler._worker.events`, with a watchdog that logs a handler blocking the loop), up to
``async_concurrency`` at once beside the ``concurrency`` threads; the claim asks for each kind
of job up to its own free slots. The heartbeat thread renews their leases as it does the
threads' jobs.

SIGTERM/SIGINT stop the claiming; running jobs get ``shutdown_grace_seconds`` to finish (a
second signal cuts the grace short); sync jobs still running then are left to lease expiry and
takeover, async ones are cancelled and recorded as a stopped worker's jobs (retry safety
decides: queued again, or abandoned). Database errors (a server restart, SQLite busy) are
logged and retried with capped exponential backoff: the worker does not die of them.

Handler modules: :func:`import_handlers` imports the ``[worker] imports`` (the current
directory importable). A module registers its handlers either way, and the worker sees both:
``@default_registry.handler("name", ...)`` after ``from scheduler import default_registry``
(as ``scheduler/examples/jobs.py`` does), or ``@app.handler(...)`` on its own
``app = Scheduler.from_toml(os.environ["SCHEDULER_CONFIG"])`` (the CLI sets it to the file
in use): a Scheduler built without a ``registry`` uses ``default_registry``, the one the
worker's Scheduler looks in (that app never connects unless used). Connect signal receivers
there too, as module-level functions (blinker holds weak references).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple

from .._model.backoff import Backoff
from .._model.ending import Ending
from .._model.job import Job
from .._store import handlers as _handlers
from .._store import wakeup as _wakeup
from .._store.retry import is_transient
from .._store.status import health as _health
from .events import EventLoop
from .recorder import Recorder
from .runner import CANCELLED, LIMITS_FULL_SECONDS, LIMITS_RETRY_SECONDS, TIMEOUT, Stop
from .telemetry import Telemetry

if TYPE_CHECKING:
    from .._config import WorkerSettings
    from .host import Host

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # look for ready jobs (and expired leases) at least this often
SHORT_JOB_SECONDS = 0.05  # jobs shorter than this on average are prefetched
PREFETCH_FACTOR = 4  # with short jobs, hold up to this many per thread
SLOW_JOB_SECONDS = 0.5  # a job this long stops the prefetch for SLOW_MEMORY_SECONDS
SLOW_MEMORY_SECONDS = 60.0
MAX_CLAIM = 200  # most jobs held at once
HOUSEKEEPING_SECONDS = 60.0  # purge, undelivered alerts, forgotten worker rows
PRESENCE_SECONDS = 0.9  # at most one write to scheduler_workers per this many seconds (each poll)
FORGET_WORKERS_AFTER = timedelta(hours=1)
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0
START_ATTEMPTS = 5  # a transient database error at start-up is retried (0.5 + 1 + 2 + 4 s)
MAX_TICK_OFFSET = 0.05  # seconds: the spread of the workers' tick offsets (see tick_offset)
CANCEL_WAIT_SECONDS = 10.0  # after the grace: how long cancelled async jobs get to record
CANCEL_LOOK_SECONDS = 1.0  # look for operators' cancels of running jobs at most this often
CANCEL_LOOK_AFTER = 0.5  # only for attempts running at least this long (no read for short jobs)


def import_handlers(modules: Iterable[str], folder: str | None = None) -> None:
    """Import the modules that register handlers; the current directory is importable, and
    ``folder`` (the config file's, where a project keeps its handler modules) first."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    if folder is not None and os.path.abspath(folder) not in sys.path:
        sys.path.insert(0, os.path.abspath(folder))
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"cannot import {name!r} from [worker] imports: {exc}") from exc


def tick_offset(worker_id: str, interval: float) -> float:
    """This worker's offset past the tick grid, in [0, min(interval / 10, 50 ms)).

    Ticks fall on the wall clock's multiples of ``tick_interval`` (cron slots sit on whole
    seconds, so a slot waits for the next tick only as long as the offset and the tick take).
    Workers would all tick at the same instant and race for the same rows; a stable offset per
    worker id spreads them, so one usually has dispatched a row before the next looks at it.
    """
    spread = min(interval / 10, MAX_TICK_OFFSET)
    return zlib.crc32(worker_id.encode()) / 2**32 * spread


def until_next_tick(wall: float, interval: float, offset: float) -> float:
    """Seconds from wall-clock time `wall` to the next tick, in (0, interval]."""
    ticks = (wall - offset) // interval + 1
    return max(ticks * interval + offset - wall, 0.0) or interval


def _log(level: int, action: str, message: str, *args: Any, **fields: Any) -> None:
    log.log(level, message, *args, extra={"action": action, **fields})


class WorkerResult(NamedTuple):
    handled: int  # runs (job attempts) this worker took to an outcome
    left_running: int  # jobs still running when the shutdown grace ran out


class Shared:
    """The threads of a worker process that serves several shards (``[database] shards``): one
    pool for the jobs of every shard's :class:`Worker`, and the count of the jobs they hold on
    it, so that together they hold no more jobs than one Worker of those threads would (its
    capacity, the prefetch included). Which shard's Worker claims a free place is whichever
    looks first; one that found none free is woken when a place comes back."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.pool = ThreadPoolExecutor(max(threads, 1), thread_name_prefix="scheduler-job")
        self._lock = threading.Lock()
        self._held = 0  # the jobs on the pool's threads, or waiting for one, of every shard
        self._starved: set[Worker] = set()

    def reserve(self, worker: Worker, wanted: int, capacity: int) -> int:
        """Up to `wanted` places for `worker`'s claim, within `capacity` for all together
        (given back with :meth:`unreserve` once the claimed jobs are counted by :meth:`hold`)."""
        with self._lock:
            granted = max(min(wanted, capacity - self._held), 0)
            self._held += granted
            if granted < wanted:
                self._starved.add(worker)
            return granted

    def free_threads(self, reserved: int) -> int:
        """The threads no job holds, a claim's own `reserved` places counted as free."""
        with self._lock:
            return max(self.threads - (self._held - reserved), 0)

    def unreserve(self, count: int) -> None:
        """A claim's reserved places back (those its jobs took were counted by :meth:`hold`):
        wake the Workers that found none free while the claim held them, since it may have
        taken fewer jobs than it reserved (they would otherwise wait for their poll)."""
        self._given_back(count)

    def hold(self, count: int) -> None:
        with self._lock:
            self._held += count

    def release(self) -> None:
        """A job left its place: wake the Workers that found none free."""
        self._given_back(1)

    def _given_back(self, count: int) -> None:
        """`count` places free again: wake the Workers that found none free."""
        with self._lock:
            self._held -= count
            starved, self._starved = self._starved, set()
        for worker in starved:
            worker._wake.set()


class Worker:
    """Runs ``app``'s tick and jobs until :meth:`stop` (or SIGTERM/SIGINT), or for one round."""

    def __init__(
        self,
        app: Host,
        *,
        concurrency: int | None = None,
        settings: WorkerSettings | None = None,
        serve_metrics: bool = True,
        shared: Shared | None = None,
    ) -> None:
        """``settings``: the worker's (default: ``app.worker_settings``); ``serve_metrics``:
        listen on ``[metrics] port`` (off for a worker inside a web process, where every
        process would bind it); ``shared``: the threads it shares with the Workers of other
        shards in this process."""
        self.app = app
        self._shared = shared
        self.settings = settings = settings or app.worker_settings
        self.concurrency = settings.concurrency if concurrency is None else concurrency
        self.async_concurrency = settings.async_concurrency
        self.runner = app.runner(settings)
        self._serve_metrics = serve_metrics
        #: Set once the worker has started (schema checked, registered): it runs from then on.
        self.started = threading.Event()
        self._events: EventLoop | None = None  # started by run() when async handlers exist
        self._async_names: frozenset[str] = frozenset()
        self._sync_handlers = True  # any sync handler registered (else claim async only)
        self._async: set[int] = set()  # the running jobs that run on the loop
        self._awaiting: set[int] = set()  # those whose handler has not returned yet
        # The claiming thread is woken once per batch of outcomes written, not per job.
        self._recorder = Recorder(self.runner, after=self._slots_freed)
        self._telemetry = Telemetry(app)
        self._running: dict[int, Future[None] | None] = {}  # None: on the event loop
        self._waiter: _wakeup.Waiter | None = None  # set when wake-ups are heard
        self._heard = -1  # the waiter's wake-ups seen so far
        # Something may be ready besides what ending attempts hand on (a wake-up, the poll, a
        # tick): the next claim looks for jobs under no limit (_note_news).
        self._news = True
        self._plain_at = float("-inf")  # time.monotonic() of the last claim under no limit
        self._pool: ThreadPoolExecutor | None = None  # run()'s, for the jobs handed places
        # The running jobs whose outcome is handed to the recorder: written at any moment now.
        self._handed_in: set[int] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()  # a job finished, or stop() was called
        self._beat_stop = threading.Event()
        self._tick_stop = threading.Event()  # set when the worker stops: the tick thread ends
        self._stopping = self._force = False
        self._signals = self._handled = 0
        self._touched = float("-inf")
        self._ticked_at: datetime | None = None
        self._avg_seconds: float | None = None  # moving average of handler run time
        self._slow_at = float("-inf")  # when a job last took SLOW_JOB_SECONDS or more
        self._listening: _wakeup.Listening | None = None  # wake-ups (scheduler/_store/wakeup/)
        self._next_takeover = float("-inf")  # time.monotonic() of the next look for expiries
        # The running attempts: job id -> (job, its Stop), until the handler returns.
        self._stops: dict[int, tuple[Job, Stop]] = {}
        self._next_cancel_look = float("-inf")  # time.monotonic() of the next look for cancels
        # Attempts fenced after their stop whose handler has not returned: Stop -> on the loop.
        self._stuck: dict[Stop, bool] = {}
        self._stuck_threads = 0  # those of them on a thread (not on the loop)
        self._timeouts: dict[str, float] = {}  # the handlers' with a timeout (read at start)
        self._stopper_wake = threading.Event()  # an attempt with a deadline started, or stop
        # The worker's queues less the paused ones, learnt at each write of its presence.
        self._queues: tuple[str, ...] = tuple(self.runner.queues)
        self._paused: frozenset[str] = frozenset()

    def run(self, *, once: bool = False, install_signals: bool = False) -> WorkerResult:
        """Work until stopped; with ``once``: take over, tick, run what is ready, return."""
        self._start_up(self.app.check_schema)
        self._start_up(self._record_handlers)
        if self._serve_metrics:
            self._telemetry.open()
        self._start_up(lambda: self._touch(force=True))
        if self.concurrency > 0:  # process isolation's fork server, its imports made now
            self._start_up(lambda: self.runner.prepare_isolation(start=True))
        self._start_loop()
        if not once and self.concurrency > 0:
            self._listen()
        self.started.set()
        started = f"worker {self.app.worker_id} started (concurrency {self.concurrency}"
        if self._events is not None:
            started += f", async_concurrency {self.async_concurrency} on the event loop"
        if self._listening is not None:
            started += f", wake-ups: {_wakeup.describe(self._listening)}"
        _log(logging.INFO, "worker_started", started + ")")
        previous = self._install_signals() if install_signals else {}
        pool = (
            self._shared.pool
            if self._shared is not None
            else ThreadPoolExecutor(max(self.concurrency, 1), thread_name_prefix="scheduler-job")
        )
        self._pool = pool
        if self.concurrency > 0 and self.runner.limits:
            self.runner.successors = self  # ending attempts hand their places on (hand_on_queues)
            self.runner.full_retry = LIMITS_FULL_SECONDS
        beat = threading.Thread(target=self._heartbeat, name="scheduler-heartbeat", daemon=True)
        beat.start()
        # Asks attempts to stop (timeouts, cancels) and fences them; only where jobs are run.
        stopper = threading.Thread(target=self._stopper, name="scheduler-stopper", daemon=True)
        if self.concurrency > 0:
            stopper.start()
        try:
            if once:
                self._once(pool)
            else:
                self._serve(pool)
        finally:
            self.runner.successors = None  # what ends from now on gives its places back
            left = self._drain()
            self._recorder.close()
            self._beat_stop.set()
            self._stopper_wake.set()
            beat.join()
            if stopper.is_alive():
                stopper.join()
            stuck = self.stuck_threads()
            if stuck:
                text = f"shutdown: {stuck} attempt(s) still running past their stop, left behind"
                _log(logging.WARNING, "jobs_left_stuck", text)
            if self._shared is None:  # a shared pool: shut down by its owner, once all end
                pool.shutdown(wait=not (left or stuck), cancel_futures=True)
            if self._events is not None:
                self._events.close()
            if self._listening is not None:
                self._listening.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._keep_tick_on_record()
            self._unregister()
            self._telemetry.close()
        return WorkerResult(self._handled, left)

    def _start_up(self, step: Any) -> None:
        """Run a start-up `step`, again after a back-off on a transient database error (a
        connection cut at that moment), up to ``START_ATTEMPTS`` times in all."""
        backoff = Backoff(BACKOFF_MIN, BACKOFF_MAX)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                step()
                return
            except Exception as exc:
                if not is_transient(exc) or attempt == START_ATTEMPTS:
                    raise
                wait = backoff.next()
                self._log_error("starting", exc, wait)
                time.sleep(wait)

    def _start_loop(self) -> None:
        """The event loop thread, if any handler is ``async def`` (and jobs are run at all);
        the handlers' timeouts, read once here as the async handlers' names are."""
        registry = self.app.registry
        for name in registry.names():
            handler = registry.get(name)
            if handler is not None and handler.timeout:
                self._timeouts[name] = handler.timeout
        self._async_names = registry.async_names()
        self._sync_handlers = len(self._async_names) < len(registry.names())
        if self._async_names and self.concurrency > 0:
            self._events = EventLoop()
            self.runner.coroutine_runner = self._events.run  # async hooks of sync handlers

    def _listen(self) -> None:
        """Hear of new jobs at once (scheduler/_store/wakeup/): each wake-up sets ``_wake``, as a
        finished job does; the poll below stays as the safety net."""
        waiter = _wakeup.Waiter(self._wake, self.settings.queues, self.app.clock, self._has_free)
        try:
            self._listening = _wakeup.listen(self.app.store, waiter)
            self._waiter = waiter
        except Exception as exc:  # never a reason not to work: the poll finds the jobs
            self._log_error("starting wake-ups", exc, None)

    def _has_free(self) -> bool:
        """Whether a claim now could take a job (a slot of either kind is free)."""
        if self._stopping:
            return False
        with self._lock:
            running_async, awaiting = len(self._async), len(self._awaiting)
            sync_free = self._sync_free(running_async)
        if self._events is not None:
            limit = self.async_concurrency
            if min(limit - awaiting, 2 * limit - running_async) > 0:
                return True
            if not self._sync_handlers:
                return False
        return sync_free > 0

    def _sync_free(self, running_async: int) -> int:
        """Free slots for jobs run on the threads (under ``_lock``). A slot is free once its
        handler returned: its outcome waits for the recorder (the job still held, its lease
        renewed), up to as many again as the capacity, so that the next claim need not wait
        for the recorder's commit, nor the recorder for the claim. The async slots of
        ``_fill`` work the same way."""
        capacity = self._capacity()
        handed_in = self._handed_in
        if self._async:
            handed_in = handed_in - self._async
        held = len(self._running) - running_async
        return min(capacity - (held - len(handed_in)), 2 * capacity - held)

    def _keep_tick_on_record(self) -> None:
        """The worker's last tick stays on record after it stops (its own row goes), as
        ``scheduler tick``'s does (one entry per host, ``HOST:tick``): ``status`` shows when
        the schedule last ticked, and a ``--once`` run from cron(8) or a timer counts."""
        if self._ticked_at is None:
            return
        try:
            _health.record_tick(
                self.app.store,
                self.app.clock(),
                self._ticked_at,
                clock_offset=self.app.clock_offset(),
            )
        except Exception as exc:
            self._log_error("recording the tick", exc, None)

    def stop(self, force: bool = False) -> None:
        """Stop claiming (thread-safe); ``force`` also cuts the shutdown grace short."""
        self._force = self._force or force
        self._stopping = True
        self._tick_stop.set()
        self._wake.set()

    def _serve(self, pool: ThreadPoolExecutor) -> None:
        # The tick runs on its own thread: claiming never waits behind a long tick, nor a
        # tick behind a claim (each takes its own pooled connection).
        ticker = threading.Thread(target=self._ticker, name="scheduler-tick", daemon=True)
        ticker.start()
        next_housekeeping = time.monotonic()
        backoff = Backoff(BACKOFF_MIN, BACKOFF_MAX)
        try:
            while not self._stopping:
                self._wake.clear()
                try:
                    self._touch()  # first: the paused queues come back with it
                    self._fill(pool)
                    if time.monotonic() >= next_housekeeping:
                        next_housekeeping = time.monotonic() + HOUSEKEEPING_SECONDS
                        self._housekeeping()
                    backoff.reset()
                except Exception as exc:
                    wait = backoff.next()
                    self._log_error("worker loop", exc, wait)
                    self._wake.wait(wait)
                    continue
                held = self.runner.limits_pending  # a limit was full: look again soon
                woke = self._wake.wait(LIMITS_RETRY_SECONDS if held else POLL_SECONDS)
                if woke:
                    self.runner.poke_limits()  # a wake-up or a finished job: look under limits
                self._note_news(woke)
        finally:
            self._tick_stop.set()
            ticker.join()

    def _note_news(self, woke: bool) -> None:
        """Whether the next claim looks for jobs under no limit: always, unless limits are
        configured and wake-ups are heard; then after the poll's wait, a wake-up, or a tick
        that dispatched, and not when the loop was woken only by its own jobs ending (under
        limits, ending attempts hand their places on: a plain claim at each ending, with no
        job under no limit ready, would be a statement for nothing)."""
        waiter = self._waiter
        heard = waiter.wakes if waiter is not None else -1
        if not woke or waiter is None or heard != self._heard or not self.runner.limits:
            self._news = True
        elif time.monotonic() - self._plain_at >= POLL_SECONDS:
            self._news = True  # as at the poll, were a wake-up lost: busy loops never time out
        self._heard = heard

    def _ticker(self) -> None:
        """Tick on the grid until the worker stops; a failing tick backs off, the jobs go on."""
        interval = self.app.settings.tick_interval
        offset = tick_offset(self.app.worker_id, interval)
        backoff = Backoff(BACKOFF_MIN, BACKOFF_MAX)
        wait = 0.0
        while not self._tick_stop.wait(wait):
            try:
                if self._tick():
                    self._news = True
                    self._wake.set()  # jobs were dispatched: claim them now
                # The next tick on the grid (after this one: a tick longer than the interval
                # skips the grid points it overran).
                wall = self.app.clock().timestamp()  # the grid of the clock that decides
                wait = until_next_tick(wall, interval, offset)
                backoff.reset()
            except Exception as exc:
                wait = backoff.next()
                self._log_error("tick", exc, wait)

    def _once(self, pool: ThreadPoolExecutor) -> None:
        self._tick()
        while not self._stopping and self.concurrency > 0:  # 0: tick only, run no jobs
            self._wake.clear()
            self.runner.poke_limits()
            submitted = self._fill(pool)
            with self._lock:
                # Done only when a fill looked and found nothing: short jobs can finish (and
                # leave _running) before this check while more wait in the queue.
                if submitted == 0 and not self._running:
                    break
            if not submitted:
                self._wake.wait(POLL_SECONDS)
        self._housekeeping()

    def _tick(self) -> bool:
        """One tick; True if it dispatched or reran a job."""
        began = time.monotonic()
        report = self.app.tick(record=False)  # recorded by _touch, with the worker's presence
        self._telemetry.ticked(time.monotonic() - began, report)
        self._ticked_at = self.app.clock()
        for outcome, names in report.as_dict().items():
            if names:  # holds and lost races repeat every tick: debug only
                quiet = outcome in ("held_back", "lost_race", "locked")
                level = logging.DEBUG if quiet else logging.INFO
                text = ", ".join(names)
                _log(level, f"tick_{outcome}", "tick: %s %s", outcome, text, rows=names)
        return bool(report.dispatched or report.rerun)

    def _capacity(self) -> int:
        """How many jobs to hold at once: the threads, plus a prefetch while jobs are short.

        Short jobs are claimed (and their outcomes written) several per statement. A job held
        beyond the threads waits for one of them while another worker may sit idle, so the
        average is not enough: one job of ``SLOW_JOB_SECONDS`` or more (a long job among short
        ones, or short jobs turning long) stops the prefetch for ``SLOW_MEMORY_SECONDS``
        (benchmarks/worker_split.py, ``short-then-long``). Not any job over the average's
        bound: on a busy host a no-op job's wall time can reach it, and a worker whose
        prefetch went off at each such spike would claim four times as often.
        """
        threads = max(self.concurrency - self._stuck_threads, 0)  # less the hung ones
        avg = self._avg_seconds
        if avg is not None and avg < SHORT_JOB_SECONDS and not self._slow_lately():
            return min(threads * PREFETCH_FACTOR, MAX_CLAIM)
        return threads

    def stuck_threads(self) -> int:
        """How many threads run an attempt that was fenced after its stop (they are not used
        until it returns)."""
        return self._stuck_threads

    def _slow_lately(self) -> bool:
        return time.monotonic() - self._slow_at < SLOW_MEMORY_SECONDS

    def _fill(self, pool: ThreadPoolExecutor) -> int | None:
        """Take over stopped jobs first, then claim ready ones up to capacity; return how
        many jobs were handed to the threads and the loop (None: no free slot, nothing
        looked for).

        With async handlers, the sync and the async jobs each have their own free slots: the
        claim asks for the async handlers' jobs and for the others separately (one claim when
        only one kind is registered), so neither kind is claimed to wait behind the other."""
        with self._lock:
            running_async, awaiting = len(self._async), len(self._awaiting)
            sync_free = self._sync_free(running_async)
        # An async slot is free once its handler returned (its outcome waits for the
        # recorder, its lease still renewed), up to as many again waiting to be written.
        loop_free = 0
        if self._events is not None:
            limit = self.async_concurrency
            loop_free = min(limit - awaiting, 2 * limit - running_async)
        if self._events is not None and not self._sync_handlers:
            sync_free = 0  # every known handler is async: the threads only see unknown ones
        sync_free, loop_free = max(sync_free, 0), max(loop_free, 0)
        shared, reserved = self._shared, 0
        if shared is not None and sync_free > 0 and not self._stopping:
            reserved = sync_free = shared.reserve(self, sync_free, self._capacity())
        try:
            return self._fill_places(pool, sync_free, loop_free, reserved)
        finally:
            if reserved:
                shared.unreserve(reserved)  # type: ignore[union-attr]

    def _fill_places(
        self, pool: ThreadPoolExecutor, sync_free: int, loop_free: int, reserved: int
    ) -> int | None:
        """:meth:`_fill` with the free places known (`reserved` of them in :class:`Shared`)."""
        free = sync_free + loop_free
        if free <= 0 or self._stopping:
            return None
        # Its queues less the paused ones (``scheduler pause``): the paused set comes back with
        # each write of its presence (_touch, before each claim, at most every
        # PRESENCE_SECONDS), so a pause is honoured within about a second at no statement of
        # its own. A failed write keeps the last set.
        queues = self._queues
        taken = self._take_over(free, queues)
        self._submit(pool, taken)  # before claiming: a failed claim must not strand them
        on_loop = sum(1 for job in taken if self._on_loop(job))
        sync_free -= len(taken) - on_loop
        loop_free -= on_loop
        # Jobs under limits are never prefetched: they hold their place from the claim.
        threads = max(self.concurrency - self._stuck_threads, 0)
        with self._lock:
            sync_threads = max(threads - (len(self._running) - len(self._async)), 0)
        sync_threads = min(sync_threads, sync_free)
        if self._shared is not None:  # the threads of every shard's Worker
            sync_threads = min(sync_threads, self._shared.free_threads(reserved))
        claimed: list[Job] = []
        unlooked = False  # a kind of job not looked for (no free slot): not "found nothing"
        if self._events is None or not self._async_names:
            if sync_free > 0:
                if self._news:
                    self._plain_at = time.monotonic()
                claimed = self.runner.claim(
                    sync_free, limited=sync_threads, queues=queues, plain=self._news
                )
                if self.runner.plain_short:
                    self._news = False  # none left under no limit: until news comes
        elif not self._sync_handlers:
            if loop_free > 0:
                claimed = self.runner.claim(loop_free, queues=queues)
        else:
            names = self._async_names
            unlooked = loop_free <= 0 or sync_free <= 0
            if loop_free > 0:
                claimed += self.runner.claim(loop_free, handlers=names, queues=queues)
            if sync_free > 0:
                claimed += self.runner.claim(
                    sync_free, handlers=names, exclude=True, limited=sync_threads, queues=queues
                )
        self._submit(pool, claimed)
        handed = len(taken) + len(claimed)
        return None if unlooked and not handed else handed

    def _take_over(self, free: int, queues: tuple[str, ...]) -> list[Job]:
        """Jobs of stopped workers to run again: looked for at most once per ``POLL_SECONDS``
        (a lease that expired is found within it, as at the poll), so that a claim woken by a
        new job, or by a finished one, does not wait for that read first."""
        now = time.monotonic()
        if now < self._next_takeover:
            return []
        self._next_takeover = now + POLL_SECONDS * 0.9  # the next poll finds it due
        return self.runner.take_over(limit=free, queues=queues)

    def _paused_changed(self, paused: frozenset[str]) -> None:
        if paused == self._paused:
            return
        mine = self.runner.queues
        now_paused = sorted((paused - self._paused) & set(mine))
        resumed = sorted((self._paused - paused) & set(mine))
        self._paused = paused
        self._queues = tuple(q for q in mine if q not in paused)
        if now_paused:
            text = f"queue(s) {', '.join(now_paused)} paused: claiming nothing from them"
            _log(logging.INFO, "queues_paused", text, queues=now_paused)
        if resumed:
            text = f"queue(s) {', '.join(resumed)} resumed"
            _log(logging.INFO, "queues_resumed", text, queues=resumed)

    def hand_on_queues(self) -> tuple[str, ...] | None:
        """Where the jobs that ending attempts hand their places under limits to come from
        (the runner's ``Successors``): the open queues, none once stopping."""
        return None if self._stopping else self._queues

    def take_handed(self, jobs: list[Job]) -> None:
        """Run jobs claimed into the places of attempts that just ended (the recorder's
        thread, before those attempts' slots are freed: the threads they used run these)."""
        try:
            assert self._pool is not None  # set before the runner is told of this worker
            self._submit(self._pool, jobs)
        except RuntimeError:  # the pool shut down meanwhile: left to their leases
            _log(logging.WARNING, "handed_after_stop", f"job(s) {[j.id for j in jobs]} left")

    def _on_loop(self, job: Job) -> bool:
        return self._events is not None and job.handler in self._async_names

    def _limits(self, jobs: list[Job]) -> dict[int, float | None]:
        """Each job's timeout: its task's ``timeout`` when the task has one (0: none), else
        its handler's. The tasks' are read at the claim (one statement, only when jobs of
        tasks were claimed); should that read fail, the handlers' apply this time."""
        timeouts = self._timeouts
        limits = {job.id: timeouts.get(job.handler) for job in jobs}
        names = [job.task_name for job in jobs if job.task_name is not None]
        if not names:
            return limits
        try:
            tasks = self.runner.task_timeouts(names)
        except Exception as exc:  # the jobs are claimed: they run, with their handlers' limits
            self._log_error("reading the tasks' timeouts", exc, None)
            return limits
        for job in jobs:
            if job.task_name in tasks:
                limits[job.id] = tasks[job.task_name] or None
        return limits

    def _submit(self, pool: ThreadPoolExecutor, jobs: list[Job]) -> None:
        limits = self._limits(jobs) if jobs else {}
        for job in jobs:
            # Every attempt can be stopped (an operator's cancel); some have a timeout.
            stop = Stop(limits.get(job.id))
            with self._lock:
                self._stops[job.id] = (job, stop)
                if self._events is not None and self._on_loop(job):
                    self._async.add(job.id)
                    self._awaiting.add(job.id)
                    self._running[job.id] = None
                    unstarted = functools.partial(self._release, job.id, ran=False)
                    self._events.start_job(job, self._run_async_job(job, stop), unstarted)
                else:
                    self._running[job.id] = pool.submit(self._run_job, job, stop)
                    if self._shared is not None:
                        self._shared.hold(1)

    # -- stopping attempts: timeouts and cancels, then the fence ------------------------
    def _stopper(self) -> None:
        """Ask attempts to stop (past their timeout, or cancelled by an operator); fence those
        still running after ``cancel_grace``. Wakes at the next deadline, at least once a
        second, and then looks for cancels of the attempts running for
        ``CANCEL_LOOK_AFTER`` seconds or more (no statement while none runs that long)."""
        while not self._beat_stop.is_set():
            self._stopper_wake.clear()
            now = time.monotonic()
            try:
                next_at = self._enforce(now)
            except Exception as exc:  # never let the stopper die: the next pass tries again
                self._log_error("stopping jobs", exc, 1.0)
                next_at = None
            wait = 1.0 if next_at is None else min(max(next_at - now, 0.01), 1.0)
            self._stopper_wake.wait(wait)

    def _enforce(self, now: float) -> float | None:
        """One pass over the running attempts; returns when the next deadline is due."""
        grace = self.settings.cancel_grace
        timed_out: list[tuple[Job, float]] = []
        to_fence: list[tuple[Job, Stop]] = []
        watched: list[int] = []  # running long enough to look for a cancel
        next_at: float | None = None
        with self._lock:
            for job, stop in self._stops.values():
                if stop.returned or stop.began is None:
                    continue
                if not stop.requested and now - stop.began >= CANCEL_LOOK_AFTER:
                    watched.append(job.id)
                if stop.deadline is None:
                    continue
                if not stop.requested:
                    if now >= stop.deadline:
                        stop.request(TIMEOUT)
                        timed_out.append((job, stop.timeout or 0.0))
                    due = stop.deadline + (grace if now >= stop.deadline else 0)
                elif now >= stop.deadline + grace:
                    to_fence.append((job, stop))
                    continue
                else:
                    due = stop.deadline + grace
                next_at = due if next_at is None else min(next_at, due)
        for job, timeout in timed_out:
            text = f"job {job.id} ({job.handler}) ran past its timeout of {timeout:g}s: stopping it"
            _log(logging.WARNING, "job_timeout", text, job_id=job.id)
            self._ask(job)
        for job, stop in to_fence:
            self._fence(job, stop)
        if watched and now >= self._next_cancel_look:
            self._next_cancel_look = now + CANCEL_LOOK_SECONDS
            cancelled = self._cancelled(watched, now)
            if cancelled:
                due = now + grace
                next_at = due if next_at is None else min(next_at, due)
        return next_at

    def _cancelled(self, watched: list[int], now: float) -> bool:
        """Ask the attempts an operator cancelled to stop; True if any."""
        found = self.runner.cancels_requested(watched)
        asked: list[Job] = []
        with self._lock:
            for job_id in found:
                entry = self._stops.get(job_id)
                if entry is None or entry[1].requested or entry[1].returned:
                    continue
                entry[1].request(CANCELLED)
                entry[1].deadline = now  # the grace runs from here
                asked.append(entry[0])
        for job in asked:
            text = f"job {job.id} ({job.handler}) was cancelled by an operator: stopping it"
            _log(logging.WARNING, "job_cancel", text, job_id=job.id)
            self._ask(job)
        return bool(asked)

    def _ask(self, job: Job) -> None:
        """An async attempt is cancelled; a sync one sees ``job.cancel_requested``."""
        if self._events is not None and self._on_loop(job):
            self._events.cancel_job(job.id)

    def _fence(self, job: Job, stop: Stop) -> None:
        """The grace is over and the handler has not returned: write the attempt's end (code
        ``timeout`` or ``cancelled``) under the lease this worker still holds, which moves the
        job off this attempt; from now on the attempt's heartbeat raises and its outcome is
        discarded. A thread left running is counted (one thread fewer for jobs) until it
        returns."""
        handler = self.app.registry.get(job.handler)
        if handler is None:
            return  # no handler: nothing runs, the attempt ends at once
        with self._lock:
            if stop.returned or stop.fenced:
                return
            stop.fenced = True
            on_loop = job.id in self._async
            self._stuck[stop] = on_loop
            self._stuck_threads += not on_loop
            if self._stops.get(job.id, (None, None))[1] is stop:
                del self._stops[job.id]
            self._running.pop(job.id, None)  # no more heartbeats for it
            self._async.discard(job.id)
            self._awaiting.discard(job.id)
        ran = time.monotonic() - (stop.began or time.monotonic())
        started = self.runner.clock() - timedelta(seconds=ran)
        ending = self.runner.stopped(job, handler, started, stop.reason)
        text = (
            f"job {job.id} ({job.handler}) still running {self.settings.cancel_grace:g}s after"
            f" its stop: its attempt is over ({ending.result}, code {ending.code})"
        )
        if not on_loop:
            text += "; its thread is not used until it returns"
        _log(logging.ERROR, "job_fenced", text, job_id=job.id)

        def done(result: str) -> None:
            with self._lock:
                self._handled += 1
            text = f"job {job.id} ({job.handler}) {result} ({ending.code}, fenced)"
            _log(logging.INFO, "job_done", text)
            self._wake.set()

        self._recorder.submit(ending, done)

    def _returned(self, job: Job, stop: Stop | None) -> bool:
        """The handler of ``job`` came back: False if its attempt was fenced meanwhile (its
        outcome is discarded, its thread counted free again)."""
        if stop is None:
            return True
        with self._lock:
            stop.returned = True
            if self._stops.get(job.id, (None, None))[1] is stop:
                del self._stops[job.id]
            if not stop.fenced:
                return True
            if self._stuck.pop(stop, True) is False:
                self._stuck_threads -= 1
        text = f"job {job.id} ({job.handler}) returned after its stop; its outcome is discarded"
        _log(logging.WARNING, "job_returned_late", text, job_id=job.id)
        self._wake.set()
        if self._listening is not None:
            self._listening.slot_freed()
        return False

    async def _run_async_job(self, job: Job, stop: Stop | None = None) -> None:
        began = time.monotonic()
        if stop is not None:
            stop.begin()
            if stop.deadline is not None:  # the stopper wakes at it (cancels: once a second)
                self._stopper_wake.set()
        try:
            with self._telemetry.running(job) as run:
                outcome = await self.runner.execute_async(job, stop)
                run.ended(outcome)
        except Exception:
            if self._returned(job, stop):
                self._crashed(job)
            return
        if not self._returned(job, stop):
            return
        with self._lock:
            self._awaiting.discard(job.id)
        self._wake.set()  # a slot is free: the main thread may claim
        self._hand_in(job, outcome, began)

    def _crashed(self, job: Job) -> None:
        """The run itself failed (not the handler: its errors are outcomes)."""
        log.exception(
            "job %s (%s) could not be run; its lease will expire",
            job.id,
            job.handler,
            extra={"action": "job_crashed", "job_id": job.id},
        )
        self._release(job.id)

    def _hand_in(self, job: Job, outcome: Ending, began: float) -> None:
        with self._lock:
            self._handed_in.add(job.id)
            # The jobs whose handler has not returned: when they fall to the threads' number,
            # the claiming thread is woken (once), so that the next claim runs while the
            # recorder writes these outcomes, and the threads have jobs when they are done.
            # Without it, the claim waited for the recorder's wake-up: claim, run, write, in
            # turn, with the threads idle for two round trips per claim.
            unreturned = len(self._running) - len(self._handed_in)
        self._recorder.submit(outcome, self._when_recorded(job, began))
        if unreturned == self.concurrency:
            self._wake.set()

    def _when_recorded(self, job: Job, began: float) -> Callable[[str], None]:
        def done(result: str) -> None:
            took = time.monotonic() - began
            if log.isEnabledFor(logging.INFO):
                text = f"job {job.id} ({job.handler}) {result} in {took:.2f}s"
                _log(logging.INFO, "job_done", text)
            self._release(job.id, wake=False)  # the recorder wakes once per batch

        return done

    def _run_job(self, job: Job, stop: Stop | None = None) -> None:
        began = time.monotonic()
        if stop is not None:
            stop.begin()
            if stop.deadline is not None:  # the stopper wakes at it (cancels: once a second)
                self._stopper_wake.set()
        try:
            if self._telemetry.quiet():
                outcome = self.runner.execute(job, stop)
            else:
                with self._telemetry.running(job) as run:
                    outcome = self.runner.execute(job, stop)
                    run.ended(outcome)
        except Exception:
            if self._returned(job, stop):
                self._crashed(job)
            return
        if not self._returned(job, stop):
            return

        ran = time.monotonic() - began
        avg = self._avg_seconds
        self._avg_seconds = ran if avg is None else avg + 0.1 * (ran - avg)
        if ran >= SLOW_JOB_SECONDS:
            self._slow_at = time.monotonic()
        # The job stays in _running (leases renewed, slot taken) until its outcome is written.
        self._hand_in(job, outcome, began)

    def _release(self, job_id: int, ran: bool = True, *, wake: bool = True) -> None:
        """The job left its slot. ``wake=False``: the caller wakes the claiming thread
        itself (:meth:`_slots_freed`, once for several jobs)."""
        with self._lock:
            self._handled += ran
            held_on_thread = job_id in self._running and job_id not in self._async
            self._running.pop(job_id, None)
            self._handed_in.discard(job_id)
            self._async.discard(job_id)
            self._awaiting.discard(job_id)
            if not ran:  # cancelled before its coroutine ran: nothing else removes it
                self._stops.pop(job_id, None)
        if held_on_thread and self._shared is not None:
            self._shared.release()
        if wake:
            self._slots_freed()

    def _slots_freed(self) -> None:
        """Slots came free: the claiming thread (and the wake-up listener) look again. An
        ``Event.set`` that wakes a waiting thread is a system call; the recorder calls this
        once per batch of outcomes."""
        self._wake.set()
        if self._listening is not None:
            self._listening.slot_freed()

    def _housekeeping(self) -> None:
        if purged := self.app.purge():
            _log(logging.INFO, "purged", "purged %s old job(s)", purged)
        self.app.deliver_pending_alerts()
        self.app.known_handlers.load_all()
        _health.forget(self.app.store, seen_before=self.app.clock() - FORGET_WORKERS_AFTER)

    def _heartbeat(self) -> None:
        period = max(self.settings.lease_seconds / 3, 0.5)
        wait = period
        while not self._beat_stop.wait(wait):
            wait = period
            with self._lock:
                ids = list(self._running)
            try:
                held = self.runner.extend(ids) if ids else 0
            except Exception as exc:
                self._log_error("extending leases", exc, 1.0)
                wait = 1.0
                continue
            if held < len(ids) and (lost := self._lost_leases(ids)):
                text = f"{lost} of {len(ids)} running job(s) lost their lease"
                _log(logging.WARNING, "leases_lost", text)

    def _lost_leases(self, ids: list[int]) -> int:
        """How many of ``ids`` lost their lease, after an extension that did not renew them
        all. A job whose outcome the recorder wrote since is not lost: its write ended the lease
        (and may have committed just before the extension, before the job left ``_running``).
        So the leases are read again, then counted among the jobs still running whose outcome
        was not handed in by then: handed in only after that read, the outcome was not written
        before it, and a lease that read did not find is lost indeed."""
        try:
            held = self.runner.holding(ids)
        except Exception as exc:
            self._log_error("reading leases", exc, 1.0)
            return 0
        with self._lock:
            return sum(
                1
                for job_id in ids
                if job_id in self._running and job_id not in self._handed_in and job_id not in held
            )

    def _drain(self) -> int:
        """Wait for running jobs within the grace; then cancel the async ones and give them
        ``CANCEL_WAIT_SECONDS`` to record that; return how many are still running."""
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        cancelled_at: float | None = None
        while True:
            self._wake.clear()
            with self._lock:
                running = sorted(self._running)
                on_loop = sorted(self._async)
            now = time.monotonic()
            over = now >= deadline or self._force
            if over and on_loop and cancelled_at is None and self._events is not None:
                text = f"shutdown: cancelling async job(s) {on_loop} (grace over)"
                _log(logging.WARNING, "jobs_cancelled", text, job_ids=on_loop)
                self._events.cancel_jobs()
                cancelled_at = now
                continue
            waiting_cancelled = (
                cancelled_at is not None and on_loop and now < cancelled_at + CANCEL_WAIT_SECONDS
            )
            if over and not waiting_cancelled:
                if running:
                    left = f"shutdown: job(s) {running} still running, left to lease expiry"
                    _log(logging.WARNING, "jobs_left_running", left, job_ids=running)
                return len(running)
            if not running:
                return 0
            wait = (cancelled_at + CANCEL_WAIT_SECONDS) - now if cancelled_at else deadline - now
            self._wake.wait(min(max(wait, 0.01), 1.0))

    def _install_signals(self) -> dict[int, Any]:
        def handle(signum: int, _frame: FrameType | None) -> None:
            self._signals += 1
            # Event.set and logging take locks the interrupted main thread may hold: a
            # short-lived thread does both.
            args = (signum, self._signals > 1)
            threading.Thread(target=self._on_signal, args=args, daemon=True).start()

        return {signum: signal.signal(signum, handle) for signum in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(self, signum: int, force: bool) -> None:
        doing = "not waiting for running jobs" if force else "stopping after the running jobs"
        _log(logging.INFO, "worker_stopping", "%s: %s", signal.Signals(signum).name, doing)
        self.stop(force)

    def _record_handlers(self) -> None:
        """Write this process's handlers and their settings for every other process (one
        statement), so that an ``enqueue`` where they are not registered uses them."""
        app = self.app
        _handlers.record(
            app.store, app.registry.settings(), now=app.clock(), worker_id=app.worker_id
        )
        app.known_handlers.load_all()  # the tick's jobs of handlers other workers registered

    def _touch(self, force: bool = False) -> None:
        if force or time.monotonic() - self._touched >= PRESENCE_SECONDS:
            app = self.app
            offset = app.clock_offset()
            runs = app.registry.names() if self.concurrency > 0 else []  # 0: it runs none
            seen = _health.touch(
                app.store,
                app.worker_id,
                app.clock(),
                self._ticked_at,
                clock_offset=offset,
                handlers=_handlers.names_text(runs),
                stuck=len(self._stuck),
                paused=True,
                probe=self.runner.limits_probe(self._queues) if self.concurrency > 0 else None,
            )
            self._touched = time.monotonic()
            if seen is not None:
                self._paused_changed(seen.paused)
                if seen.ready_under_limits is not None:
                    self.runner.probed(seen.ready_under_limits)

    def _unregister(self) -> None:
        try:
            _health.forget(self.app.store, self.app.worker_id)
        except Exception as exc:
            self._log_error("unregistering", exc, None)
        stopped = f"worker {self.app.worker_id} stopped after {self._handled} run(s)"
        _log(logging.INFO, "worker_stopped", stopped)

    @staticmethod
    def _log_error(doing: str, exc: BaseException, retry_in: float | None) -> None:
        then = f"; retrying in {retry_in:g}s" if retry_in is not None else ""
        if not is_transient(exc):
            log.error("error in %s%s", doing, then, exc_info=exc, extra={"action": "worker_error"})
            return
        lines = str(getattr(exc, "orig", None) or exc).strip().splitlines() or [repr(exc)]
        _log(logging.WARNING, "database_error", "database error in %s: %s%s", doing, lines[0], then)
