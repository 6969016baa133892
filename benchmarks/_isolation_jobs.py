"""The CPU-bound job of ``isolation.py``, in a module of its own: a process-isolated handler is
imported by name in its child (spawn), so it must live at a module's top level."""

from __future__ import annotations

from typing import Any


def cpu(job: Any) -> None:
    """``payload["n"]`` rounds of a pure-Python loop: holds the GIL the whole time."""
    total = 0
    for i in range(job.payload["n"]):
        total += i * i % 7


def spin(job: Any) -> None:
    """A busy loop that never looks at its stop: only its process's end stops it."""
    total = 0
    while True:
        total += 1


def checking(job: Any) -> None:
    """Sleeps in 10 ms steps, asking after each whether it should stop (``job.check()``)."""
    import time

    while True:
        job.check()
        time.sleep(0.01)
