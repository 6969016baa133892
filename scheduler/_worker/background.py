"""``app.background_worker()``: the worker inside a web process (FastAPI, Flask, Django).

The same :class:`~scheduler._worker.Worker` the ``scheduler worker`` command runs (the tick on
its thread, the jobs on ``concurrency`` threads, async handlers on an event loop of their own,
heartbeats, housekeeping), started on a thread of this process: no signal handlers are
installed (the web server owns them) and ``[metrics] port`` is not served (every process would
bind it; serve ``/metrics`` from the application instead). Leaving the ``with`` block (or the
lifespan) stops it as SIGTERM stops the command: no new claims, running jobs get
``shutdown_grace_seconds``, and jobs still running after that are left to lease expiry and
another worker's takeover (their threads run on until their handlers return).

Any number of processes may run one (each gunicorn or uvicorn worker process, each host): the
claims and the tick are safe under concurrency, so each job runs once and each slot is
dispatched once. What each costs: one more database connection per job thread (and the tick's,
the heartbeat's), one tick per ``tick_interval`` per process (an idle tick is one statement),
and a row in ``scheduler_workers``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._config import WorkerSettings
from .._errors import SchedulerError
from .shards import ShardedWorker
from .worker import CANCEL_WAIT_SECONDS, Worker, WorkerResult, import_handlers

if TYPE_CHECKING:
    from .host import Host

log = logging.getLogger(__name__)

#: How long :meth:`BackgroundWorker.stop` waits beyond the grace period and the cancelled async
#: jobs' wait, for the worker's own last writes (its tick on record, its row deleted).
STOP_MARGIN_SECONDS = 30.0


def worker_settings(app: Host, overrides: dict[str, Any]) -> WorkerSettings:
    """``app``'s ``[worker]`` settings with ``overrides`` (its field names); else TypeError."""
    fields = {field.name for field in dataclasses.fields(WorkerSettings)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(
            f"background_worker() got unexpected keyword argument(s) {', '.join(unknown)};"
            f" expected [worker] settings: {', '.join(sorted(fields))}"
        )
    for key in ("imports", "queues"):
        if isinstance(overrides.get(key), list):
            overrides[key] = tuple(overrides[key])
    return dataclasses.replace(app.worker_settings, **overrides)


class BackgroundWorker:
    """A worker on a thread of this process: ``with``, ``async with``, or :meth:`start` and
    :meth:`stop`. One use: start it once, stop it once."""

    def __init__(self, app: Host, settings: WorkerSettings) -> None:
        self.app = app
        self.settings = settings
        self.result: WorkerResult | None = None
        """How many runs it took to an outcome, and how many it left running (after stop)."""
        self._worker: Worker | ShardedWorker | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    def start(self) -> BackgroundWorker:
        """Start the worker; returns once it runs. A start-up failure (an outdated schema, a
        database that cannot be reached) is raised here."""
        if self._thread is not None:
            raise SchedulerError("this background worker was started already: make another")
        app = self.app
        if self.settings.imports:
            folder = os.path.dirname(app.config_path) if app.config_path else None
            import_handlers(self.settings.imports, folder)
        app.check_schema()  # the clear message, in the caller's thread
        worker: Worker | ShardedWorker = (
            ShardedWorker(app, settings=self.settings, serve_metrics=False)
            if len(app.shards) > 1
            else Worker(app, settings=self.settings, serve_metrics=False)
        )
        self._worker = worker
        self._thread = threading.Thread(target=self._run, name="scheduler-worker", daemon=True)
        self._thread.start()
        while not worker.started.wait(0.05):
            if self._done.is_set():
                break
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        assert self._worker is not None
        try:
            self.result = self._worker.run()
        except BaseException as exc:  # reported by start(), or logged if it ran already
            self._error = exc
            if self._worker.started.is_set():
                log.exception("the background worker stopped on an error")
        finally:
            self._done.set()

    def stop(self, timeout: float | None = None) -> WorkerResult | None:
        """Stop claiming, let running jobs finish within ``shutdown_grace_seconds``, and wait
        for the worker to end (``timeout`` seconds at most: by default the grace period plus
        the cancelled async jobs' wait plus a margin). Returns what it did (None if it did not
        end in time)."""
        if self._worker is None or self._thread is None:
            return None
        self._worker.stop()
        if timeout is None:
            timeout = self.settings.shutdown_grace_seconds + CANCEL_WAIT_SECONDS
            timeout += STOP_MARGIN_SECONDS
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the background worker did not stop within %.0f s", timeout)
            return None
        return self.result

    def __enter__(self) -> BackgroundWorker:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> BackgroundWorker:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
