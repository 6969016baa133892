"""Running jobs: take over stopped work first, claim, call the handler, record the outcome.

A handler may be ``async def``: :meth:`Runner.execute_async` awaits it (the worker on its event
loop, ``app.work()`` on the Scheduler's own loop). Either way the job being run is
:func:`current_job` (a context variable: each thread and each asyncio task sees its own), and
a job with a tenant runs inside the registry's tenant context (``@app.tenant_context``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any, Protocol

from .. import signals
from .._errors import Cancelled, LeaseLost, PermanentError, Snooze
from .._model.backoff import Backoff, delay_after
from .._model.ending import Ending
from .._model.handlers import Handler, Registry, error_code, is_async_callable
from .._model.job import Job, RecordedHook
from .._model.limits import LimitSet, Places, handed_on
from .._model.redact import error_message
from .._model.rules import ABORTED, CLAIMED, QUEUED, SUCCEEDED
from .._store import Connection, Store
from .._store import jobs as _jobs
from .._store import limits as _limits
from .._store import limits_pipeline as _limits_pipeline
from .._store import outcomes as _outcomes
from .._store import queues as _queues
from .._store import rows as _rows
from .._store import wakeup as _wakeup
from .._store.cursor import ClaimCursor
from .._store.retry import is_transient, retry
from . import isolation as _isolation

log = logging.getLogger(__name__)

RECORD_WITHIN = 0.5  # seconds a finished attempt may wait to be written with others
# While the database is away, recording outcomes is tried again after 0.2 s, doubling to 5 s.
RECORD_RETRY_FIRST, RECORD_RETRY_CAP = 0.2, 5.0

#: Stable codes of the outcomes the runner decides itself.
TENANT_CONTEXT_FAILED = "tenant_context_failed"  # the tenant's context did not enter
RETURNED_AWAITABLE = "handler_returned_awaitable"  # a sync handler returned a coroutine
WORKER_STOPPED = "worker_stopped"  # an async run cancelled at shutdown, after the grace
TIMEOUT = "timeout"  # the attempt ran past its handler's timeout
CANCELLED = "cancelled"  # an operator cancelled the running job

# A claim of jobs under limits runs when told there may be some (a wake-up, a finished job, a
# claim that found some), else at least this often: an idle worker's poll stays one claim.
LIMITED_POLL_SECONDS = 5.0
LIMITS_RETRY_SECONDS = 0.05  # how soon a worker held back by a limit looks again
# How soon a worker that found its limits full looks again when woken, unless it gave a place
# back meanwhile: the places of running attempts pass to the next jobs as they end (hand_on),
# so a look at each of its own jobs' endings would only queue on the limit's lock.
LIMITS_FULL_SECONDS = 0.1
LIMITS_PRUNE_SECONDS = 1.0  # how often a busy runner deletes the holds that count for nothing

CoroutineRunner = Callable[[Coroutine[Any, Any, Any]], Any]

_CURRENT: ContextVar[RunningJob | None] = ContextVar("scheduler_current_job", default=None)


def current_job() -> RunningJob | None:
    """The job whose handler is running here, or None outside a run.

    A context variable, never a thread-local: every worker thread and every asyncio task (an
    ``async def`` handler, and the tasks it creates, which copy its context) sees its own job.
    """
    return _CURRENT.get()


def finish_args(ending: Ending) -> _jobs.Finish:
    """What the store writes for one attempt's ending."""
    return _jobs.Finish(
        job=ending.job,
        state=ending.state,
        code=ending.code,
        run_code=ending.run_code,
        outcome=ending.result,
        retry_at=ending.retry_at,
        started_at=ending.started,
        message=ending.message,
        snoozed=ending.snoozed,
    )


class Stop:
    """The stop of one attempt, shared by the worker (which asks and fences) and the handler's
    :class:`RunningJob` (which sees it).

    ``deadline``: ``time.monotonic()`` at which the attempt is asked to stop, set when its
    handler starts (:meth:`begin`; None before, or without a limit). Once asked,
    ``requested`` is set; once the grace passed, ``fenced``: the worker wrote the attempt's
    end itself, and nothing the attempt does later is written (its heartbeat raises
    :class:`LeaseLost`, its outcome is discarded). ``returned``: the handler came back.
    """

    __slots__ = ("began", "deadline", "fenced", "reason", "requested", "returned", "timeout")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.began: float | None = None
        self.deadline: float | None = None
        self.requested = False
        self.reason: str | None = None  # TIMEOUT or CANCELLED
        self.fenced = False
        self.returned = False

    def begin(self) -> None:
        """The handler starts now: its timeout runs from here."""
        self.began = time.monotonic()
        if self.timeout:
            self.deadline = self.began + self.timeout

    def request(self, reason: str) -> None:
        if not self.requested:
            self.reason = reason
            self.requested = True


class RunningJob:
    """What a handler receives: the job's ``id``, ``handler``, ``payload``, ``attempt`` (from
    1), ``max_attempts``, ``task_name``, ``queue``, ``tenant`` and ``slot`` (the nominal cron
    instant, aware UTC, of a task's job, a backfilled one included; ``None`` for an enqueued
    job), ``fence`` (an integer that grows with every attempt, takeover and rerun in place of
    the job), :meth:`heartbeat`, :attr:`cancel_requested`, :meth:`check` and :meth:`complete`."""

    def __init__(
        self,
        job: Job,
        runner: Runner,
        stop: Stop | None = None,
        started: datetime | None = None,
    ) -> None:
        self.id: int = job.id
        self.handler: str = job.handler
        self.payload: dict[str, Any] = job.payload
        self.attempt: int = job.attempts
        self.max_attempts: int = job.max_attempts
        self.task_name: str | None = job.task_name
        self.queue: str = job.queue
        self.tenant: str | None = job.tenant
        self.slot: datetime | None = job.slot
        self.fence: int = job.fence
        self._job = job
        self._runner = runner
        self._stop = stop
        self._started = started
        self.completed = False

    def complete(self, *, connection: Any) -> None:
        """Record this attempt's success in ``connection``'s transaction (a SQLAlchemy
        ``Connection`` on the scheduler's database): the handler's writes in it and the job's
        outcome commit together or not at all, and the worker records nothing more for the
        attempt. Raises :class:`LeaseLost` once the attempt was fenced (taken over, stopped
        after its timeout or cancel, or its job rerun): nothing is written then."""
        if self._stop is not None and self._stop.fenced:
            raise LeaseLost()
        runner = self._runner
        now = runner.clock()
        if not _jobs.complete_fenced(
            connection,
            self._job,
            fence=self.fence,
            owner=runner.owner,
            now=now,
            started_at=self._started or now,
        ):
            raise LeaseLost()
        self.completed = True

    @property
    def cancel_requested(self) -> bool:
        """True once this attempt was asked to stop (its handler's ``timeout`` passed, or an
        operator cancelled the job)."""
        return self._stop is not None and self._stop.requested

    def check(self) -> None:
        """Raise :class:`Cancelled` if this attempt was asked to stop: call it between units
        of work (a sync handler cannot be interrupted otherwise)."""
        if self.cancel_requested:
            raise Cancelled()

    def heartbeat(self) -> None:
        """Extend this job's lease; raises :class:`LeaseLost` if it was already lost (or the
        attempt was stopped and its end written: nothing it does is recorded any more)."""
        if self._stop is not None and self._stop.fenced:
            raise LeaseLost()
        if not self._runner.extend([self.id]):
            raise LeaseLost()

    async def heartbeat_async(self) -> None:
        """:meth:`heartbeat` for ``async def`` handlers: the write runs in a thread."""
        await asyncio.to_thread(self.heartbeat)

    def __repr__(self) -> str:
        return f"<job {self.id} {self.handler} attempt {self.attempt}/{self.max_attempts}>"


class Successors(Protocol):
    """Who runs the jobs that ending attempts hand their places under limits to (the worker,
    :meth:`Runner.record`)."""

    def hand_on_queues(self) -> tuple[str, ...] | None:
        """The queues to take them from now (the open ones), or None while it takes none."""
        ...

    def take_handed(self, jobs: list[Job]) -> None:
        """Run ``jobs``: claimed for this runner's owner, their holds written."""
        ...


class Runner:
    """Executes jobs for one lease owner."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        owner: str,
        clock: Callable[[], datetime],
        lease: timedelta,
        backoff_base: timedelta,
        backoff_max: timedelta,
        queues: tuple[str, ...] = ("default",),
        coroutine_runner: CoroutineRunner | None = None,
        recorded: list[RecordedHook] | None = None,
        error_messages: str = "none",
        limits: LimitSet | None = None,
        cancel_grace: float = 10.0,
    ) -> None:
        self.store = store
        #: Seconds a stopped process-isolated attempt has before its child is killed.
        self.cancel_grace = cancel_grace
        #: The limits every worker shares: their jobs are claimed apart (_store/limits.py).
        self.limits = limits or LimitSet()
        self._limited_poked = True
        self._limited_next = float("-inf")
        self._limited_busy = False  # the last claim under limits found jobs or a full limit
        self._rate_held = False  # a rate held it back
        self._limited_look = True
        self._limits_ready = False
        self._pruned_at = float("-inf")
        #: Jobs this runner claimed under limits that hold their places (the claim that
        #: counts, or handed on): when one ends, its places can pass to a ready job.
        self._placed: set[int] = set()
        #: Set by a worker: ending attempts hand their places under limits to ready jobs in
        #: the transaction that records them, and it runs those (None: places go back).
        self.successors: Successors | None = None
        self._handing = _outcomes.Statements(self.limits)  # PostgreSQL's, built once each
        #: Seconds a claim that found its limits full holds off the next look under limits,
        #: unless a place came back meanwhile (a worker that hands places on:
        #: LIMITS_FULL_SECONDS); 0: every claim looks.
        self.full_retry = 0.0
        #: The last claim's jobs under no limit were fewer than asked for (none left).
        self.plain_short = False
        self._full_until = float("-inf")  # the limits were full: LIMITS_FULL_SECONDS
        self._gave_back = False  # an attempt under limits ended with no job handed its place
        #: What a failed run keeps of the exception's message ([worker] error_messages).
        self.error_messages = error_messages
        #: Called after each commit of outcomes with the (job, outcome) pairs it wrote (the
        #: metrics' outcome counter: one call per batch, not a signal receiver per job). The
        #: app's list, shared: a hook added later is seen.
        self.recorded: list[RecordedHook] = [] if recorded is None else recorded
        #: Runs a coroutine to its end from sync code (an async ``abandoned`` hook met by a
        #: sync path, an async handler met by ``work()``): the worker's loop, or the app's.
        self.coroutine_runner = coroutine_runner
        self.registry = registry
        self._isolated_preloaded = False  # the fork server told of the isolated handlers
        self.owner = owner
        self.clock = clock
        self.lease = lease
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.queues = queues
        self.cursor = ClaimCursor(enabled=store.caps.dialect == "postgresql" and len(queues) == 1)

    # -- acquiring work ---------------------------------------------------------------
    def take_over(self, limit: int = 10, *, queues: tuple[str, ...] | None = None) -> list[Job]:
        """Deal with expired leases; return the jobs this runner should now run again.
        ``queues``: those to look in (default: all of the runner's; the worker leaves out the
        paused ones)."""
        if not self.cursor.expired_due():  # slow scans: once a second (_store/cursor.py)
            return []
        looked = self.queues if queues is None else queues
        if not looked:
            return []
        now = self.clock()
        with self.store.read() as conn:
            stale = _jobs.expired(conn, now=now, limit=limit, queues=looked)
        rerun: list[Job] = []
        for job in stale:
            handler = self.registry.get(job.handler)
            if handler is not None and not handler.retry_safe:
                won = self._seize(job, "abandoning", self._take_over(job, now, rerun=False))
                if won:
                    taken = dataclasses.replace(job, lease_owner=self.owner, fence=job.fence + 1)
                    self.record([self.abandon(taken, handler, "lease_expired", now)])
            elif job.attempts >= job.max_attempts:
                if self._seize(
                    job, "aborting", functools.partial(_jobs.abort_expired, job=job, now=now)
                ):
                    log.warning(
                        "job %s: lease expired on its last attempt",
                        job.id,
                        extra={"action": "job_lease_expired", "job_id": job.id},
                    )
                    self._signal_aborted(job, "lease_expired")
            elif self._seize(job, "taking over", self._take_over(job, now, rerun=True)):
                log.info(
                    "job %s: taken over from stopped worker %s",
                    job.id,
                    job.lease_owner,
                    extra={"action": "job_taken_over", "job_id": job.id},
                )
                rerun.append(
                    dataclasses.replace(
                        job,
                        attempts=job.attempts + 1,
                        fence=job.fence + 1,
                        lease_owner=self.owner,
                        lease_expires_at=now + self.lease,
                    )
                )
        return rerun

    def _take_over(self, job: Job, now: datetime, *, rerun: bool) -> Callable[[Connection], bool]:
        return lambda conn: _jobs.take_over(
            conn, job, owner=self.owner, now=now, lease=self.lease, rerun=rerun
        )

    def _seize(self, job: Job, doing: str, write: Callable[[Connection], bool]) -> bool:
        """One takeover transaction (conditional on the owner and expiry seen); a deadlock that
        outlasts the retries is a takeover lost to whoever held the lock."""

        def attempt() -> bool:
            with self.store.begin() as conn:
                return write(conn)

        return retry(f"{doing} expired job {job.id}", attempt, lost=lambda: False)

    def claim(
        self,
        limit: int = 1,
        *,
        handlers: Collection[str] = (),
        exclude: bool = False,
        limited: int | None = None,
        queues: tuple[str, ...] | None = None,
        plain: bool = True,
    ) -> list[Job]:
        """Claim up to ``limit`` ready jobs (with ``handlers``: only theirs, or with
        ``exclude`` only others'). A claim that deadlocked is run again; one that still does
        claims nothing this time (the transaction was rolled back whole).

        With limits, the jobs under none are claimed as without, and then, when room is left
        and :meth:`poke_limits` said so or ``LIMITED_POLL_SECONDS`` passed, those under
        limits, by a claim that counts (:func:`scheduler._store.limits.claim`), at most
        ``limited`` of them (the worker's free threads: a job claimed under a limit holds its
        place from the claim, so none is prefetched to wait for a thread). ``queues``: from
        those only (the queues not paused), default all of the runner's. ``plain=False``
        leaves out the jobs under no limit (the worker heard of none since its last claim
        found none: :attr:`plain_short`)."""
        looked = self.queues if queues is None else queues
        if not self.limits:
            return self._claim_plain(limit, handlers, exclude, looked, ())
        found: list[Job] = []
        if plain:
            open_queues = tuple(q for q in looked if q not in self.limits.queues)
            found = self._claim_plain(limit, handlers, exclude, open_queues, self.limits.handlers)
            self.plain_short = len(found) < limit
        room = limit - len(found) if limited is None else min(limit - len(found), limited)
        if room > 0 and looked and self._limited_due():
            found += self._claim_limited(room, handlers, exclude, looked)
        return found

    def poke_limits(self) -> None:
        """There may be jobs under limits to claim (a wake-up, a finished job): the next
        claim looks for them."""
        self._limited_poked = True

    @property
    def limits_pending(self) -> bool:
        """Whether a rate held back the last claim under limits: the worker looks again after
        ``LIMITS_RETRY_SECONDS`` rather than its poll (the window moves on by itself, and
        nothing wakes it). A full ``concurrency`` waits for a wake-up (one of its own jobs
        ending) or the poll: looking again and again would only queue on the limit's lock."""
        return self._rate_held

    def limits_probe(self, queues: tuple[str, ...]) -> Any:
        """Whether a job under a limit is ready in ``queues``, as SQL for the worker's
        presence write to carry (``_store.limits.ready_probe``), in place of this runner's
        own look every ``LIMITED_POLL_SECONDS``; None without limits or queues, or where the
        write returns nothing (MariaDB: the look stays)."""
        if not self.limits or not queues or not self.store.caps.update_returning:
            return None
        return _limits.ready_probe(self.limits, now=self.clock(), queues=queues)

    def probed(self, ready: bool) -> None:
        """The presence write's answer to :meth:`limits_probe`: the runner's own look is
        put off (nothing new to find), or, a job being ready, the next claim looks."""
        self._limited_next = time.monotonic() + LIMITED_POLL_SECONDS
        if ready:
            self._limited_poked = True

    def _limited_due(self) -> bool:
        now = time.monotonic()
        if now < self._full_until and not self._gave_back:
            return False
        if not self._limited_poked and now < self._limited_next:
            return False
        self._limited_look = not self._limited_busy  # idle: one read before any lock
        self._limited_poked = False
        self._limited_next = now + LIMITED_POLL_SECONDS
        return True

    def _claim_limited(
        self, limit: int, handlers: Collection[str], exclude: bool, queues: tuple[str, ...]
    ) -> list[Job]:
        if not self._limits_ready:
            _limits.ensure(self.store, [each.name for each in self.limits.limits])
            self._limits_ready = True
        now = self.clock()
        prune = time.monotonic() - self._pruned_at >= LIMITS_PRUNE_SECONDS

        def ready() -> bool:
            with self.store.read() as conn:
                return _limits.any_ready(
                    conn,
                    self.limits,
                    now=now,
                    queues=queues,
                    handlers=handlers,
                    exclude=exclude,
                )

        if self._limited_look and not retry("looking under limits", ready, lost=lambda: True):
            return []  # nothing ready under a limit: no lock taken, nothing counted

        def attempt() -> tuple[list[Job], int, bool]:
            if _limits_pipeline.covers(self.store, self.limits):
                return _limits_pipeline.claim(
                    self.store,
                    self.limits,
                    owner=self.owner,
                    now=now,
                    lease=self.lease,
                    want=limit,
                    queues=queues,
                    handlers=handlers,
                    exclude=exclude,
                )
            with self.store.begin() as conn:
                found = _limits.claim(
                    self.store,
                    conn,
                    self.limits,
                    owner=self.owner,
                    now=now,
                    lease=self.lease,
                    want=limit,
                    queues=queues,
                    handlers=handlers,
                    exclude=exclude,
                )
                if prune:
                    _limits.prune(conn, self.limits, now)
                return found

        found, held, by_rate = retry("claim under limits", attempt, lost=lambda: ([], 0, False))
        self._placed.update(job.id for job in found)
        if prune and _limits_pipeline.covers(self.store, self.limits):
            with self.store.begin() as conn:  # holds that count for nothing: no lock needed
                _limits.prune(conn, self.limits, now)
        if prune:
            self._pruned_at = time.monotonic()
        self._limited_busy = bool(found or held)
        self._rate_held = by_rate
        full = held and not found and not by_rate
        self._full_until = time.monotonic() + self.full_retry if full else float("-inf")
        self._gave_back = False
        if found or held:
            self._limited_poked = True  # more may be ready, or room may come soon
        return found

    def _claim_plain(
        self,
        limit: int,
        handlers: Collection[str],
        exclude: bool,
        queues: tuple[str, ...],
        limited: Collection[str],
    ) -> list[Job]:
        if not queues:
            return []  # every queue paused (or all under limits): no statement
        now = self.clock()

        def attempt(after: _jobs.ClaimKey | None) -> list[Job]:
            with self.store.begin() as conn:
                return _jobs.claim(
                    self.store,
                    conn,
                    owner=self.owner,
                    now=now,
                    lease=self.lease,
                    limit=limit,
                    queues=queues,
                    handlers=handlers,
                    exclude=exclude,
                    after=after,
                    limited=limited,
                )

        # From where the last claim left off while claims from the front are slow (a held
        # MVCC horizon: _store/cursor.py).
        return self.cursor.claim(
            handlers, exclude, lambda after: retry("claim", lambda: attempt(after), lost=list)
        )

    def paused_queues(self) -> frozenset[str]:
        """The names of the paused queues (``scheduler pause``), every one of them."""

        def attempt() -> frozenset[str]:
            with self.store.read() as conn:
                return _queues.paused_names(conn)

        return retry("reading paused queues", attempt)

    def task_timeouts(self, names: list[str]) -> dict[str, float]:
        """The ``timeout`` of each of the tasks ``names`` that has one (0: no limit)."""

        def attempt() -> dict[str, float]:
            with self.store.read() as conn:
                return _rows.task_timeouts(conn, names)

        return retry("reading the tasks' timeouts", attempt)

    def open_queues(self) -> tuple[str, ...]:
        """The runner's queues less the paused ones (one read)."""
        paused = self.paused_queues()
        return tuple(q for q in self.queues if q not in paused)

    def cancels_requested(self, job_ids: list[int]) -> set[int]:
        """Which of ``job_ids`` (held by this runner) an operator asked to cancel."""

        def attempt() -> set[int]:
            with self.store.read() as conn:
                return _jobs.cancels_requested(conn, job_ids, owner=self.owner)

        return retry("reading cancels", attempt)

    def extend(self, job_ids: list[int]) -> int:
        """Renew the leases this runner holds on ``job_ids``; returns how many it still holds."""

        def attempt() -> int:
            with self.store.begin() as conn:
                return _jobs.heartbeat(
                    conn, job_ids, owner=self.owner, now=self.clock(), lease=self.lease
                )

        return retry("extending leases", attempt)

    def holding(self, job_ids: list[int]) -> set[int]:
        """Which of ``job_ids`` this runner holds the lease of now (a read)."""

        def attempt() -> set[int]:
            with self.store.begin() as conn:
                return _jobs.holding(conn, job_ids, owner=self.owner, now=self.clock())

        return retry("reading leases", attempt)

    # -- running ----------------------------------------------------------------------
    def run(self, job: Job) -> str:
        """Run one claimed job to an outcome and record it; returns the outcome."""
        return self.record([self.execute(job)])[0]

    def _which_run(self, job: Job) -> str:
        """``(handler)``, or for a task's job (rerun in place, attempts reset each run)
        ``(handler, task NAME) run N,``: N from the run history, read on failures only."""
        if job.task_name is None:
            return f"({job.handler})"
        try:
            with self.store.read() as conn:
                earlier = _jobs.first_attempts(conn, job.id)
        except Exception:  # a log line is not worth failing the job's outcome for
            return f"({job.handler}, task {job.task_name})"
        run = earlier + (1 if job.attempts <= 1 else 0)  # a retry: its attempt 1 is recorded
        return f"({job.handler}, task {job.task_name}) run {run},"

    def prepare_isolation(self, *, start: bool = False) -> None:
        """Before the first child: the fork server is to import every process-isolated
        handler's module once (:func:`.isolation.preload`), not each child at each attempt.
        ``start`` (a worker's start-up): also start the server now, when any handler is
        process-isolated, so that its imports are not paid inside an attempt's timeout."""
        if self._isolated_preloaded:
            return
        self._isolated_preloaded = True
        handlers = self.registry.process_isolated()
        modules = []
        for handler in handlers:
            try:
                modules.append(_isolation.where(handler)[0])
            except ValueError:
                continue  # refused at its attempt, with its own message
        _isolation.preload(modules)
        if start and handlers:
            _isolation.start_server()

    def _no_handler(self, job: Job, started: datetime) -> Ending:
        log.error(
            "job %s: no handler registered for %r",
            job.id,
            job.handler,
            extra={"action": "job_no_handler", "job_id": job.id},
        )
        return Ending(job, started, ABORTED, "no_handler")

    def run_coroutine(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` to its end from sync code (see ``coroutine_runner``)."""
        if self.coroutine_runner is None:
            return asyncio.run(coro)
        return self.coroutine_runner(coro)

    def execute(self, job: Job, stop: Stop | None = None) -> Ending:
        """Call the handler and decide what its attempt means; writes nothing.

        An ``async def`` handler is run to its end with :meth:`run_coroutine`. ``stop``: the
        worker's control of the attempt (its timeout), seen by the handler's job."""
        handler = self.registry.get(job.handler)
        started = self.clock()
        if handler is None:
            return self._no_handler(job, started)
        if handler.is_async:
            outcome: Ending = self.run_coroutine(self.execute_async(job, stop))
            return outcome
        running = RunningJob(job, self, stop, started)
        token = _CURRENT.set(running)
        try:
            if job.tenant is None or self.registry.tenant_context is None:
                result = self._call(handler, running, stop)  # no tenant's context to enter
                if result is not None and inspect.isawaitable(result):
                    return self._returned_awaitable(job, result, started)
            else:
                with contextlib.ExitStack() as stack:
                    problem = self._enter_tenant(stack, job)
                    if problem is not None:
                        return self._context_failed(job, problem, started)
                    result = self._call(handler, running, stop)
                    if inspect.isawaitable(result):
                        return self._returned_awaitable(job, result, started)
        except Snooze as exc:
            return self._snoozed(job, exc, started)
        except PermanentError as exc:
            if stop is not None and stop.requested:
                return self.stopped(job, handler, started, stop.reason)
            return self._explained(self._permanent(job, exc, started), exc)
        except Exception as exc:
            if stop is not None and stop.requested:
                return self.stopped(job, handler, started, stop.reason)
            return self._explained(self._failed(job, handler, exc, started), exc)
        finally:
            _CURRENT.reset(token)
        return Ending.success(job, started, completed=running.completed)

    def _call(self, handler: Handler, running: RunningJob, stop: Stop | None) -> Any:
        """Call a sync handler: here, or in a child process if it is process-isolated."""
        if handler.isolation == "process":  # in a child process (isolation.py)
            self.prepare_isolation()
            _isolation.call(handler, running, stop, self.cancel_grace)
            return None
        return handler.func(running)

    async def execute_async(self, job: Job, stop: Stop | None = None) -> Ending:
        """:meth:`execute` on the running event loop: an ``async def`` handler is awaited (a
        sync one runs in a thread). Cancelled while it runs (the worker's shutdown, after the
        grace), the attempt ends as a stopped worker's does: see :meth:`_stopped`."""
        handler = self.registry.get(job.handler)
        started = self.clock()
        if handler is None:
            return self._no_handler(job, started)
        if not handler.is_async:
            outcome: Ending = await asyncio.to_thread(self.execute, job, stop)
            return outcome
        running = RunningJob(job, self, stop, started)
        token = _CURRENT.set(running)
        try:
            async with contextlib.AsyncExitStack() as stack:
                problem = await self._enter_tenant_async(stack, job)
                if problem is not None:
                    return self._context_failed(job, problem, started)
                result = await handler.func(running)
                if inspect.isawaitable(result):
                    return self._returned_awaitable(job, result, started)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or not task.cancelling():
                return await self._failed_async(job, handler, asyncio.CancelledError(), started)
            task.uncancel()  # ours to finish: record what the cancellation means
            if stop is not None and stop.requested:
                return self.stopped(job, handler, started, stop.reason)
            return await self._stopped(job, handler, started)
        except Snooze as exc:
            return self._snoozed(job, exc, started)
        except PermanentError as exc:
            if stop is not None and stop.requested:
                return self.stopped(job, handler, started, stop.reason)
            return self._explained(self._permanent(job, exc, started), exc)
        except Exception as exc:
            if stop is not None and stop.requested:
                return self.stopped(job, handler, started, stop.reason)
            return self._explained(await self._failed_async(job, handler, exc, started), exc)
        finally:
            _CURRENT.reset(token)
        return Ending(job, started, SUCCEEDED, None, completed=running.completed)

    # -- the tenant's context -------------------------------------------------------------
    def _tenant_context(self, job: Job) -> Any:
        factory = self.registry.tenant_context
        if job.tenant is None or factory is None:
            return None
        return factory(job.tenant)

    def _enter_tenant(self, stack: contextlib.ExitStack, job: Job) -> Exception | None:
        """Enter the tenant's context for a sync run; the exception if it failed to enter."""
        try:
            context = self._tenant_context(job)
            if context is None:
                return None
            if hasattr(context, "__enter__"):
                stack.enter_context(context)
            elif hasattr(context, "__aenter__"):
                raise TypeError("an async context manager cannot wrap a sync handler's run")
            else:
                raise TypeError(f"the tenant_context factory returned {type(context).__name__}")
        except Exception as exc:
            return exc
        return None

    async def _enter_tenant_async(
        self, stack: contextlib.AsyncExitStack, job: Job
    ) -> Exception | None:
        """Enter the tenant's context (async, else sync) around an async run."""
        try:
            context = self._tenant_context(job)
            if context is None:
                return None
            if hasattr(context, "__aenter__"):
                await stack.enter_async_context(context)
            elif hasattr(context, "__enter__"):
                stack.enter_context(context)
            else:
                raise TypeError(f"the tenant_context factory returned {type(context).__name__}")
        except Exception as exc:
            return exc
        return None

    def _context_failed(self, job: Job, exc: Exception, started: datetime) -> Ending:
        """The handler never started: the attempt fails with ``tenant_context_failed`` and is
        retried (whatever ``retry_safe`` says) while attempts remain."""
        log.error(
            "job %s (%s): the context of tenant %r failed to enter: %s: %s",
            job.id,
            job.handler,
            job.tenant,
            type(exc).__name__,
            exc,
            extra={"action": "tenant_context_failed", "job_id": job.id, "tenant": job.tenant},
        )
        if job.attempts >= job.max_attempts:
            return Ending(job, started, ABORTED, TENANT_CONTEXT_FAILED)
        retry_at = self.clock() + self.backoff(job.attempts)
        return Ending(job, started, QUEUED, TENANT_CONTEXT_FAILED, retry_at=retry_at)

    # -- outcomes ---------------------------------------------------------------------------
    def _returned_awaitable(self, job: Job, result: Any, started: datetime) -> Ending:
        """A handler gave back an awaitable nobody will await: never a success."""
        if inspect.iscoroutine(result):
            result.close()  # no "never awaited" warning: it is reported here instead
        log.error(
            "job %s (%s) returned %s instead of running it: declare the handler `async def`"
            " (or await it inside)",
            job.id,
            job.handler,
            type(result).__name__,
            extra={"action": "job_returned_awaitable", "job_id": job.id},
        )
        return Ending(job, started, ABORTED, RETURNED_AWAITABLE)

    def _permanent(self, job: Job, exc: PermanentError, started: datetime) -> Ending:
        log.warning(
            "job %s (%s) failed permanently: %s",
            job.id,
            job.handler,
            exc,
            extra={"action": "job_permanent_error", "job_id": job.id, "code": exc.code},
        )
        return Ending(job, started, ABORTED, exc.code[:200] or "permanent_error")

    def _explained(self, ending: Ending, exc: BaseException) -> Ending:
        """``ending`` with the exception's first line, redacted, when ``error_messages`` asks
        for it (the run history keeps it; the log line already has the whole message)."""
        message = error_message(exc, self.error_messages)
        return ending if message is None else dataclasses.replace(ending, message=message)

    def _log_failure(self, job: Job, exc: BaseException, code: str, which: str) -> None:
        log.warning(
            "job %s %s attempt %s/%s raised %s: %s",
            job.id,
            which,
            job.attempts,
            job.max_attempts,
            code,
            exc,
            extra={"action": "job_attempt_failed", "job_id": job.id, "code": code},
        )

    def _retry_or_abort(self, job: Job, code: str, started: datetime) -> Ending:
        if job.attempts >= job.max_attempts:
            return Ending(job, started, ABORTED, code)
        retry_at = self.clock() + self.backoff(job.attempts)
        return Ending(job, started, QUEUED, code, retry_at=retry_at)

    def _failed(self, job: Job, handler: Handler, exc: Exception, started: datetime) -> Ending:
        code = error_code(exc)
        self._log_failure(job, exc, code, self._which_run(job))
        if not handler.retry_safe:
            return self.abandon(job, handler, code, started)
        return self._retry_or_abort(job, code, started)

    async def _failed_async(
        self, job: Job, handler: Handler, exc: BaseException, started: datetime
    ) -> Ending:
        code = error_code(exc)
        self._log_failure(job, exc, code, await asyncio.to_thread(self._which_run, job))
        if not handler.retry_safe:
            return await self.abandon_async(job, handler, code, started)
        return self._retry_or_abort(job, code, started)

    async def _stopped(self, job: Job, handler: Handler, started: datetime) -> Ending:
        """An async run cancelled at shutdown, treated as a stopped worker's job: a retry-safe
        handler's job is queued again at once (aborted ``worker_stopped`` on its last attempt);
        any other is abandoned (its ``abandoned`` hook runs)."""
        log.warning(
            "job %s (%s) cancelled: the worker is stopping",
            job.id,
            job.handler,
            extra={"action": "job_cancelled_at_shutdown", "job_id": job.id},
        )
        if not handler.retry_safe:
            return await self.abandon_async(job, handler, WORKER_STOPPED, started)
        if job.attempts >= job.max_attempts:
            return Ending(job, started, ABORTED, WORKER_STOPPED)
        return Ending(job, started, QUEUED, WORKER_STOPPED, retry_at=self.clock())

    def stopped(self, job: Job, handler: Handler, started: datetime, reason: str | None) -> Ending:
        """How an attempt asked to stop ends: :meth:`timed_out`, or for an operator's cancel
        ``aborted`` with code ``cancelled`` (no retry, no ``abandoned`` hook)."""
        if reason != CANCELLED:
            return self.timed_out(job, handler, started)
        log.warning(
            "job %s (%s) attempt %s/%s stopped: cancelled",
            job.id,
            job.handler,
            job.attempts,
            job.max_attempts,
            extra={"action": "job_cancelled", "job_id": job.id, "code": CANCELLED},
        )
        return Ending(job, started, ABORTED, CANCELLED)

    def timed_out(self, job: Job, handler: Handler, started: datetime) -> Ending:
        """The attempt ran past its ``timeout``: a failure with code ``timeout``, retried if
        the handler is retry-safe and attempts remain, else aborted (no ``abandoned`` hook:
        the attempt may still be running when this is written)."""
        log.warning(
            "job %s (%s) attempt %s/%s stopped: it ran past its timeout of %gs",
            job.id,
            job.handler,
            job.attempts,
            job.max_attempts,
            handler.timeout or 0,
            extra={"action": "job_timed_out", "job_id": job.id, "code": TIMEOUT},
        )
        if not handler.retry_safe:
            return Ending(job, started, ABORTED, TIMEOUT)
        return self._retry_or_abort(job, TIMEOUT, started)

    def _snoozed(self, job: Job, snooze: Snooze, started: datetime) -> Ending:
        """The handler asked to run again later: queued at now + seconds, the attempt given
        back, no failure counted."""
        log.info(
            "job %s (%s) snoozed for %gs",
            job.id,
            job.handler,
            snooze.seconds,
            extra={"action": "job_snoozed", "job_id": job.id},
        )
        retry_at = self.clock() + timedelta(seconds=snooze.seconds)
        return Ending(job, started, QUEUED, None, retry_at=retry_at, snoozed=True)

    def backoff(self, attempts: int) -> timedelta:
        """1, 2, 4 ... times the base after each failed attempt, capped."""
        return delay_after(attempts, self.backoff_base, self.backoff_max)

    @staticmethod
    def _hook(handler: Handler) -> Callable[[Any], Any] | None:
        hook: Callable[[Any], Any] | None = handler.abandoned or getattr(
            handler.func, "abandoned", None
        )
        return hook

    def _hook_failed(self, job: Job) -> None:
        log.exception(
            "job %s: abandoned() hook of %r raised",
            job.id,
            job.handler,
            extra={"action": "abandoned_hook_failed", "job_id": job.id},
        )

    def abandon(self, job: Job, handler: Handler, cause: str, started: datetime) -> Ending:
        """Run the ``abandoned`` hook (isolated; an async one to its end); the job is to end
        ``aborted``/``abandoned``."""
        hook = self._hook(handler)
        # Only the lease holder runs the hook: a worker whose lease was taken over meanwhile
        # must not run it a second time (the new owner abandons the job itself).
        if hook is not None and self.extend([job.id]):
            try:
                result = hook(RunningJob(job, self))
                if inspect.iscoroutine(result):
                    self.run_coroutine(result)
            except Exception:
                self._hook_failed(job)
        return Ending(job, started, ABORTED, "abandoned", run_code=cause, abandoned=True)

    async def abandon_async(
        self, job: Job, handler: Handler, cause: str, started: datetime
    ) -> Ending:
        """:meth:`abandon` on the event loop: an async hook is awaited, a sync one runs in a
        thread."""
        hook = self._hook(handler)
        held = 0 if hook is None else await asyncio.to_thread(self.extend, [job.id])
        if hook is not None and held:
            try:
                if is_async_callable(hook):
                    await hook(RunningJob(job, self))
                else:
                    result = await asyncio.to_thread(hook, RunningJob(job, self))
                    if inspect.iscoroutine(result):
                        await result
            except Exception:
                self._hook_failed(job)
        return Ending(job, started, ABORTED, "abandoned", run_code=cause, abandoned=True)

    def record(self, outcomes: list[Ending]) -> list[str]:
        """Write several attempts' outcomes in one transaction, then send their signals.

        Each write is guarded by this runner's lease; an attempt whose lease was lost is
        discarded and reported as ``lease_lost``.
        """
        if not outcomes:
            return []
        items = [finish_args(o) for o in outcomes]
        places = self._places(outcomes)
        backoff = Backoff(RECORD_RETRY_FIRST, RECORD_RETRY_CAP)
        deadline = time.monotonic() + self.lease.total_seconds() / 2
        while True:
            try:
                views, handed = retry("recording outcomes", lambda: self._finish(items, places))
                break
            except Exception as exc:
                # The database went away (a restart), or the connection now reaches a server
                # that answers read-only (a switchover): the handlers' work is done, so keep
                # trying while the leases still hold rather than leave it to a takeover.
                delay = backoff.next()
                if not is_transient(exc) or time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "database unavailable while recording %s job(s); retrying in %.1fs",
                    len(items),
                    delay,
                    extra={"action": "record_retry"},
                )
                time.sleep(delay)
        self._placed.difference_update(outcome.job.id for outcome in outcomes)
        if handed:
            self._hand(handed)
        if self.limits and len(handed) < sum(
            1 for o in outcomes if self.limits.of(o.job.handler, o.job.queue)
        ):
            self._gave_back = True  # a place came back: the next claim may look at once
        results: list[str] = []
        committed: list[tuple[Job, str]] = []
        for outcome, view in zip(outcomes, views, strict=True):
            job = outcome.job
            if view is None and outcome.completed:  # job.complete() committed it
                view = job.replaced(state=SUCCEEDED, lease_owner=None)
            elif view is None:
                log.warning(
                    "job %s: lease lost before it finished; its result is discarded",
                    job.id,
                    extra={"action": "job_lease_lost", "job_id": job.id},
                )
                results.append("lease_lost")
                continue
            committed.append((view, outcome.result))
            if outcome.state == SUCCEEDED:
                signals.send(signals.job_succeeded, job.handler, job=view)
            elif outcome.snoozed:
                pass  # not a failure: no signal
            elif outcome.state == QUEUED:
                signals.send(
                    signals.job_failed,
                    job.handler,
                    job=view,
                    error_code=outcome.code,
                    retry_at=outcome.retry_at,
                )
            else:
                if outcome.abandoned:
                    signals.send(
                        signals.job_abandoned, job.handler, job=view, error_code=outcome.run_code
                    )
                signals.send(signals.job_aborted, job.handler, job=view, error_code=outcome.code)
            results.append("abandoned" if outcome.abandoned else outcome.state)
        self._tell_recorded(committed)
        return results

    def _tell_recorded(self, committed: list[tuple[Job, str]]) -> None:
        for hook in self.recorded:
            try:
                hook(committed)
            except Exception:
                log.exception("an outcome hook raised", extra={"action": "outcome_hook_failed"})

    def _finish(
        self, items: list[_jobs.Finish], places: dict[int, Places]
    ) -> tuple[list[Job | None], list[Job]]:
        now = self.clock()
        at_once = self._at_once(items, places)
        if at_once is not None:
            key, placed = at_once
            taker = self.successors
            queues = taker.hand_on_queues() if taker is not None and key is not None else None
            hand_on = self._handing.get(key, queues) if key is not None and queues else None
            with self.store.at_once() as conn:
                return _outcomes.succeed(
                    conn,
                    items,
                    owner=self.owner,
                    now=now,
                    lease=self.lease,
                    hand_on=hand_on,
                    placed=placed,
                )
        with self.store.begin() as conn:
            views = _jobs.finish_many(conn, items, owner=self.owner, now=now)
            # A retry (at the end of its back-off) or a job queued again at once (an async
            # run cancelled at shutdown): the workers learn of it (wake-ups, a timer).
            again = [(v.queue, v.run_at) for v in views if v is not None and v.state == QUEUED]
            if again:
                _wakeup.announce(self.store, conn, again)
            return views, self._hand_on(conn, items, views, places, now)

    def _at_once(
        self, items: list[_jobs.Finish], places: dict[int, Places]
    ) -> tuple[Places | None, list[int]] | None:
        """Whether a batch is written by one statement (``_store.outcomes``: PostgreSQL but not
        Citus, every attempt a success, the placed ones under one set of places): that set and
        the placed jobs; None: the general transaction."""
        if self.store.caps.dialect != "postgresql" or self.store.caps.citus:
            return None  # Citus: a WITH of several writes is not one router statement
        if any(f.state != SUCCEEDED or f.snoozed for f in items):
            return None
        placed = [f.job.id for f in items if f.job.id in places]
        keys = {places[job_id] for job_id in placed}
        if len(keys) > 1:
            return None
        return (keys.pop() if keys else None), placed

    def _places(self, outcomes: list[Ending]) -> dict[int, Places]:
        """The places under limits the ending attempts hold that can be handed on, by job."""
        if not self._placed:
            return {}
        found: dict[int, Places] = {}
        for outcome in outcomes:
            job = outcome.job
            if job.id not in self._placed:
                continue
            under = self.limits.of(job.handler, job.queue)
            key = handed_on(under, tenant=job.tenant, handler=job.handler, queue=job.queue)
            if key is not None:
                found[job.id] = key
        return found

    def _hand_on(
        self,
        conn: Connection,
        items: list[_jobs.Finish],
        views: list[Job | None],
        places: dict[int, Places],
        now: datetime,
    ) -> list[Job]:
        """The holds of the attempts that ended (left ``claimed``) in this transaction are
        deleted; with :attr:`successors`, ready jobs are claimed into their places
        (``_store.limits.hand_on``) for it to run."""
        if not places:
            return []
        ended: dict[int, Places] = {}
        for item, view in zip(items, views, strict=True):
            key = places.get(item.job.id)
            if key is not None and view is not None and view.state != CLAIMED:
                ended[item.job.id] = key
        if not ended:
            return []
        taker = self.successors
        queues = taker.hand_on_queues() if taker is not None else None
        return _limits.hand_on(
            self.store,
            conn,
            self.limits,
            ended,
            owner=self.owner,
            now=now,
            lease=self.lease,
            queues=queues or (),
        )

    def _hand(self, handed: list[Job]) -> None:
        self._placed.update(job.id for job in handed)
        taker = self.successors
        if taker is None:  # the worker stopped meanwhile: left to their leases, as at a crash
            log.warning(
                "job(s) %s handed a place under a limit after the worker stopped; left to "
                "their leases",
                [job.id for job in handed],
                extra={"action": "handed_after_stop"},
            )
            return
        taker.take_handed(handed)

    def _signal_aborted(self, job: Job, code: str) -> None:
        with self.store.read() as conn:
            view = _jobs.get_job(conn, job.id)
        if view is not None:
            self._tell_recorded([(view, "aborted")])
        signals.send(signals.job_aborted, job.handler, job=view, error_code=code)

    # -- the simple loop ----------------------------------------------------------------
    def work(self, limit: int | None = None, batch: int = 10) -> int:
        """Run ready jobs in this thread until none is ready; returns how many were handled.

        Jobs are claimed ``batch`` at a time and their outcomes written together, at the end
        of the batch or once the oldest unwritten one is half a second old. The leases of the
        jobs still waiting are renewed while earlier ones run.
        """
        handled = 0
        queues = self.open_queues()  # paused queues (`scheduler pause`) are left alone
        while limit is None or handled < limit:
            size = batch if limit is None else min(batch, limit - handled)
            self.poke_limits()
            jobs = self.take_over(limit=size, queues=queues) or self.claim(size, queues=queues)
            if not jobs:
                break
            pending: list[Ending] = []
            oldest = renewed = time.monotonic()
            for index, job in enumerate(jobs):
                if time.monotonic() - renewed > self.lease.total_seconds() / 3:
                    self.extend([j.id for j in jobs[index:]] + [o.job.id for o in pending])
                    renewed = time.monotonic()
                if not pending:
                    oldest = time.monotonic()
                pending.append(self.execute(job))
                handled += 1
                if time.monotonic() - oldest > RECORD_WITHIN:
                    self.record(pending)
                    pending = []
            self.record(pending)
        return handled

    async def work_async(self, limit: int | None = None) -> int:
        """:meth:`work` for a program whose event loop is running: async handlers run on that
        loop, sync handlers and the database writes in threads. One job at a time."""
        handled = 0
        queues = await asyncio.to_thread(self.open_queues)
        while limit is None or handled < limit:
            size = 10 if limit is None else min(10, limit - handled)
            self.poke_limits()
            jobs = await asyncio.to_thread(
                functools.partial(self.take_over, size, queues=queues)
            ) or await asyncio.to_thread(functools.partial(self.claim, size, queues=queues))
            if not jobs:
                break
            renewed = time.monotonic()
            for index, job in enumerate(jobs):
                if time.monotonic() - renewed > self.lease.total_seconds() / 3:
                    await asyncio.to_thread(self.extend, [j.id for j in jobs[index:]])
                    renewed = time.monotonic()
                outcome = await self.execute_async(job)
                await asyncio.to_thread(self.record, [outcome])
                handled += 1
        return handled
