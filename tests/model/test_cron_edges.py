"""Two cron edge cases of issue 37 (item 10), found against an independent implementation.

(a) A fixed-hour slot with a seconds field inside a spring-forward gap fires at the first
instant after the gap, second 0, and no slot is lost in a 30-minute gap. (b) With both day
fields restricted, a day matching either fires (cron(8)), so ``0 0 31 2 MON`` is every Monday
in February, not an error. Where our rule and Debian cron's agree (a fixed minute and hour,
or a day-of-month/day-of-week choice in a zone without DST), the fire times are compared with
cronsim's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduler._model.cron import dst_notes, next_after, validate_cron


def fires(expr: str, tz: str, after: datetime, count: int) -> list[str]:
    """The next `count` fires of `expr` after `after`, as local ISO times."""
    out, t = [], after
    for _ in range(count):
        t = next_after(expr, tz, t, "edge")
        out.append(t.astimezone(ZoneInfo(tz)).isoformat())
    return out


def fires_until(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    out, t = [], start
    while (t := next_after(expr, tz, t, "edge")) <= end:
        out.append(t)
    return out


def test_riga_gap_slots_with_seconds_fire_at_the_gap_end_second_0() -> None:
    # 2021-03-28: Riga's clocks go from 03:00 (+02) to 04:00 (+03); 03:30:11 and 03:30:22
    # do not exist and merge into one fire at 04:00:00.
    after = datetime(2021, 3, 27, 22, tzinfo=UTC)
    assert fires("30 1,2,3,4 * * * 11,22", "Europe/Riga", after, 7) == [
        "2021-03-28T01:30:11+02:00",
        "2021-03-28T01:30:22+02:00",
        "2021-03-28T02:30:11+02:00",
        "2021-03-28T02:30:22+02:00",
        "2021-03-28T04:00:00+03:00",
        "2021-03-28T04:30:11+03:00",
        "2021-03-28T04:30:22+03:00",
    ]
    gap_fire = datetime(2021, 3, 28, 1, tzinfo=UTC)  # 04:00:00+03
    before = gap_fire - timedelta(seconds=1)
    assert dst_notes("30 1,2,3,4 * * * 11,22", "Europe/Riga", "edge", before, gap_fire) == (
        ("dst_gap", gap_fire),
    )


def test_lord_howe_half_hour_gap_loses_no_slot() -> None:
    # 2021-10-03 (a Sunday): 02:00 (+10:30) jumps to 02:30 (+11); the slots 02:00:52 to
    # 02:29:52 merge into one fire at 02:30:00, then 02:30:52 fires as usual.
    after = datetime(2021, 10, 2, 13, tzinfo=UTC)
    assert fires("* 2-3 1-4/10 5-10 0-3/2 52", "Australia/Lord_Howe", after, 3) == [
        "2021-10-03T02:30:00+11:00",
        "2021-10-03T02:30:52+11:00",
        "2021-10-03T02:31:52+11:00",
    ]


def test_a_gap_slot_is_not_fired_again_after_the_gap() -> None:
    at = datetime(2021, 3, 28, 1, tzinfo=UTC)  # Riga's 04:00:00+03, where the gap's slots fired
    assert fires("30 1,2,3,4 * * * 11,22", "Europe/Riga", at, 1) == ["2021-03-28T04:30:11+03:00"]


def test_feb_31_or_monday_is_every_monday_in_february() -> None:
    assert validate_cron("0 0 31 2 MON", "edge") == "0 0 31 2 MON"
    after = datetime(2026, 1, 1, tzinfo=UTC)
    assert fires("0 0 31 2 MON", "Europe/Berlin", after, 5) == [
        "2026-02-02T00:00:00+01:00",
        "2026-02-09T00:00:00+01:00",
        "2026-02-16T00:00:00+01:00",
        "2026-02-23T00:00:00+01:00",
        "2027-02-01T00:00:00+01:00",
    ]


@pytest.mark.parametrize("expr", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6 *", "0 0 31 2 ?"])
def test_a_day_that_never_comes_without_a_day_of_week_is_still_refused(expr: str) -> None:
    with pytest.raises(ValueError, match="can never occur"):
        validate_cron(expr, "edge")


# -- against cronsim ----------------------------------------------------------------------
def cronsim_fires(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    cronsim = pytest.importorskip("cronsim")
    fields = expr.split()
    theirs = " ".join([fields[5], *fields[:5]]) if len(fields) == 6 else expr  # seconds first
    out = []
    for t in cronsim.CronSim(theirs, start.astimezone(ZoneInfo(tz))):
        if (utc := t.astimezone(UTC)) > end:
            return out
        out.append(utc)
    return out


DAY_CHOICES = [
    "0 0 31 2 MON",
    "0 9 1,15 * MON",
    "30 6 13 * FRI",
    "0 12 29 2 SUN",
    "15 3 L * 1-5",
    "0 0 1 1,7 SAT,SUN",
    "0 0 31 4,6,9,11 WED",
    "0 0 31 2 MON 30",
]


@pytest.mark.parametrize("expr", DAY_CHOICES)
def test_both_day_fields_agree_with_cronsim_over_four_years(expr: str) -> None:
    start, end = datetime(2024, 1, 1, tzinfo=UTC), datetime(2028, 1, 1, tzinfo=UTC)
    assert fires_until(expr, "UTC", start, end) == cronsim_fires(expr, "UTC", start, end)


# A fixed minute and a fixed hour: Debian cron's "fixed-time" jobs, the same rule as ours.
FIXED = ["30 1,2,3,4 * * *", "0 2 * * *", "45 1 * * *", "0,30 0-4 * * *", "15 2,3 * * *"]
SHIFTS = [
    ("Europe/Riga", datetime(2021, 3, 28, 1, tzinfo=UTC)),
    ("Europe/Riga", datetime(2021, 10, 31, 1, tzinfo=UTC)),
    ("Australia/Lord_Howe", datetime(2021, 10, 2, 15, 30, tzinfo=UTC)),
    ("Australia/Lord_Howe", datetime(2021, 4, 3, 15, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 3, 8, 7, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 11, 1, 6, tzinfo=UTC)),
    ("Antarctica/Troll", datetime(2024, 3, 31, 1, tzinfo=UTC)),
]


@pytest.mark.parametrize("expr", FIXED)
@pytest.mark.parametrize(("tz", "at"), SHIFTS, ids=[f"{tz}-{at:%Y-%m-%d}" for tz, at in SHIFTS])
def test_fixed_time_slots_around_a_shift_agree_with_cronsim(
    expr: str, tz: str, at: datetime
) -> None:
    start, end = at - timedelta(hours=30), at + timedelta(hours=30)
    assert fires_until(expr, tz, start, end) == cronsim_fires(expr, tz, start, end)
