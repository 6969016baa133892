"""Cron evaluation and the DST policy (classic cron(8); docs/explanation/dst.md).

Cron is evaluated in the row's IANA zone. A task whose hour field is fixed fires once per local
date and wall-clock time: on fall-back only at the first occurrence, and a slot inside the
spring-forward gap fires at the first instant after the jump. A task whose hour field is a
wildcard or a step follows real time: both repeated hours run, the missing hour is skipped.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from croniter.croniter import MARKER, HashExpander

from .rules import did_you_mean
from .time import in_zone, offset_in

__all__ = [
    "dst_notes",
    "has_fixed_hour",
    "hash_free",
    "next_after",
    "validate_cron",
    "validate_timezone",
]

NICKNAMES = frozenset(
    {"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"}
)
# An hour's worth of one-second slots is the most a fall-back can make us skip (two hours for
# Antarctica/Troll); anything beyond this bound is a bug, not a schedule.
MAX_SKIPS = 10_000
_DAY, _SECOND = timedelta(days=1), timedelta(seconds=1)


def validate_timezone(tz: str) -> ZoneInfo:
    """Return the ZoneInfo for an IANA zone name, or raise ValueError."""
    if not tz:
        raise ValueError("timezone must not be empty")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        from zoneinfo import available_timezones  # only for a mistake: it reads every zone

        hint = did_you_mean(tz, available_timezones())
        raise ValueError(f"unknown timezone {tz!r}{hint}") from None


# A field (or one item of a comma list) that croniter hashes: H, H(a-b), H/n, H(a-b)/n.
_HASHED = re.compile(r"(?:^|[\s,])h(?:\(|/|,|\s|$)", re.IGNORECASE)


def _hash_id(expr: str, name: str) -> bytes | None:
    # With a hash_id croniter turns nicknames into Jenkins forms (@daily -> "H H * * * H");
    # we keep their classic meaning (@daily = midnight) and hash only explicit H fields.
    # Without an H field the name changes nothing, so rows share one parsed iterator.
    # Bytes, because croniter.expand (unlike the constructor) does not encode a str.
    if expr.lstrip().startswith("@") or not _HASHED.search(expr):
        return None
    return name.encode()


def _check_syntax(expr: str) -> str | None:
    """Return why `expr` is outside our dialect, or None; croniter checks the rest."""
    fields = expr.split()
    if not fields:
        return "empty expression"
    if fields[0].startswith("@"):
        if len(fields) == 1 and fields[0].lower() in NICKNAMES:
            return None
        return f"unsupported nickname (use one of {', '.join(sorted(NICKNAMES))})"
    if len(fields) not in (5, 6):
        return f"expected 5 fields (6 with seconds), got {len(fields)}"
    if any(f.lower().startswith("r") for f in fields):
        return "R (random) is not supported, use H"
    return None


_EXPANDER = HashExpander(croniter)  # type: ignore[arg-type]  # the stub wants an instance
_FIELD = re.compile(r"\S+", re.ASCII)  # how croniter splits an expression into fields


@functools.lru_cache(maxsize=4096)
def _hashed_fields(expr: str) -> tuple[tuple[int, str, re.Match[str]], ...]:
    """The fields of `expr` that croniter hashes: index, lower-cased field, and its match."""
    if _hash_id(expr, "") is None:
        return ()
    fields = _FIELD.findall(expr.lower())
    found = ((i, f, _EXPANDER.match(None, i, f)) for i, f in enumerate(fields))
    return tuple((i, f, m) for i, f, m in found if m is not None)


def hash_free(expr: str, name: str) -> str:
    """`expr` with each H field replaced by what croniter draws for `name` (``H * * * *`` for
    "a" is ``27 * * * *``): two tasks whose forms are equal run on the same schedule, so a
    check or a next slot computed for one holds for the other. `expr` itself without H fields.

    The fields go through croniter's own ``HashExpander``, as ``croniter(expr, hash_id=...)``
    does; tests/model/test_cron_hash.py pins that the two expand alike.
    """
    hashed = _hashed_fields(expr)
    if not hashed:
        return expr
    fields = _FIELD.findall(expr.lower())
    hash_id = name.encode()
    for i, field, match in hashed:
        fields[i] = _EXPANDER.expand(None, i, field, hash_id=hash_id, match=match)
    return " ".join(fields)


_DOW = 4  # the index of the day-of-week field in croniter's expansion


def _expand_strictly(expr: str, hash_id: bytes | None = None) -> None:
    """Raise CroniterError unless croniter reads `expr`, refusing a day of the month that can
    never occur in its months (``0 0 31 2 *``), as croniter's strict mode does, but only when
    the day of the week is a wildcard: with both day fields restricted, cron(8) fires on a
    day that matches either (``0 0 31 2 MON``: every Monday in February)."""
    expanded, _ = croniter.expand(expr, hash_id=hash_id)
    if expanded[_DOW] == ["*"]:
        croniter.expand(expr, hash_id=hash_id, strict=True)


@functools.lru_cache(maxsize=65536)
def _is_valid(expr: str, free: str) -> bool:
    """Whether `expr`, drawn as `free`, passes :func:`validate_cron` (checked once per form)."""
    if _check_syntax(expr) is not None:
        return False
    try:
        _expand_strictly(free)
        croniter(free, datetime.now(UTC)).get_next(datetime)
    except CroniterError:
        return False
    return True


def validate_cron(expr: str, name: str) -> str:
    """Raise ValueError if `expr` is not a cron expression this scheduler can run; return its
    :func:`hash_free` form for `name`."""
    try:
        free = hash_free(expr, name)
        if _is_valid(expr, free):
            return free  # each distinct expression (each H draw) is checked once
    except CroniterError:
        pass  # a bad H field: the full check below says why
    reason = _check_syntax(expr)
    if reason is None:
        hash_id = _hash_id(expr, name)
        try:
            _expand_strictly(expr, hash_id)
            croniter(expr, datetime.now(UTC), hash_id=hash_id).get_next(datetime)
        except CroniterError as exc:
            reason = str(exc) or type(exc).__name__
    if reason is not None:
        raise ValueError(f"invalid cron expression {expr!r}: {reason}")
    return hash_free(expr, name)  # not reached while _is_valid agrees with the check above


def has_fixed_hour(expr: str) -> bool:
    """True when the hour field names fixed hours (number, list, range, bare H)."""
    fields = expr.split()
    if len(fields) == 1:
        return fields[0].lower() != "@hourly"
    hour = fields[1]
    return "*" not in hour and "/" not in hour


def _is_repeat(local: datetime) -> bool:
    """True for the second occurrence of an ambiguous (fall-back) wall-clock time."""
    return local.fold == 1 and local.utcoffset() != local.replace(fold=0).utcoffset()


class _Croniter(croniter):
    """croniter whose UTC -> local conversion keeps ``fold`` (the second 02:30 of a fall-back).

    croniter converts with ``astimezone``; under freezegun that returns a FakeDatetime without
    its ``fold`` (spulec/freezegun#422) and iteration gets stuck in a repeated hour; ``fromutc``
    sets ``fold`` itself, whatever the datetime class.
    """

    def timestamp_to_datetime(self, timestamp: float, tzinfo: Any = MARKER) -> datetime:
        zone = self.tzinfo if tzinfo is MARKER else tzinfo
        naive = super().timestamp_to_datetime(timestamp, None)
        return naive if zone is None else zone.fromutc(naive.replace(tzinfo=zone))


@functools.lru_cache(maxsize=4096)
def _iterator(expr: str, tz: str, hash_id: bytes | None) -> croniter:
    """A parsed expression, reused across calls (parsing is most of a call's cost)."""
    return _Croniter(expr, datetime.now(ZoneInfo(tz)), hash_id=hash_id)


_lock = threading.Lock()


def next_after(expr: str, tz: str, after: datetime, name: str) -> datetime:
    """First slot of `expr` in zone `tz` strictly after `after`, as an aware UTC datetime."""
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError("after must be timezone-aware")
    return _next(expr, tz, _hash_id(expr, name), after.astimezone(UTC))


@functools.lru_cache(maxsize=4096)
def _fixed_offset_iterator(expr: str, seconds: int, hash_id: bytes | None) -> croniter:
    """A parsed expression read at one fixed UTC offset."""
    zone = timezone(timedelta(seconds=seconds))
    return _Croniter(expr, datetime.now(zone), hash_id=hash_id)


def _offset(zone: ZoneInfo, at: datetime) -> timedelta:
    return offset_in(zone, at)


def _offset_changes(zone: ZoneInfo, start: datetime, end: datetime) -> datetime | None:
    """The first instant in (start, end] whose UTC offset differs from ``start``'s, to the
    second, or None. Probed a day apart, then bisected: zones shift at most once a day."""
    before = _offset(zone, start)
    lo = start
    while lo < end:
        hi = min(lo + _DAY, end)
        if _offset(zone, hi) != before:
            # Shifts fall on whole seconds: bisect whole seconds, lo old offset, hi new.
            low, high = math.floor(lo.timestamp()), math.ceil(hi.timestamp())
            while high - low > 1:
                mid = (low + high) // 2
                at = datetime.fromtimestamp(mid, UTC)
                low, high = (mid, high) if _offset(zone, at) == before else (low, mid)
            return datetime.fromtimestamp(high, UTC)
        lo = hi
    return None


def _next_real_time(expr: str, tz: str, hash_id: bytes | None, after_utc: datetime) -> datetime:
    """The first instant after ``after_utc`` whose wall clock in ``tz`` matches ``expr``.

    Between two shifts of the zone's offset the wall clock is the UTC clock plus a constant,
    so the expression is read at that fixed offset; a slot found past a shift is dropped and
    the search starts again at the shift with the new offset. A repeated wall-clock time thus
    fires in both offsets and one inside a gap never, whatever the size of the shift.
    """
    zone = ZoneInfo(tz)
    start = after_utc
    for _ in range(MAX_SKIPS):
        offset = _offset(zone, start)
        it = _fixed_offset_iterator(expr, int(offset.total_seconds()), hash_id)
        with _lock:  # a cached iterator is stateful
            # From the instant itself when it is a shift's first second: strictly after the
            # second before it (slots are whole seconds).
            base = start if start == after_utc else start - _SECOND
            it.set_current(base.timestamp(), force=True)
            candidate: datetime = it.get_next(datetime).astimezone(UTC)
        shift = _offset_changes(zone, start, candidate)
        if shift is None:
            return candidate
        start = shift
    raise RuntimeError(f"no slot found for cron {expr!r} in {tz} after {after_utc.isoformat()}")


def _wall_to_instant(zone: ZoneInfo, wall: datetime) -> datetime:
    """The instant a fixed-hour slot at the naive wall-clock time `wall` fires in `zone`: its
    first occurrence, or for a time inside a spring-forward gap the first instant after the
    gap (the shift itself, whatever the slot's minutes and seconds)."""
    naive = wall.replace(tzinfo=None, fold=0)
    early = zone.utcoffset(naive)  # fold=0: the offset before a shift, for a gap or a repeat
    assert early is not None
    utc = (naive - early).replace(tzinfo=UTC)
    if in_zone(utc, zone).replace(tzinfo=None, fold=0) == naive:
        return utc  # the wall-clock time exists: its first occurrence
    late = zone.utcoffset(naive.replace(fold=1))  # in a gap: the offset after the shift
    assert late is not None
    shift = _offset_changes(zone, (naive - late).replace(tzinfo=UTC), utc)
    assert shift is not None  # the two readings of a gap straddle its shift
    return shift


def _next_fixed_hour(expr: str, tz: str, hash_id: bytes | None, after_utc: datetime) -> datetime:
    """The first slot after ``after_utc`` of a fixed-hour ``expr`` in ``tz``.

    The expression is walked on the wall clock alone (read at offset 0, where no time is
    missing or repeated), from the wall-clock time of ``after_utc``; each wall-clock time is
    mapped to its instant (:func:`_wall_to_instant`): a repeated time to its first occurrence,
    one inside a gap to the gap's end, where all the gap's slots merge into one fire.
    """
    zone = ZoneInfo(tz)
    it = _fixed_offset_iterator(expr, 0, hash_id)
    wall = in_zone(after_utc, zone).replace(tzinfo=UTC, fold=0)
    with _lock:  # a cached iterator is stateful
        it.set_current(wall.timestamp(), force=True)
        for _ in range(MAX_SKIPS):
            candidate: datetime = it.get_next(datetime)
            utc = _wall_to_instant(zone, candidate)
            if utc > after_utc:
                return utc
    raise RuntimeError(f"no slot found for cron {expr!r} in {tz} after {after_utc.isoformat()}")


# One tick asks for the slot after the same `now` for every row with the same expression.
@functools.lru_cache(maxsize=1024)
def _next(expr: str, tz: str, hash_id: bytes | None, after_utc: datetime) -> datetime:
    if not has_fixed_hour(expr):
        return _next_real_time(expr, tz, hash_id, after_utc)
    return _next_fixed_hour(expr, tz, hash_id, after_utc)


# -- the DST cases the decision log records (SPEC §9) --------------------------------------
_UTC_ZONES = frozenset({"UTC", "Etc/UTC", "Etc/GMT", "GMT", "Etc/Universal", "Etc/Zulu"})


def dst_notes(
    expr: str, tz: str, name: str, after: datetime, slot: datetime
) -> tuple[tuple[str, datetime], ...]:
    """What the DST policy did on the way from `after` to `slot` (the next slot after it):
    ``("dst_gap", slot)`` when `slot` is a fixed-time slot moved out of a spring-forward gap,
    ``("dst_repeat", instant)`` for each repeated wall-clock instant of a fall-back that a
    fixed-time task does not fire at. Empty for real-time (wildcard hour) tasks, which follow
    real time, and for zones without DST."""
    if tz in _UTC_ZONES or not has_fixed_hour(expr):
        return ()
    return _dst_notes(expr, tz, _hash_id(expr, name), after.astimezone(UTC), slot)


@functools.lru_cache(maxsize=1024)
def _dst_notes(
    expr: str, tz: str, hash_id: bytes | None, after: datetime, slot: datetime
) -> tuple[tuple[str, datetime], ...]:
    zone = ZoneInfo(tz)
    before, then = _offset(zone, after), _offset(zone, slot)
    if before == then:
        return ()
    if then > before:  # spring forward: was the slot moved out of the gap?
        free = expr if hash_id is None else hash_free(expr, hash_id.decode())
        wall = in_zone(slot, zone).replace(tzinfo=None)
        if expr.startswith("@") or croniter.match(free, wall):
            return ()
        return (("dst_gap", slot),)
    found: list[tuple[str, datetime]] = []  # fall back: the repeats skipped before the slot
    it = _iterator(expr, tz, hash_id)
    with _lock:  # a cached iterator is stateful
        it.set_current(after.timestamp(), force=True)
        for _ in range(MAX_SKIPS):
            local: datetime = it.get_next(datetime)
            utc = local.astimezone(UTC)
            if utc >= slot:
                break
            if utc > after and _is_repeat(local):
                found.append(("dst_repeat", utc))
    return tuple(found)
