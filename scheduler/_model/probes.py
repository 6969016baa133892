"""Recovery probes: what a disabled row with ``recovery = "probe"`` does next (pure rules).

After the failure limit disables a row, it runs one probe after each of its
``probe_intervals`` (the last repeating): its last job rerun in place. The first probe that
succeeds re-enables the row. :func:`step` decides, from the row's probe state and its last
job's state, whether to wait, run a probe, or recover.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from enum import StrEnum

from .rules import IN_FLIGHT, PROBE_INTERVALS, JobState


class Step(StrEnum):
    WAIT = "wait"
    """A probe is running, or the next one is not due yet."""
    PROBE = "probe"
    """Rerun the last job in place as the next probe."""
    RECOVER = "recover"
    """A probe succeeded: re-enable the row."""


def encode_intervals(intervals: Sequence[float]) -> str | None:
    """The stored form of ``probe_intervals`` (None for the defaults)."""
    values = tuple(float(v) for v in intervals)
    if values == PROBE_INTERVALS:
        return None
    return json.dumps([int(v) if v == int(v) else v for v in values], separators=(",", ":"))


def decode_intervals(stored: str | None) -> tuple[float, ...]:
    if not stored:
        return PROBE_INTERVALS
    return tuple(float(v) for v in json.loads(stored))


def interval(intervals: Sequence[float], index: int) -> float:
    """Seconds before probe number ``index`` (0: the first); the last interval repeats."""
    return float(intervals[min(index, len(intervals) - 1)])


def first_probe_at(intervals: Sequence[float], disabled_at: datetime) -> datetime:
    return disabled_at + timedelta(seconds=interval(intervals, 0))


def step(job_state: str | None, probe_at: datetime, now: datetime, has_job: bool) -> Step:
    """What a probing row does at ``now``, from its last job's state and when its next probe
    is due."""
    if job_state in IN_FLIGHT:
        return Step.WAIT
    if job_state == JobState.SUCCEEDED:
        return Step.RECOVER
    if probe_at <= now and has_job and job_state == JobState.ABORTED:
        return Step.PROBE
    return Step.WAIT
