"""A worker for several shards (``[database] shards``): one :class:`Worker` per shard it
serves, each on a thread of this process, over that shard's tables, with its own tick, claims,
wake-ups (the shard's channel) and presence; the jobs of all of them run on one pool of the
worker's ``concurrency`` threads (:class:`Shared`), and together they hold no more jobs than
one Worker of those threads would. Each shard's Worker claims when it has news (a wake-up on
its channel, its tick, its poll, a place coming back), so the shards take turns by themselves:
a busy shard uses every thread while the others have nothing ready.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from .._config import WorkerSettings
from .host import Host
from .worker import Shared, Worker, WorkerResult, _log


class ShardedWorker:
    """Runs a Worker for each of `shards` (default: every shard of ``app``), until
    :meth:`stop` (or SIGTERM/SIGINT), or for one round."""

    def __init__(
        self,
        app: Host,
        *,
        shards: Sequence[int] | None = None,
        concurrency: int | None = None,
        settings: WorkerSettings | None = None,
        serve_metrics: bool = True,
    ) -> None:
        settings = settings or app.worker_settings
        chosen = tuple(range(len(app.shards))) if shards is None else tuple(shards)
        total = settings.concurrency if concurrency is None else concurrency
        self.shards = chosen
        self.concurrency = total
        self.shared = Shared(total) if total > 0 else None
        self.workers = [
            Worker(
                app.shards[index],
                concurrency=total,
                settings=settings,
                serve_metrics=serve_metrics and position == 0,  # one process, one port
                shared=self.shared,
            )
            for position, index in enumerate(chosen)
        ]
        self.started = threading.Event()
        self._signals = 0
        if serve_metrics and app.metrics_settings.port:
            self._share_metrics(app)

    def _share_metrics(self, app: Host) -> None:
        """One set of metrics for the process (``[metrics] port``): the app's, whose gauges
        read every shard (a ``shard`` label); every shard's worker counts its ticks and runs
        in it, the first one serves it."""
        try:
            from .._observe.metrics import metrics_for
        except ImportError:  # the first worker's start says so, naming the key
            return
        shared = metrics_for(app)
        for shard in app.shards:
            setattr(shard, "_metrics", shared)  # noqa: B010 - metrics_for's cache on each shard
        for worker in self.workers[1:]:
            worker._telemetry.metrics = shared

    def run(self, *, once: bool = False, install_signals: bool = False) -> WorkerResult:
        """Run every shard's worker until stopped (``once``: one round each); the runs and the
        attempts left running, summed."""
        results: list[WorkerResult | None] = [None] * len(self.workers)
        errors: list[BaseException] = []

        def serve(position: int, worker: Worker) -> None:
            try:
                results[position] = worker.run(once=once)
            except BaseException as exc:  # one shard's failure stops the others: report it
                errors.append(exc)
                self.stop()

        threads = [
            threading.Thread(target=serve, args=(position, worker), name=f"scheduler-shard-{index}")
            for position, (index, worker) in enumerate(zip(self.shards, self.workers, strict=True))
        ]
        previous = self._install_signals() if install_signals else {}
        try:
            for thread in threads:
                thread.start()
            for worker in self.workers:
                while not worker.started.wait(0.1) and not errors:
                    if not any(thread.is_alive() for thread in threads):
                        break
            if not errors:
                self.started.set()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)  # the main thread stays free for signals
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        done = [result for result in results if result is not None]
        left = sum(r.left_running for r in done)
        if self.shared is not None:
            self.shared.pool.shutdown(wait=not left, cancel_futures=True)
        if errors:
            raise errors[0]
        return WorkerResult(sum(r.handled for r in done), left)

    def stop(self, force: bool = False) -> None:
        """Stop every shard's worker (thread-safe)."""
        for worker in self.workers:
            worker.stop(force)

    def _install_signals(self) -> dict[int, Any]:
        def handle(signum: int, _frame: FrameType | None) -> None:
            self._signals += 1
            force = self._signals > 1
            threading.Thread(target=self._on_signal, args=(signum, force), daemon=True).start()

        return {signum: signal.signal(signum, handle) for signum in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(self, signum: int, force: bool) -> None:
        doing = "not waiting for running jobs" if force else "stopping after the running jobs"
        _log(logging.INFO, "worker_stopping", "%s: %s", signal.Signals(signum).name, doing)
        self.stop(force)
