"""Writing outcomes in batches: the worker's threads hand in how their attempts ended and go
back to work; one thread writes what piled up since its last commit in one transaction."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .._model.ending import Ending
from .runner import Runner

log = logging.getLogger(__name__)


class Recorder:
    """Records finished attempts from many threads in few transactions (group commit).

    Worker threads hand in outcomes and go back to work; one thread writes whatever has
    piled up since its last commit in a single transaction, then calls each ``done``. The
    jobs stay claimed (and their leases renewed) until written, so nothing is lost if the
    process dies first: a takeover reruns or abandons them as after any crash.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        max_batch: int = 500,
        after: Callable[[], None] | None = None,
    ) -> None:
        """``after``: called once after the ``done`` callbacks of each batch written (the
        worker's wake-up of its claiming thread: once per batch, not once per job)."""
        self.runner = runner
        self.max_batch = max_batch
        self._after = after
        self._pending: list[tuple[Ending, Callable[[str], None]]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(
            target=self._write_pending, name="scheduler-recorder", daemon=True
        )
        self._thread.start()

    def submit(self, outcome: Ending, done: Callable[[str], None]) -> None:
        with self._cond:
            if not self._closed:
                self._pending.append((outcome, done))
                self._cond.notify()
                return
        self._write([(outcome, done)])  # after close: write in the caller's thread

    def close(self) -> None:
        """Write what is pending, then stop the writing thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _write_pending(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
            self._write(batch)

    def _write(self, batch: list[tuple[Ending, Callable[[str], None]]]) -> None:
        try:
            results = self.runner.record([outcome for outcome, _ in batch])
        except Exception:
            log.exception(
                "%s finished job(s) could not be recorded; their leases will expire",
                len(batch),
                extra={"action": "record_failed"},
            )
            results = ["unrecorded"] * len(batch)
        for (_, done), result in zip(batch, results, strict=True):
            try:
                done(result)
            except Exception:
                log.exception("recorder callback failed", extra={"action": "record_callback"})
        if self._after is not None:
            try:
                self._after()
            except Exception:
                log.exception("recorder callback failed", extra={"action": "record_callback"})
