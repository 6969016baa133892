"""What a tick reports: each due row's outcome, by row name."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class Outcome(StrEnum):
    """What became of one due row in a tick (the :class:`TickReport` list it is named in).

    *Dispatched* outcomes are ``dispatched`` and ``rerun``; the others dispatched nothing.
    """

    DISPATCHED = "dispatched"
    """A fresh job was created and the row moved to its next slot."""
    RERUN = "rerun"
    """The row's aborted last job was reset and queued again (same job id)."""
    HELD_BACK = "held_back"
    """Nothing written: the last job is still in flight and the row is not concurrent."""
    DISABLED = "disabled"
    """The row was disabled after too many consecutive failures (the disable committed)."""
    LOST_RACE = "lost_race"
    """Another process wrote the row since it was read: this tick wrote nothing for it."""
    SKIPPED_OVERLAP = "skipped_overlap"
    """The slot was dropped (overlap ``skip``: the last job is in flight); the row moved on."""
    MISSED = "missed"
    """The slot was older than the row's catch-up window: not run; the row moved on."""
    LOCKED = "locked"
    """Another transaction holds a lock on the row (or its last job): passed over for this tick
    without waiting, nothing written; the row stays due for the next tick."""


@dataclass
class TickReport:
    """Row names per outcome of one tick, in due order."""

    dispatched: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    lost_race: list[str] = field(default_factory=list)
    skipped_overlap: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    locked: list[str] = field(default_factory=list)
    dispatched_slots: list[datetime] = field(default_factory=list, repr=False, compare=False)
    """The nominal slot (before jitter) of each row in `dispatched`, in the same order: the
    lateness metric reads them, with no signal receiver per dispatch."""

    recovered: list[str] = field(default_factory=list, compare=False)
    """The rows a successful recovery probe re-enabled (``recovery = "probe"``)."""

    def add(self, outcome: str, name: str) -> None:
        getattr(self, outcome).append(name)

    def extend(self, other: TickReport) -> None:
        """Add `other`'s outcomes to these (the ticks of several shards, as one report)."""
        for outcome in Outcome:
            getattr(self, outcome).extend(getattr(other, outcome))
        self.dispatched_slots.extend(other.dispatched_slots)
        self.recovered.extend(other.recovered)

    def as_dict(self) -> dict[str, list[str]]:
        return {k.value: list(getattr(self, k)) for k in Outcome}

    def __bool__(self) -> bool:
        return any(self.as_dict().values())
