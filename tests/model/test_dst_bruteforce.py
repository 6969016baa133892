"""The DST rule (SPEC §2) against an independent brute force, in every zone whose clock shifts
by something other than one hour (Australia/Lord_Howe's 30 minutes, Antarctica/Troll's
two hours).

The transitions are found by scanning every zone zoneinfo ships, a week at a time (no zone
shifts twice within a week), over the years ``YEARS`` (three recent years: every such zone's
shifts there, both directions). For each
transition the expected fire times come from walking the clock one second at a time, never from
croniter, for 5-field expressions and 6-field ones (seconds last; issue 37):

- wildcard or step hour (real time): every real second whose local wall clock matches the
  second, minute and hour fields fires; a repeated wall-clock time fires twice, one inside a
  gap never;
- fixed hour: every wall-clock second of each local date that matches fires once, at its first
  occurrence; one that does not exist (a gap) fires at the first instant after the jump.
"""

from __future__ import annotations

import zoneinfo
from bisect import bisect_right
from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import accumulate, product
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from scheduler._model import cron as _cron
from scheduler._model.cron import next_after

YEARS = (2024, 2025, 2026)
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)


@cache
def odd_transitions() -> tuple[tuple[str, datetime, timedelta], ...]:
    """(zone, first UTC instant of the new offset, shift) for every shift that is not 1 h."""
    start = datetime(YEARS[0], 1, 1, tzinfo=UTC)
    end = datetime(YEARS[-1] + 1, 1, 1, tzinfo=UTC)
    found = []
    for name in sorted(zoneinfo.available_timezones()):
        zone = ZoneInfo(name)

        def offset(t: datetime, zone: ZoneInfo = zone) -> timedelta:
            value = t.astimezone(zone).utcoffset()
            assert value is not None
            return value

        t, before = start, offset(start)
        while t < end:
            step = t + timedelta(days=7)
            after = offset(step)
            if after != before:
                lo, hi = t, step  # offset(lo) == before, offset(hi) == after
                while hi - lo > timedelta(seconds=1):
                    mid = lo + (hi - lo) / 2
                    lo, hi = (mid, hi) if offset(mid) == before else (lo, mid)
                if abs(after - before) != HOUR:
                    found.append((name, hi.replace(microsecond=0), after - before))
            t, before = step, after
    return tuple(found)


def test_the_scan_finds_the_zones_of_the_issue() -> None:
    zones = {name for name, _, _ in odd_transitions()}
    assert {"Australia/Lord_Howe", "Antarctica/Troll"} <= zones
    for name in zones:  # both directions in each year
        shifts = [d for n, _, d in odd_transitions() if n == name]
        assert any(d > timedelta(0) for d in shifts) and any(d < timedelta(0) for d in shifts)


def _field(text: str, low: int, high: int) -> set[int]:
    """The values of one minute or hour field: ``*``, ``*/n``, ``a,b``, ``n``."""
    if text == "*":
        return set(range(low, high + 1))
    if text.startswith("*/"):
        return set(range(low, high + 1, int(text[2:])))
    return {int(part) for part in text.split(",")}


@cache
def _walls(tz: str, start: datetime, end: datetime) -> tuple[list[datetime], list[datetime]]:
    """Every whole second in (start, end] and its naive wall-clock time in ``tz``."""
    zone = ZoneInfo(tz)
    instants = [start + SECOND * i for i in range(1, (end - start) // SECOND + 1)]
    return instants, [t.astimezone(zone).replace(tzinfo=None) for t in instants]


@cache  # the same for both clocks
def brute_force(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    """Fire instants in (start, end], walked second by second (see the module docstring); a
    5-field expression fires at second 0, a 6-field one at the seconds of its last field."""
    fields = expr.split()
    minutes, hours = _field(fields[0], 0, 59), _field(fields[1], 0, 23)
    seconds = _field(fields[5], 0, 59) if len(fields) == 6 else {0}
    real_time = "*" in fields[1]
    instants, walls = _walls(tz, start, end)
    if real_time:
        return [
            t
            for t, w in zip(instants, walls, strict=True)
            if (w.second in seconds and w.minute in minutes and w.hour in hours)
        ]
    first: dict[datetime, datetime] = {}  # each wall-clock time's first occurrence
    for t, w in zip(instants, walls, strict=True):
        first.setdefault(w, t)
    highest = list(accumulate(walls, max))  # the latest wall-clock time reached so far
    fired: set[datetime] = set()
    first_day = (start - timedelta(days=2)).astimezone(ZoneInfo(tz)).date()
    for day in range(5 + (end - start).days):
        date = first_day + timedelta(days=day)
        for hour, minute, second in product(sorted(hours), sorted(minutes), sorted(seconds)):
            wall = datetime(date.year, date.month, date.day, hour, minute, second)
            # First occurrence of that wall-clock time; if it never occurs (a gap), the
            # first instant whose wall clock is past it.
            at = first.get(wall)
            if at is None and walls[0] < wall <= walls[-1]:  # inside the window: a gap
                at = instants[bisect_right(highest, wall)]
            if at is not None:
                fired.add(at)
    return sorted(fired)


def scheduled(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    fired, t = [], start
    while (t := next_after(expr, tz, t, "dst")) <= end:
        fired.append(t)
    return fired


def scheduled_under(
    clock: str, exprs: list[str], tz: str, start: datetime, end: datetime
) -> dict[str, list[datetime]]:
    """:func:`scheduled` for each expression, with real datetimes or under freezegun: there
    ``start`` and every result are FakeDatetimes, whose ``astimezone`` drops ``fold``. The
    memoised slots are emptied first, so the frozen run computes its own."""
    if clock == "real":
        return {expr: scheduled(expr, tz, start, end) for expr in exprs}
    _cron._next.cache_clear()
    try:
        with freeze_time(start, ignore=["_pytest"]):
            fake = datetime.fromtimestamp(start.timestamp(), UTC)
            assert type(fake) is not type(start)  # a FakeDatetime
            return {expr: scheduled(expr, tz, fake, end) for expr in exprs}
    finally:
        _cron._next.cache_clear()


def expressions(tz: str, at: datetime, shift: timedelta) -> list[str]:
    zone = ZoneInfo(tz)
    before = (at - MINUTE).astimezone(zone)
    after = at.astimezone(zone)
    hours = sorted({before.hour, after.hour, (before.hour + 1) % 24, (after.hour - 1) % 24})
    fixed = [f"*/10 {h} * * *" for h in hours] + [
        f"30 {before.hour},{after.hour} * * *",
        f"0 {after.hour} * * *",
        f"{before.minute} {before.hour} * * *",
        f"15,45 {','.join(map(str, hours))} * * *",
    ]
    real = ["*/20 * * * *", "*/10 * * * *", "30 * * * *", "0 * * * *", "*/15 */2 * * *"]
    # With a seconds field (the sixth): a fixed-hour slot in a gap fires at the gap's end,
    # second 0, whatever its own seconds (issue 37: Riga's 04:00:11, Lord Howe's lost 02:30).
    fixed_seconds = [
        f"30 {before.hour},{after.hour} * * * 11,22",
        f"*/10 {','.join(map(str, hours))} * * * 52",
        f"{before.minute} {before.hour} * * * 0,30",
        f"0,15,30,45 {after.hour} * * * 59",
    ]
    real_seconds = ["*/20 * * * * 0,30", "0 * * * * 59", "*/15 */2 * * * 7"]
    return real + fixed + real_seconds + fixed_seconds


# The same brute force holds for ordinary one-hour shifts: a control on two common zones.
ONE_HOUR = [
    ("Europe/Berlin", datetime(2026, 3, 29, 1, tzinfo=UTC), HOUR),
    ("Europe/Berlin", datetime(2026, 10, 25, 1, tzinfo=UTC), -HOUR),
    ("America/New_York", datetime(2026, 3, 8, 7, tzinfo=UTC), HOUR),
    ("America/New_York", datetime(2026, 11, 1, 6, tzinfo=UTC), -HOUR),
]
CASES = [
    pytest.param(
        tz, at, shift, id=f"{tz}-{at:%Y-%m-%d}-{'fwd' if shift > timedelta(0) else 'back'}"
    )
    for tz, at, shift in (*odd_transitions(), *ONE_HOUR)
]


@pytest.mark.parametrize("clock", ["real", "freezegun"])
@pytest.mark.parametrize(("tz", "at", "shift"), CASES)
def test_every_odd_shift_matches_the_brute_force(
    tz: str, at: datetime, shift: timedelta, clock: str
) -> None:
    # (start, end]: from 3 hours before the shift to 3 hours after it, plus the shift itself.
    start = at - 3 * HOUR
    end = at + abs(shift) + 3 * HOUR
    exprs = expressions(tz, at, shift)
    scheduled_by = scheduled_under(clock, exprs, tz, start, end)
    zone = ZoneInfo(tz)
    wrong = {}
    for expr in exprs:
        want, got = brute_force(expr, tz, start, end), scheduled_by[expr]
        if want != got:
            wrong[expr] = {
                "missing": [
                    f"{zone.fromutc(t.replace(tzinfo=zone)):%H:%M%z}" for t in want if t not in got
                ],
                "extra": [
                    f"{zone.fromutc(t.replace(tzinfo=zone)):%H:%M%z}" for t in got if t not in want
                ],
            }
    assert wrong == {}


def test_lord_howe_fall_back_fires_the_repeated_0140() -> None:
    """The issue's case: clocks go back from 02:00 (+11) to 01:30 (+10:30)."""
    tz = "Australia/Lord_Howe"
    after = datetime(2026, 4, 4, 14, 35, tzinfo=UTC)  # 01:35 +11
    local = [
        f"{t.astimezone(ZoneInfo(tz)):%H:%M%z}"
        for t in scheduled("*/20 * * * *", tz, after, after + 2 * HOUR)
    ]
    assert local[:4] == ["01:40+1100", "01:40+1030", "02:00+1030", "02:20+1030"]
