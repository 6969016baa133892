"""The tick: which scheduler rows are due, what happens to each, and what it reports.

- ``due.py``: the due query and the typed row it returns (:class:`DueRow`);
- ``decide.py``: the rules for one due row, a pure function (:func:`decide`);
- ``loop.py``: :func:`tick`, batches of due rows decided and handed to the engine's dispatcher
  (``scheduler/_dispatch``), which writes them;
- ``report.py``: the outcomes (:class:`Outcome`) and the :class:`TickReport`.
"""

from __future__ import annotations

from .decide import Action, Decision, decide
from .due import DueRow
from .loop import tick
from .report import Outcome, TickReport

DISPATCHED, RERUN, HELD_BACK, DISABLED, LOST_RACE = (
    Outcome.DISPATCHED,
    Outcome.RERUN,
    Outcome.HELD_BACK,
    Outcome.DISABLED,
    Outcome.LOST_RACE,
)
SKIPPED_OVERLAP, MISSED, LOCKED = Outcome.SKIPPED_OVERLAP, Outcome.MISSED, Outcome.LOCKED

__all__ = [
    "DISABLED",
    "DISPATCHED",
    "HELD_BACK",
    "LOCKED",
    "LOST_RACE",
    "MISSED",
    "RERUN",
    "SKIPPED_OVERLAP",
    "Action",
    "Decision",
    "DueRow",
    "Outcome",
    "TickReport",
    "decide",
    "tick",
]
