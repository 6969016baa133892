"""A real worker serving on a thread of the test's own process, and waiting for what it does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from scheduler import Scheduler
from scheduler._worker.worker import Worker


def wait_until(test: Callable[[], Any], seconds: float = 10.0) -> Any:
    """``test()``'s first true value, asked every 20 ms; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = test()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"not within {seconds}s: {test}")


class Running:
    """A worker serving on a thread of its own, stopped at the end."""

    def __init__(self, app: Scheduler) -> None:
        self.worker = Worker(app, serve_metrics=False)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        assert self.worker.started.wait(10)
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop(force=True)
        self.thread.join(15)
        assert not self.thread.is_alive()
