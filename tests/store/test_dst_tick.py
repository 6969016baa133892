"""Daylight saving through the tick: the exact UTC instants rows are dispatched at (SPEC §2).

Berlin:   spring-forward 2026-03-29 02:00 -> 03:00 (01:00Z); fall-back 2026-10-25 03:00 -> 02:00
          (01:00Z, 02:xx is repeated).
New York: spring-forward 2026-03-08 02:00 -> 03:00 (07:00Z); fall-back 2026-11-01 02:00 -> 01:00
          (06:00Z, 01:xx is repeated).

Fixed-hour rows fire once per local date and time (the first of a repeated time; a slot in the
gap at the first instant after the jump); wildcard and step hours follow real time. Each test
drives tick + work with ``now=`` through the transition; one repeats the Berlin fall-back with
freezegun and the scheduler's own clock.
"""

from __future__ import annotations

import itertools
import shutil
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from scheduler import Scheduler, TaskSpec
from scheduler._model import cron as _cron
from scheduler._model.handlers import Registry
from scheduler.testing import DriveReport, ManualClock, Step, drive

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
HOUR = timedelta(hours=1)


def utc(month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def every_hour(start: datetime, stop: datetime) -> list[datetime]:
    """Each whole UTC hour in (start, stop]."""
    first = start.replace(minute=0, second=0, microsecond=0) + HOUR
    return [first + i * HOUR for i in range(int((stop - first) / HOUR) + 1)]


# zone, transition date, window (start, stop) in UTC,
# {cron: every dispatch in the window}, {cron: the dispatches on the transition date}
Case = tuple[str, date, datetime, datetime, dict[str, list[datetime]], dict[str, list[datetime]]]
CASES: dict[str, Case] = {
    "berlin-spring": (
        BERLIN,
        date(2026, 3, 29),
        utc(3, 28, 0),
        utc(3, 30, 1),
        # 02:30 CET, (02:30 does not exist) 03:00 CEST, 02:30 CEST
        {"30 2 * * *": [utc(3, 28, 1, 30), utc(3, 29, 1), utc(3, 30, 0, 30)]},
        # 00:00 CET, then 04:00 CEST ... 22:00: the 02:00 slot is missing, nothing at 03:00
        {"0 */2 * * *": [utc(3, 28, 23), *(utc(3, 29, h) for h in range(2, 21, 2))]},
    ),
    "berlin-fall": (
        BERLIN,
        date(2026, 10, 25),
        utc(10, 24, 0),
        utc(10, 26, 2),
        # 02:30 CEST, 02:30 CEST (the first; 02:30 CET at 01:30Z does not fire), 02:30 CET
        {"30 2 * * *": [utc(10, 24, 0, 30), utc(10, 25, 0, 30), utc(10, 26, 1, 30)]},
        # 00:00 CEST, 02:00 CEST, then 02:00 CET, 04:00 CET ... 22:00 CET: both 02:00 run
        {
            "0 */2 * * *": [
                utc(10, 24, 22),
                utc(10, 25, 0),
                *(utc(10, 25, h) for h in range(1, 22, 2)),
            ]
        },
    ),
    "new-york-spring": (
        NEW_YORK,
        date(2026, 3, 8),
        utc(3, 7, 6),
        utc(3, 9, 7),
        {
            # 02:30 EST, (gap) 03:00 EDT, 02:30 EDT
            "30 2 * * *": [utc(3, 7, 7, 30), utc(3, 8, 7), utc(3, 9, 6, 30)],
            "30 1 * * *": [utc(3, 7, 6, 30), utc(3, 8, 6, 30), utc(3, 9, 5, 30)],
        },
        # 00:00 EST, then 04:00 EDT ... 22:00 EDT
        {
            "0 */2 * * *": [
                utc(3, 8, 5),
                *(utc(3, 8, h) for h in range(8, 24, 2)),
                utc(3, 9, 0),
                utc(3, 9, 2),
            ]
        },
    ),
    "new-york-fall": (
        NEW_YORK,
        date(2026, 11, 1),
        utc(10, 31, 5),
        utc(11, 2, 8),
        {
            # 02:30 is not repeated in New York: it fires once, in EST on the day itself
            "30 2 * * *": [utc(10, 31, 6, 30), utc(11, 1, 7, 30), utc(11, 2, 7, 30)],
            # 01:30 EDT fires; 01:30 EST (06:30Z) does not
            "30 1 * * *": [utc(10, 31, 5, 30), utc(11, 1, 5, 30), utc(11, 2, 6, 30)],
        },
        # 00:00 EDT, 02:00 EST (three real hours later) ... 22:00 EST
        {
            "0 */2 * * *": [
                utc(11, 1, 4),
                *(utc(11, 1, h) for h in range(7, 24, 2)),
                utc(11, 2, 1),
                utc(11, 2, 3),
            ]
        },
    ),
}


def transition_day(times: list[datetime], tz: str, day: date) -> list[datetime]:
    zone = ZoneInfo(tz)
    return [t for t in times if t.astimezone(zone).date() == day]


@pytest.fixture
def dst_app(app: Scheduler) -> Scheduler:
    ran: list[Any] = []

    @app.handler("dst.ok")
    def ok(job: Any) -> None:
        ran.append(job.task_name)

    return app


def sync_and_drive_frozen(
    app: Scheduler, specs: list[TaskSpec], start: datetime, stop: datetime
) -> DriveReport:
    """``sync`` at `start`, then :func:`drive` on freezegun's clock: time frozen at each due
    instant in turn, the app reading the host's clock (``datetime.now``, a FakeDatetime),
    ``tick()`` and ``work()`` without ``now=``. The memoised cron results are emptied first (a
    frozen instant equals a real one: an injected-clock run's would be read back)."""
    names = [spec.name for spec in specs]
    app.check_schema()  # connect before time stops
    _cron._next.cache_clear()
    _cron._dst_notes.cache_clear()
    result = DriveReport()
    with freeze_time(start, ignore=["_pytest"]) as frozen:
        app.sync(specs)
        now = start
        while now <= stop:
            frozen.move_to(now)
            for _ in range(20):  # as drive: again at once while held-back rows wait on jobs
                report = app.tick()
                ran = app.work()
                result.add(Step(now, report, ran))
                if not (ran and report.held_back):
                    break
            due = [row.next_run_at for row in map(app.get_row, names) if row is not None]
            later = [at for at in due if at is not None and at > now]
            if not later:
                break
            now = min(later)
    _cron._next.cache_clear()
    _cron._dst_notes.cache_clear()
    return result


# Every case on SQLite, with an injected clock and under freezegun; each server engine gets
# one spring-forward and one fall-back.
ENGINE_CASES = [
    *(("sqlite", case, clock) for case in CASES for clock in ("injected", "freezegun")),
    ("postgresql", "berlin-spring", "injected"),
    ("postgresql", "new-york-fall", "injected"),
    ("mariadb", "new-york-spring", "injected"),
    ("mariadb", "berlin-fall", "injected"),
]


@pytest.mark.parametrize(("db_url", "case", "clock"), ENGINE_CASES, indirect=["db_url"])
def test_dispatch_instants_across_a_transition(dst_app: Scheduler, case: str, clock: str) -> None:
    tz, day, start, stop, fixed, on_the_day = CASES[case]
    crons = {**fixed, "0 * * * *": every_hour(start, stop)}
    names = [*crons, *on_the_day]
    specs = [TaskSpec(cron, cron, "dst.ok", {}, tz) for cron in names]  # named by cron
    if clock == "freezegun":
        result = sync_and_drive_frozen(dst_app, specs, start, stop)
    else:
        dst_app.clock = ManualClock(start)
        dst_app.sync(specs)
        result = drive(dst_app, start, stop)  # from one due instant to the next

    for cron, expected in crons.items():
        assert result.times(cron) == expected, cron
    for cron, expected in on_the_day.items():
        assert transition_day(result.times(cron), tz, day) == expected, cron
    assert result.report.held_back == []
    assert result.jobs_run == sum(len(result.times(cron)) for cron in names)

    # wildcard hour: every real hour, 23 on the spring-forward date and 25 on the fall-back one
    hourly = transition_day(result.times("0 * * * *"), tz, day)
    assert len(hourly) == (23 if day.month == 3 else 25)
    assert {b - a for a, b in itertools.pairwise(hourly)} == {HOUR}
    wall = Counter(t.astimezone(ZoneInfo(tz)).hour for t in hourly)
    if day.month == 3:
        assert 2 not in wall and set(wall.values()) == {1}
    else:
        repeated = 2 if tz == BERLIN else 1
        assert wall[repeated] == 2 and sum(wall.values()) == 25
    # fixed hour: exactly once on the transition date; a slot in the gap at the jump
    for cron in fixed:
        [once] = transition_day(result.times(cron), tz, day)
        if day.month == 3 and cron == "30 2 * * *":
            assert once.astimezone(ZoneInfo(tz)).strftime("%H:%M %Z") in ("03:00 CEST", "03:00 EDT")


def test_polling_every_half_hour_fires_at_the_same_instants(
    sqlite_template: Path, tmp_path: Path
) -> None:
    """``drive`` above jumps to each due instant; a worker polling on a fixed period (here every
    30 minutes, on SQLite) must see the same dispatches and nothing in between."""
    shutil.copy(sqlite_template, tmp_path / "polled.db")
    app = Scheduler(f"sqlite:///{tmp_path / 'polled.db'}", registry=Registry())
    app.handler("dst.ok")(lambda job: None)
    tz, day, start, stop, fixed, on_the_day = CASES["berlin-fall"]
    crons = {**fixed, "0 * * * *": every_hour(start, stop)}
    app.clock = ManualClock(start)
    try:
        app.sync([TaskSpec(cron, cron, "dst.ok", {}, tz) for cron in [*crons, *on_the_day]])
        result = drive(app, start, stop, timedelta(minutes=30))
    finally:
        app.close()
    for cron, expected in crons.items():
        assert result.times(cron) == expected, cron
    for cron, expected in on_the_day.items():
        assert transition_day(result.times(cron), tz, day) == expected, cron
    assert len(result.steps) == (stop - start) / timedelta(minutes=30) + 1


def test_fall_back_with_freezegun_and_the_real_clock(db_url: str) -> None:
    # The host's clock, datetime.now(UTC), which freezegun freezes (the database's does not).
    app = Scheduler(db_url, registry=Registry(), clock="local")

    @app.handler("dst.ok")
    def ok(job: Any) -> None:
        return None

    app.check_schema()  # connect before time stops
    start, stop = utc(10, 24, 21, 50), utc(10, 25, 3, 10)
    seen: dict[str, list[datetime]] = {"30 2 * * *": [], "0 * * * *": []}
    try:
        with freeze_time(start) as frozen:
            app.sync([TaskSpec(cron, cron, "dst.ok", {}, BERLIN) for cron in seen])
            now = start
            while now <= stop:
                frozen.move_to(now)
                report = app.tick()  # no now=: the scheduler reads the frozen clock
                assert app.work() == len(report.dispatched)
                for name in report.dispatched:
                    seen[name].append(now)
                now += timedelta(minutes=10)
        jobs = [app.get_job(app.get_row(cron).last_job_id) for cron in seen]  # type: ignore[union-attr]
    finally:
        app.close()
    # 02:30 CEST only (00:30Z); every real hour including both 02:00 (00:00Z, 01:00Z)
    assert seen["30 2 * * *"] == [utc(10, 25, 0, 30)]
    assert seen["0 * * * *"] == every_hour(start, stop)
    assert [j.run_at for j in jobs if j is not None] == [utc(10, 25, 0, 30), utc(10, 25, 3)]
