"""A task's slots: the one home of the arithmetic of when a task fires.

A *slot* is an instant its cron names in its zone (``cron.py`` evaluates the expression and
the DST policy); a task with ``jitter`` fires each slot at a deterministic delay after it
(:func:`jitter_delay`), and its ``next_run_at`` is that delayed instant. Everything that
walks a task's slots is here, each taking ``now`` (or another instant) as a parameter: the
next slot the tick moves a row to (:func:`next_slot`), the slot a ``next_run_at`` stands for
(:func:`nominal_slot`), the slots a late run merges (:func:`passed`), the slots that passed
while a row was disabled (:func:`passed_slots`), the DST cases on the way (:func:`dst_cases`),
the next fires ``explain``, the dashboard and a preview show (:func:`next_fires`), and the
slots of a backfill (:func:`backfill_slots`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from . import cron as _cron
from .rows import DueRow
from .time import in_zone, iso, offset_in


class Schedule(Protocol):
    """What the slots of a task depend on (a ``TaskRow``, a ``DueRow``, a ``TaskSpec``)."""

    @property
    def name(self) -> str: ...
    @property
    def cron(self) -> str: ...
    @property
    def timezone(self) -> str: ...
    @property
    def jitter(self) -> int: ...


# -- jitter --------------------------------------------------------------------------------
_MS = timedelta(milliseconds=1)


def jitter_delay(name: str, slot: datetime, seconds: int) -> timedelta:
    """The deterministic delay in ``[0, seconds)`` (whole milliseconds) of `slot` of the task
    `name`: the same on every host and every run, different from slot to slot and task to
    task. Zero when `seconds` is 0."""
    if seconds <= 0:
        return timedelta(0)
    key = f"{name}\x00{slot.astimezone(UTC).isoformat()}".encode()
    drawn = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    return (drawn % (seconds * 1000)) * _MS


def first_run(expr: str, tz: str, name: str, after: datetime, jitter: int = 0) -> datetime:
    """The ``next_run_at`` of a row armed at `after` (sync, enable): its first slot after
    `after`, delayed by its jitter."""
    slot = _cron.next_after(expr, tz, after, name)
    return slot + jitter_delay(name, slot, jitter)


def next_run(expr: str, tz: str, name: str, after: datetime, jitter: int = 0) -> datetime:
    """The ``next_run_at`` of the first slot whose jittered instant is after `after`: the
    slot itself without jitter (:func:`next_after`)."""
    if jitter <= 0:
        return _cron.next_after(expr, tz, after, name)
    slot = _cron.next_after(expr, tz, after - timedelta(seconds=jitter), name)
    for _ in range(_cron.MAX_SKIPS):
        at = slot + jitter_delay(name, slot, jitter)
        if at > after:
            return at
        slot = _cron.next_after(expr, tz, slot, name)
    raise RuntimeError(f"no slot found for cron {expr!r} in {tz} after {after.isoformat()}")


def slot_of(expr: str, tz: str, name: str, run_at: datetime, jitter: int = 0) -> datetime:
    """The nominal slot a ``next_run_at`` stands for: the slot whose jittered instant it is,
    else (a triggered row, or one whose jitter changed) `run_at` itself."""
    if jitter <= 0:
        return run_at
    slot = _cron.next_after(expr, tz, run_at - timedelta(seconds=jitter), name)
    while slot <= run_at:
        if slot + jitter_delay(name, slot, jitter) == run_at:
            return slot
        slot = _cron.next_after(expr, tz, slot, name)
    return run_at


# -- the tick: the row's next slot, the slot it serves, the slots a late run merges ---------
def next_slot(row: Schedule, now: datetime) -> datetime:
    """The row's next ``next_run_at``: its first cron slot after `now`, in its timezone (with
    its jitter, the first slot whose delayed instant is after `now`)."""
    if not row.jitter:
        return _cron.next_after(row.cron, row.timezone, now, row.name)
    return next_run(row.cron, row.timezone, row.name, now, row.jitter)


def nominal_slot(row: DueRow) -> datetime:
    """The slot the row's ``next_run_at`` stands for (the same instant without jitter)."""
    if not row.jitter:
        return row.next_run_at
    return slot_of(row.cron, row.timezone, row.name, row.next_run_at, row.jitter)


MAX_COUNTED = 1000
"""Coalesced slots are counted up to this many (a per-second task down for a day)."""


def passed(row: Schedule, slot: datetime, now: datetime) -> int:
    """How many of the row's slots after `slot` were due by `now` (merged into this run)."""
    count = 0
    at = _cron.next_after(row.cron, row.timezone, slot, row.name)
    if at > now:
        return 0
    while at <= now and count < MAX_COUNTED:
        if at + jitter_delay(row.name, at, row.jitter) <= now:
            count += 1
        at = _cron.next_after(row.cron, row.timezone, at, row.name)
    return count


def dst_cases(
    row: Schedule, now: datetime, following: datetime
) -> tuple[tuple[str, datetime], ...]:
    """The DST cases between `now` and the row's next slot (``following``, jittered)."""
    slot = following
    if row.jitter:
        slot = slot_of(row.cron, row.timezone, row.name, following, row.jitter)
    return _cron.dst_notes(row.cron, row.timezone, row.name, now, slot)


# -- a disabled row: the slots that passed meanwhile ---------------------------------------
PAUSED_LOGGED = 100
"""Slots passed while disabled that get an entry each; the rest are counted in the last one."""
PAUSED_COUNTED = 10_000
"""Passed slots are counted up to this many."""


def passed_slots(
    row: Schedule, was_due: datetime | None, now: datetime
) -> tuple[list[datetime], int]:
    """The slots of a disabled `row` that passed by `now`, from the one it was due at when
    disabled (`was_due`, its ``next_run_at`` then): the first :data:`PAUSED_LOGGED`, and how
    many more (counted up to :data:`PAUSED_COUNTED`)."""
    if was_due is None:
        return [], 0
    cron, tz, name = row.cron, row.timezone, row.name
    slot = slot_of(cron, tz, name, was_due, row.jitter)
    found: list[datetime] = []
    more = 0
    while slot <= now and more < PAUSED_COUNTED:
        if len(found) < PAUSED_LOGGED:
            found.append(slot)
        else:
            more += 1
        slot = _cron.next_after(cron, tz, slot, name)
    return found, more


class FirstRuns:
    """``next_run_at`` for rows armed at one instant (a sync at ``now``), computed once per
    schedule: tasks whose cron, zone and H draw (:func:`~scheduler._model.cron.hash_free`) are
    equal share their next slot."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.found: dict[tuple[str, str, str], datetime] = {}

    def next(self, task: Schedule, free: str | None) -> datetime:
        """The first run of `task` after ``now``; `free` its cron's H-free form, if drawn."""
        if task.jitter:  # a delay of its own per task
            return first_run(task.cron, task.timezone, task.name, self.now, task.jitter)
        if free is None:  # a schedule the check did not draw (unchanged): draw it now
            free = _cron.hash_free(task.cron, task.name)
        key = (task.cron, task.timezone, free)
        slot = self.found.get(key)
        if slot is None:
            slot = _cron.next_after(task.cron, task.timezone, self.now, task.name)
            self.found[key] = slot
        return slot


# -- the next fires, as explain, the dashboard and a preview show them ---------------------
NEXT_FIRES = 10
"""Fires ``explain`` and the Task page show."""


@dataclass(frozen=True)
class Fire:
    """One coming fire of a task."""

    slot: datetime
    """The nominal slot (UTC), before jitter."""
    at: datetime
    """When it fires (UTC): the slot and its jitter."""
    local: datetime
    """`at` in the task's zone."""
    dst: str | None
    """``UTC+01:00 → UTC+02:00`` where the zone's offset differs from the previous fire's."""
    dst_case: str | None
    """``dst_gap`` for a slot moved out of a spring-forward gap, else None."""
    skipped_repeats: tuple[datetime, ...]
    """The repeated instants of a fall-back before it that a fixed-time task does not fire."""

    def as_dict(self) -> dict[str, object]:
        return {
            "slot": iso(self.slot),
            "at": iso(self.at),
            "local": self.local.isoformat(),
            "dst": self.dst,
            "dst_case": self.dst_case,
            "skipped_repeats": [iso(when) for when in self.skipped_repeats],
        }


def next_fires(
    task: Schedule,
    now: datetime,
    count: int = NEXT_FIRES,
    *,
    next_run_at: datetime | None = None,
) -> list[Fire]:
    """The task's next `count` fires: from the slot its `next_run_at` stands for (an enabled
    row's), else from its first slot after `now`. Each fire is its slot delayed by the task's
    jitter, marked where the zone's UTC offset changes and where the DST policy moved or
    skipped an instant."""
    zone = ZoneInfo(task.timezone)
    cron, tz, name = task.cron, task.timezone, task.name
    if next_run_at is not None:
        slot = slot_of(cron, tz, name, next_run_at, task.jitter)
        start = min(slot, now)
    else:
        start = now
        slot = _cron.next_after(cron, tz, now, name)
    fires: list[Fire] = []
    previous = offset_in(zone, start)
    before = start
    for _ in range(count):
        at = slot + jitter_delay(name, slot, task.jitter)
        offset = offset_in(zone, slot)
        shift = None if offset == previous else f"{utc_offset(previous)} → {utc_offset(offset)}"
        cases = _cron.dst_notes(cron, tz, name, before, slot)
        fires.append(
            Fire(
                slot=slot,
                at=at,
                local=in_zone(at, zone),
                dst=shift,
                dst_case=next((kind for kind, when in cases if when == slot), None),
                skipped_repeats=tuple(when for kind, when in cases if kind == "dst_repeat"),
            )
        )
        previous, before = offset, slot
        slot = _cron.next_after(cron, tz, slot, name)
    return fires


def utc_offset(delta: timedelta | None) -> str:
    """``UTC+01:00`` for a zone's offset."""
    minutes = int((delta or timedelta(0)).total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


# -- backfill: the slots of a past range ---------------------------------------------------
_EPSILON = timedelta(microseconds=1)


def localize(value: datetime, zone: str) -> datetime:
    """An aware instant in UTC; a naive ``value`` is a wall-clock time in ``zone``."""
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=ZoneInfo(zone))
    return value.astimezone(UTC)


def backfill_slots(
    cron: str, zone: str, name: str, start: datetime, end: datetime, limit: int
) -> list[datetime]:
    """The slots in ``[start, end)``, oldest first; at most ``limit + 1`` (one more than
    ``limit`` says "too many" without walking a huge range to its end)."""
    found: list[datetime] = []
    at = start - _EPSILON  # next_after is strictly after: ``start`` itself may be a slot
    while len(found) <= limit:
        slot = _cron.next_after(cron, zone, at, name)
        if slot >= end:
            break
        if slot >= start:
            found.append(slot)
        at = slot
    return found
