"""The thread a worker hears through (a LISTEN connection, the broker, the SQLite file):
what they share, reconnection with a back-off and stopping."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

from ..._model.backoff import Backoff
from ._common import RECONNECT_MAX, RECONNECT_MIN, first_line, log
from ._process import Waiter

JOIN_SECONDS = 2.0  # how long stopping waits for a source's thread (its longest wait: 1 s)


class Source:
    """A thread that wakes a waiter; reconnects after a lost connection (with a back-off)."""

    name = "source"

    def __init__(self, waiter: Waiter) -> None:
        self.waiter = waiter
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"scheduler-{self.name}")
        self._thread.daemon = True
        self.lost_at: float | None = None  # time.monotonic() when the connection was lost
        self._backoff = Backoff(RECONNECT_MIN, RECONNECT_MAX)
        self._client: Any = None  # the connection _serve opened (a psycopg or Redis client)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._interrupt()
        self._thread.join(timeout=JOIN_SECONDS)

    def _interrupt(self) -> None:
        pass

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve()
                return
            except Exception as exc:
                if self._stop.is_set():
                    return
                if self.lost_at is None:
                    self.lost_at = time.monotonic()
                    self._backoff.reset()
                    log.warning(
                        "wake-ups: %s lost (%s); workers look for new jobs once a second"
                        " until it is back",
                        self.name,
                        first_line(exc),
                        extra={"action": "wakeups_lost", "source": self.name},
                    )
            finally:
                self._close()
            self._stop.wait(self._backoff.next())

    def _connected(self) -> None:
        """Called once listening: after a loss, say so and look at once (what was missed)."""
        if self.lost_at is not None:
            log.info(
                "wake-ups: %s back after %.1fs",
                self.name,
                time.monotonic() - self.lost_at,
                extra={"action": "wakeups_back", "source": self.name},
            )
            self.lost_at = None
        self.waiter.wake()

    def _serve(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        """After ``_serve`` ended (stopped, or the connection lost): close what it opened."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


class PipedSource(Source):
    """A source whose thread waits in ``select`` on a pipe too: :meth:`stop` writes to it."""

    def __init__(self, waiter: Waiter) -> None:
        super().__init__(waiter)
        self._pipe = os.pipe()

    def _interrupt(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._pipe[1], b"x")

    def stop(self) -> None:
        super().stop()
        for fd in self._pipe:
            with contextlib.suppress(OSError):
                os.close(fd)
