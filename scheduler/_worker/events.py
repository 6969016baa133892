"""The one kind of event loop for ``async def`` handlers, on a thread of its own: the worker
starts one (per worker), and ``app.work()`` runs async handlers on its Scheduler's own.

:class:`EventLoop` runs the loop and takes coroutines from other threads (:meth:`run`,
:meth:`start_job`).
A watchdog thread watches the loop's lag: a coroutine on the loop notes the time every
``BEAT_SECONDS``; when that note is older than ``block_seconds`` the loop is blocked (a handler
that calls ``time.sleep`` or a sync client without yielding), and the watchdog logs, once per
episode, the job whose task held the loop (``asyncio.current_task`` of the loop) by id and
handler name.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .._model.job import Job

log = logging.getLogger(__name__)

BEAT_SECONDS = 0.1  # how often the loop notes that it is alive
BLOCK_SECONDS = 1.0  # a loop that did not note it for this long is blocked
_T = TypeVar("_T")


class EventLoop:
    """An asyncio event loop running on its own thread, with a loop-lag watchdog."""

    def __init__(self, *, block_seconds: float = BLOCK_SECONDS) -> None:
        self.block_seconds = block_seconds
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._beat = time.monotonic()
        self._jobs: dict[asyncio.Task[Any], Job] = {}  # running tasks' jobs, for the watchdog
        self.blocked: list[tuple[int | None, str | None, float]] = []  # (job, handler, seconds)
        self._thread = threading.Thread(target=self._run, name="scheduler-loop", daemon=True)
        self._watchdog = threading.Thread(
            target=self._watch, name="scheduler-loop-watchdog", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        self._watchdog.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        beat = self.loop.create_task(self._alive())
        try:
            self.loop.run_forever()
        finally:
            beat.cancel()
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    async def _alive(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(BEAT_SECONDS)

    def _watch(self) -> None:
        reported: object = None  # the episode already logged (its last beat)
        period = min(self.block_seconds / 4, 0.25)
        while not self._stop.wait(period):
            beat = self._beat
            lag = time.monotonic() - beat - BEAT_SECONDS
            if lag < self.block_seconds or reported == beat:
                continue
            reported = beat
            task = asyncio.current_task(self.loop)
            job = self._jobs.get(task) if task is not None else None
            job_id, handler = (job.id, job.handler) if job is not None else (None, None)
            self.blocked.append((job_id, handler, lag))
            who = f"job {job_id} (handler {handler!r})" if job is not None else f"task {task!r}"
            log.warning(
                "the event loop has been blocked for %.1fs by %s: an async handler must not"
                " call blocking code without awaiting (use asyncio.to_thread for it)",
                lag,
                who,
                extra={
                    "action": "event_loop_blocked",
                    "job_id": job_id,
                    "handler": handler,
                    "seconds": round(lag, 3),
                },
            )

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop and wait for its result (never from the loop's thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def start_job(
        self, job: Job, coro: Coroutine[Any, Any, None], unstarted: Callable[[], None]
    ) -> None:
        """Run ``coro``, the run of ``job``, as a task of its own (thread-safe); ``unstarted``
        is called if the task was cancelled before its coroutine ran at all."""

        def start() -> None:
            task = self.loop.create_task(coro, name=f"job-{job.id}")
            self._jobs[task] = job
            task.add_done_callback(lambda done: self._finished(done, unstarted))

        self.loop.call_soon_threadsafe(start)

    def _finished(self, task: asyncio.Task[Any], unstarted: Callable[[], None]) -> None:
        self._jobs.pop(task, None)
        if task.cancelled():  # the coroutine catches its cancellation once it runs
            unstarted()
        elif task.exception() is not None:
            log.error(
                "an async job's task failed",
                exc_info=task.exception(),
                extra={"action": "job_crashed"},
            )

    def cancel_jobs(self) -> None:
        """Cancel every task running a job (thread-safe): each gets CancelledError. A task
        started before this call is cancelled too, even if it has not run yet."""

        def cancel() -> None:
            for task in list(self._jobs):
                task.cancel()

        self.loop.call_soon_threadsafe(cancel)

    def cancel_job(self, job_id: int) -> None:
        """Cancel the task running job ``job_id``, if any (thread-safe)."""

        def cancel() -> None:
            for task, job in list(self._jobs.items()):
                if job.id == job_id:
                    task.cancel()

        self.loop.call_soon_threadsafe(cancel)

    def close(self) -> None:
        """Stop the loop (tasks still running are cancelled) and the watchdog."""
        self._stop.set()
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self._watchdog.join()
