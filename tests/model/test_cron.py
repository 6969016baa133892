from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from scheduler._model import cron as _cron
from scheduler._model.cron import has_fixed_hour, next_after, validate_cron, validate_timezone

# Berlin: spring-forward 2026-03-29 02:00->03:00 (at 01:00Z),
#         fall-back 2026-10-25 03:00->02:00 (at 01:00Z).
# New York: spring-forward 2026-03-08 02:00->03:00 (at 07:00Z),
#           fall-back 2026-11-01 02:00->01:00 (at 06:00Z).
BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


@pytest.fixture(params=["real", "freezegun"])
def clock(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each DST test runs twice: with real datetimes, and under freezegun, where every datetime
    the test builds (``utc(...)``) is a FakeDatetime, whose ``astimezone`` drops ``fold``. The
    memoised results are emptied around it, so neither run reads the other's."""
    _cron._next.cache_clear()
    _cron._dst_notes.cache_clear()
    try:
        if request.param == "freezegun":
            with freeze_time("2020-06-01 12:00:00", ignore=["_pytest"]):
                yield
        else:
            yield
    finally:
        _cron._next.cache_clear()
        _cron._dst_notes.cache_clear()


def utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> datetime:
    return datetime(y, mo, d, h, mi, s, tzinfo=UTC)


def walk(expr: str, tz: str, after: datetime, until: datetime, name: str = "t") -> list[datetime]:
    """Every slot in (after, until], by feeding each result back as the next `after`."""
    out: list[datetime] = []
    while (slot := next_after(expr, tz, after, name)) <= until:
        out.append(slot)
        after = slot
    return out


def nxt(expr: str, tz: str, after: datetime) -> datetime:
    return next_after(expr, tz, after, "t")


def hours(start: datetime, count: int, step: timedelta = timedelta(hours=1)) -> list[datetime]:
    return [start + i * step for i in range(count)]


# --- fixed-hour expressions: once per local date and wall-clock time ---------------------------


@pytest.mark.usefixtures("clock")
def test_fixed_time_berlin_fall_back_fires_once_at_first_occurrence() -> None:
    got = walk("30 2 * * *", BERLIN, utc(2026, 10, 23, 12), utc(2026, 10, 27, 12))
    assert got == [
        utc(2026, 10, 24, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, first occurrence; 01:30Z (02:30 CET) skipped
        utc(2026, 10, 26, 1, 30),  # 02:30 CET
        utc(2026, 10, 27, 1, 30),
    ]


@pytest.mark.usefixtures("clock")
def test_fixed_time_berlin_spring_forward_fires_at_first_instant_after_jump() -> None:
    got = walk("30 2 * * *", BERLIN, utc(2026, 3, 27, 12), utc(2026, 3, 31, 12))
    assert got == [
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),  # 02:30 does not exist: 03:00 CEST
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
        utc(2026, 3, 31, 0, 30),
    ]


@pytest.mark.usefixtures("clock")
def test_fixed_time_new_york_fall_back_fires_once_at_first_occurrence() -> None:
    got = walk("30 1 * * *", NEW_YORK, utc(2026, 10, 31, 12), utc(2026, 11, 3, 12))
    assert got == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT; 06:30Z (01:30 EST) skipped
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
        utc(2026, 11, 3, 6, 30),
    ]


@pytest.mark.usefixtures("clock")
def test_fixed_time_new_york_spring_forward() -> None:
    got = walk("30 2 * * *", NEW_YORK, utc(2026, 3, 7, 0), utc(2026, 3, 10, 12))
    assert got == [
        utc(2026, 3, 7, 7, 30),  # 02:30 EST
        utc(2026, 3, 8, 7, 0),  # 02:30 does not exist: 03:00 EDT
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
        utc(2026, 3, 10, 6, 30),
    ]
    # an hour outside the gap is untouched on the transition day
    assert walk("30 1 * * *", NEW_YORK, utc(2026, 3, 8, 0), utc(2026, 3, 9, 0)) == [
        utc(2026, 3, 8, 6, 30)
    ]


@pytest.mark.usefixtures("clock")
def test_fixed_time_after_inside_repeated_hour_goes_to_next_day() -> None:
    # 01:10Z is 02:10 CET (the second pass): today's 02:30 already ran at 00:30Z
    assert nxt("30 2 * * *", BERLIN, utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 26, 1, 30)
    # 00:40Z is 02:40 CEST, just after the first occurrence
    assert nxt("30 2 * * *", BERLIN, utc(2026, 10, 25, 0, 40)) == utc(2026, 10, 26, 1, 30)
    # 00:10Z is 02:10 CEST: the first occurrence is still ahead
    assert nxt("30 2 * * *", BERLIN, utc(2026, 10, 25, 0, 10)) == utc(2026, 10, 25, 0, 30)


@pytest.mark.usefixtures("clock")
def test_fixed_hour_with_minute_step_runs_the_repeated_hour_once() -> None:
    fall = walk("*/15 2 * * *", BERLIN, utc(2026, 10, 24, 23), utc(2026, 10, 26, 23))
    assert fall == hours(utc(2026, 10, 25, 0), 4, timedelta(minutes=15)) + hours(
        utc(2026, 10, 26, 1), 4, timedelta(minutes=15)
    )
    spring = walk("*/15 2 * * *", BERLIN, utc(2026, 3, 28, 23), utc(2026, 3, 30, 12))
    # the whole 02:xx hour is missing: the gap's slots collapse into one run at 03:00 CEST
    assert spring == [utc(2026, 3, 29, 1), *hours(utc(2026, 3, 30, 0), 4, timedelta(minutes=15))]


@pytest.mark.usefixtures("clock")
def test_fixed_time_half_hour_dst_zone_fires_once() -> None:
    # Australia/Lord_Howe falls back 30 minutes on 2026-04-05 (02:00 +11 -> 01:30 +10:30)
    got = walk("45 1 * * *", "Australia/Lord_Howe", utc(2026, 4, 3, 12), utc(2026, 4, 6, 12))
    assert got == [
        utc(2026, 4, 3, 14, 45),
        utc(2026, 4, 4, 14, 45),  # 01:45 +11, first occurrence; 15:15Z (01:45 +10:30) skipped
        utc(2026, 4, 5, 15, 15),  # 01:45 +10:30
    ]


# --- wildcard and step hours: real time ---------------------------------------------------------


@pytest.mark.usefixtures("clock")
def test_hourly_berlin_follows_real_time() -> None:
    fall = walk("0 * * * *", BERLIN, utc(2026, 10, 24, 21, 30), utc(2026, 10, 25, 3, 30))
    # 00:00, 01:00, 02:00 CEST, 02:00 CET, 03:00, 04:00, 05:00 CET
    assert fall == hours(utc(2026, 10, 24, 22), 6)
    spring = walk("0 * * * *", BERLIN, utc(2026, 3, 28, 22, 30), utc(2026, 3, 29, 3, 30))
    # 00:00, 01:00 CET, then 03:00, 04:00, 05:00 CEST: no 02:00
    assert spring == hours(utc(2026, 3, 28, 23), 5)
    local = [d.astimezone(ZoneInfo(BERLIN)).hour for d in spring]
    assert local == [0, 1, 3, 4, 5]


@pytest.mark.usefixtures("clock")
def test_hourly_new_york_follows_real_time() -> None:
    fall = walk("0 * * * *", NEW_YORK, utc(2026, 11, 1, 3, 30), utc(2026, 11, 1, 8))
    assert fall == hours(utc(2026, 11, 1, 4), 5)  # 00 EDT, 01 EDT, 01 EST, 02 EST, 03 EST
    spring = walk("0 * * * *", NEW_YORK, utc(2026, 3, 8, 4, 30), utc(2026, 3, 8, 8))
    assert spring == hours(utc(2026, 3, 8, 5), 4)  # 00 EST, 01 EST, 03 EDT, 04 EDT


@pytest.mark.usefixtures("clock")
@pytest.mark.parametrize(
    ("tz", "spring", "fall"),
    [(BERLIN, (3, 29), (10, 25)), (NEW_YORK, (3, 8), (11, 1))],
)
@pytest.mark.usefixtures("clock")
def test_wildcard_hour_slot_counts_per_transition_day(
    tz: str, spring: tuple[int, int], fall: tuple[int, int]
) -> None:
    zone = ZoneInfo(tz)
    for (month, dom), expected_hours in ((spring, 23), (fall, 25)):
        start = datetime(2026, month, dom, tzinfo=zone) - timedelta(seconds=1)
        end = datetime(2026, month, dom, 23, 59, tzinfo=zone)
        assert len(walk("0 * * * *", tz, start, end)) == expected_hours
        half = walk("*/30 * * * *", tz, start, end)
        assert len(half) == 2 * expected_hours
        assert {b - a for a, b in itertools.pairwise(half)} == {timedelta(minutes=30)}


@pytest.mark.usefixtures("clock")
def test_step_half_hour_berlin_transitions_exact_instants() -> None:
    spring = walk("*/30 * * * *", BERLIN, utc(2026, 3, 28, 23, 45), utc(2026, 3, 29, 1, 30))
    # 01:00, 01:30 CET, 03:00, 03:30 CEST (02:00 and 02:30 do not exist)
    assert spring == hours(utc(2026, 3, 29, 0), 4, timedelta(minutes=30))
    fall = walk("*/30 * * * *", BERLIN, utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 2))
    # 02:00, 02:30 CEST, 02:00, 02:30 CET, 03:00 CET
    assert fall == hours(utc(2026, 10, 25, 0), 5, timedelta(minutes=30))


@pytest.mark.usefixtures("clock")
def test_step_half_hour_new_york_fall_back_exact_instants() -> None:
    fall = walk("*/30 * * * *", NEW_YORK, utc(2026, 11, 1, 4, 45), utc(2026, 11, 1, 7))
    # 01:00, 01:30 EDT, 01:00, 01:30 EST, 02:00 EST
    assert fall == hours(utc(2026, 11, 1, 5), 5, timedelta(minutes=30))


@pytest.mark.usefixtures("clock")
def test_after_inside_repeated_hour_wildcard() -> None:
    # 01:10Z is 02:10 CET (second pass): the next :20 is 02:20 CET, not 03:20
    assert nxt("20 * * * *", BERLIN, utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 25, 1, 20)


# Fall-backs whose shift is not a multiple of the step: each went wrong under
# freezegun (a repeated slot lost, or one that does not exist fired). As local wall-clock times.
FALL_BACKS = {
    # 2027-04-04 02:00 (+11) -> 01:30 (+10:30): 01:40 twice; 01:30 and 01:50 (+10:30) never
    "lord-howe": (
        "*/20 * * * *",
        "Australia/Lord_Howe",
        (2027, 4, 3, 14, 10),
        ["01:20+11:00", "01:40+11:00", "01:40+10:30", "02:00+10:30"],
    ),
    "berlin-5-every-2h": (
        "5 */2 * * *",
        BERLIN,
        (2027, 10, 30, 21, 0),
        ["00:05+02:00", "02:05+02:00", "02:05+01:00", "04:05+01:00"],
    ),
    "new-york-5-every-2h": (  # hour 1 (the repeated one) is not a slot of */2
        "5 */2 * * *",
        NEW_YORK,
        (2027, 11, 7, 3, 0),
        ["00:05-04:00", "02:05-05:00", "04:05-05:00"],
    ),
    "chatham-every-3h": (
        "0 */3 * * *",
        "Pacific/Chatham",
        (2027, 4, 3, 9, 15),
        ["00:00+13:45", "03:00+13:45", "03:00+12:45", "06:00+12:45"],
    ),
    "berlin-every-3h": (  # 03:00 CEST does not exist: 03:00 CET is next
        "0 */3 * * *",
        BERLIN,
        (2027, 10, 30, 20, 0),
        ["00:00+02:00", "03:00+01:00", "06:00+01:00"],
    ),
}


@pytest.mark.usefixtures("clock")
@pytest.mark.parametrize("case", list(FALL_BACKS))
def test_step_hours_across_a_fall_back_not_a_multiple_of_the_step(case: str) -> None:
    expr, tz, after, expected = FALL_BACKS[case]
    got, at = [], utc(*after)
    for _ in expected:
        at = nxt(expr, tz, at)
        got.append(at)
    zone = ZoneInfo(tz)
    # fromutc, not astimezone or fromtimestamp: under freezegun those drop the fold here too
    local = [zone.fromutc(t.replace(tzinfo=zone)) for t in got]
    assert [t.isoformat(timespec="minutes")[11:] for t in local] == expected


# --- syntax -------------------------------------------------------------------------------------


def test_seconds_field() -> None:
    got = walk("* * * * * */20", "UTC", utc(2026, 5, 1, 0, 0, 5), utc(2026, 5, 1, 0, 1, 0))
    assert got == [utc(2026, 5, 1, 0, 0, 20), utc(2026, 5, 1, 0, 0, 40), utc(2026, 5, 1, 0, 1)]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("@hourly", utc(2026, 1, 7, 13)),
        ("@daily", utc(2026, 1, 7, 23)),  # midnight Berlin (CET)
        ("@midnight", utc(2026, 1, 7, 23)),
        ("@weekly", utc(2026, 1, 10, 23)),  # Sunday 2026-01-11 00:00 CET
        ("@monthly", utc(2026, 1, 31, 23)),
        ("@yearly", utc(2026, 12, 31, 23)),
        ("@annually", utc(2026, 12, 31, 23)),
        ("@DAILY", utc(2026, 1, 7, 23)),
    ],
)
def test_nicknames_keep_classic_meaning(expr: str, expected: datetime) -> None:
    # the task name must not turn nicknames into hashed (Jenkins) forms
    assert next_after(expr, BERLIN, utc(2026, 1, 7, 12, 30), "some-task") == expected


def test_hash_is_deterministic_per_name_and_differs_between_names() -> None:
    after = utc(2026, 1, 1)
    alpha = next_after("H 3 * * *", "UTC", after, "alpha")
    assert alpha == next_after("H 3 * * *", "UTC", after, "alpha")
    assert alpha.hour == 3
    beta = next_after("H 3 * * *", "UTC", after, "beta")
    assert beta.hour == 3
    assert alpha != beta
    # the slot does not depend on where the search starts
    assert next_after("H 3 * * *", "UTC", utc(2026, 1, 1, 2), "alpha") == alpha


def test_missed_slots_coalesce() -> None:
    now = utc(2026, 6, 1, 12, 3, 17)  # months after the row was last due
    assert next_after("*/5 * * * *", "UTC", now, "t") == utc(2026, 6, 1, 12, 5)
    assert next_after("0 9 * * mon-fri", NEW_YORK, now, "t") == utc(2026, 6, 1, 13)  # 09:00 EDT


def test_slot_equal_to_after_is_not_returned() -> None:
    assert next_after("0 * * * *", "UTC", utc(2026, 6, 1, 12), "t") == utc(2026, 6, 1, 13)


@pytest.mark.parametrize("expr", ["30 2 * * *", "0 * * * *", "*/7 * * * *", "H H * * *", "@daily"])
@pytest.mark.parametrize("tz", [BERLIN, NEW_YORK, "UTC", "Australia/Lord_Howe"])
def test_result_is_aware_utc_and_strictly_after(expr: str, tz: str) -> None:
    tokyo = ZoneInfo("Asia/Tokyo")
    for base in (utc(2026, 3, 7), utc(2026, 3, 28), utc(2026, 10, 24), utc(2026, 10, 31)):
        for step in range(0, 72 * 60, 23):
            after = (base + timedelta(minutes=step)).astimezone(tokyo)
            got = next_after(expr, tz, after, "t")
            assert got.tzinfo is UTC
            assert got > after
            assert got - after <= timedelta(days=2)


def test_naive_after_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        next_after("* * * * *", "UTC", datetime(2026, 1, 1), "t")


@pytest.mark.parametrize(
    ("expr", "fixed"),
    [
        ("@hourly", False),
        ("@daily", True),
        ("@midnight", True),
        ("@weekly", True),
        ("@monthly", True),
        ("@yearly", True),
        ("@annually", True),
        ("0 * * * *", False),
        ("0 */2 * * *", False),
        ("0 H/3 * * *", False),
        ("0 1-23/2 * * *", False),
        ("* * * * * */20", False),
        ("30 2 * * *", True),
        ("0 1,13 * * *", True),
        ("0 9-17 * * mon-fri", True),
        ("H H * * *", True),
        ("*/15 2 * * *", True),
    ],
)
def test_has_fixed_hour(expr: str, fixed: bool) -> None:
    assert has_fixed_hour(expr) is fixed


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "61 * * * *",
        "* * *",
        "0 0 1 1 * 0 2030",
        "@reboot",
        "R * * * *",
        "0 r * * *",
        "0 0 31 2 *",
        "",
        "   ",
        "@daily 5",
        "H(0-99) * * * *",
    ],
)
def test_validate_cron_rejects(expr: str) -> None:
    with pytest.raises(ValueError, match=r"^invalid cron expression '.*': \S"):
        validate_cron(expr, "t")


def test_validate_cron_message_quotes_the_expression() -> None:
    with pytest.raises(ValueError, match=r"^invalid cron expression '61 \* \* \* \*': .*range"):
        validate_cron("61 * * * *", "t")


@pytest.mark.parametrize(
    "expr",
    [
        "H 3 * * *",
        "@daily",
        "@hourly",
        "*/5 * * * *",
        "0 9 * * mon-fri",
        "* * * * * */20",
        "0 0 L * *",
    ],
)
def test_validate_cron_accepts(expr: str) -> None:
    validate_cron(expr, "some-task")


@pytest.mark.parametrize(
    "tz", ["Mars/Base", "+01:00", "", "Europe", "../etc/passwd", "/etc/localtime"]
)
def test_validate_timezone_rejects(tz: str) -> None:
    with pytest.raises(ValueError, match="timezone"):
        validate_timezone(tz)


@pytest.mark.parametrize("tz", ["Europe/Berlin", "UTC", "America/New_York"])
def test_validate_timezone_accepts(tz: str) -> None:
    zone = validate_timezone(tz)
    assert isinstance(zone, ZoneInfo)
    assert zone.key == tz
