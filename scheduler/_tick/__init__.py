"""The tick: which scheduler rows are due, what happens to each, and what it reports.

- ``due.py``: the due query and the typed row it returns (:class:`DueRow`);
- ``decide.py``: the rules for one due row, a pure function (:func:`decide`);
- ``loop.py``: :func:`tick`, batches of due rows decided and handed to the engine's dispatcher
  (``scheduler/_dispatch``), which writes them;
- ``report.py``: the outcomes (:class:`Outcome`) and the :class:`TickReport`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._model.decide import Action, Decision, decide
from .._model.report import Outcome, TickReport
from .._model.rows import DueRow

if TYPE_CHECKING:
    from .loop import tick


def __getattr__(name: str) -> Any:
    # ``tick`` is imported at its first use: the loop imports ``scheduler._dispatch``, which
    # imports this package's decide, due and report; imported here, a first import of
    # ``scheduler._dispatch`` (before ``scheduler._tick``) went round in a circle.
    if name == "tick":
        from .loop import tick

        return tick
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
