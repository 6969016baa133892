"""The CPU-bound job of ``isolation.py``, in a module of its own: a process-isolated handler is
imported by name in its child (spawn), so it must live at a module's top level."""

from __future__ import annotations

from typing import Any


def cpu(job: Any) -> None:
    """``payload["n"]`` rounds of a pure-Python loop: holds the GIL the whole time."""
    total = 0
    for i in range(job.payload["n"]):
        total += i * i % 7
