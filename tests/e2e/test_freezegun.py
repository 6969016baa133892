"""The scheduler under freezegun, as its users test with it.

- Whichever test first imports the scheduler, with time frozen or not, later ticks work: no
  module keeps freezegun's ``FakeDatetime`` (or the real class) taken at import. Checked in a
  real subprocess that freezes time before its first ``import scheduler``.
- freezegun's ``FakeDatetime.astimezone`` drops ``fold`` (spulec/freezegun#422): the DST rules
  must come out the same under frozen time as with an injected clock. Each case below is run
  both ways, through ``sync``, ``tick`` and ``work``, and read back as local wall-clock times.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from conftest import make_url
from freezegun import freeze_time

from scheduler import Scheduler, TaskSpec
from scheduler._model import cron as _cron
from scheduler._model.handlers import Registry
from scheduler.testing import ManualClock

FIRST_IMPORT_FROZEN = textwrap.dedent(
    """
    import json
    import sys
    from datetime import UTC, datetime, timedelta

    import freezegun

    NAMES = [f"every-{i}" for i in range(6)]


    def six_due_rows(app):
        # six rows due at once: the PostgreSQL tick dispatches such a batch over several
        # connections, its values encoded by the scheduler itself
        for name in NAMES:
            app.trigger(name)
        report = app.tick()
        return sorted(report.dispatched), app.work()


    # A test suite whose first test freezes time: the scheduler is first imported, and its
    # first app built and ticked, under frozen time.
    with freezegun.freeze_time("2030-01-07 09:00:00"):
        import scheduler
        from scheduler import Scheduler, TaskSpec

        app = Scheduler(sys.argv[1], clock="local")

        @app.handler("noop")
        def noop(job):
            return None

        app.sync([TaskSpec(name, "0 * * * *", "noop") for name in NAMES])
        rounds = [six_due_rows(app)]
    rounds.append(six_due_rows(app))  # the next test: the real clock, real datetimes
    with freezegun.freeze_time(datetime.now(UTC) + timedelta(minutes=2)):  # frozen again
        rounds.append(six_due_rows(app))
    app.close()
    print(json.dumps(rounds))
    """
)


def test_a_first_import_under_frozen_time_leaves_later_ticks_working(
    db_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "first_import_frozen.py"
    script.write_text(FIRST_IMPORT_FROZEN)
    done = subprocess.run(
        [sys.executable, str(script), db_url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    rounds = json.loads(done.stdout.strip().splitlines()[-1])
    assert rounds == [[[f"every-{i}" for i in range(6)], 6]] * 3


# -- the DST rules under freezegun ------------------------------------------------------------
# (zone, cron, a UTC instant shortly before the transition, the first fires as local times).
# Real-time (step hour) tasks: a repeated wall-clock time fires in both offsets.
DST_CASES: dict[str, tuple[str, str, datetime, list[str]]] = {
    # 2027-04-04 02:00 (+11) -> 01:30 (+10:30): 01:40 comes twice, 01:30 and 01:50 never
    "lord-howe-20min": (
        "Australia/Lord_Howe",
        "*/20 * * * *",
        datetime(2027, 4, 3, 14, 10, tzinfo=UTC),  # 01:10 +11
        ["01:20+11:00", "01:40+11:00", "01:40+10:30", "02:00+10:30", "02:20+10:30"],
    ),
    # 2027-10-31 03:00 CEST -> 02:00 CET: 02:05 twice
    "berlin-5-every-2h": (
        "Europe/Berlin",
        "5 */2 * * *",
        datetime(2027, 10, 30, 21, 0, tzinfo=UTC),  # 23:00 CEST
        ["00:05+02:00", "02:05+02:00", "02:05+01:00", "04:05+01:00"],
    ),
    # 2027-11-07 02:00 EDT -> 01:00 EST: hour 1 (repeated) is not a slot of */2
    "new-york-5-every-2h": (
        "America/New_York",
        "5 */2 * * *",
        datetime(2027, 11, 7, 3, 0, tzinfo=UTC),  # 23:00 EDT
        ["00:05-04:00", "02:05-05:00", "04:05-05:00"],
    ),
    # 2027-04-04 03:45 (+13:45) -> 02:45 (+12:45): 03:00 twice
    "chatham-every-3h": (
        "Pacific/Chatham",
        "0 */3 * * *",
        datetime(2027, 4, 3, 9, 15, tzinfo=UTC),  # 23:00 +13:45
        ["00:00+13:45", "03:00+13:45", "03:00+12:45", "06:00+12:45"],
    ),
    # 2027-10-31 03:00 CEST -> 02:00 CET: 03:00 CEST never exists, 03:00 CET is next
    "berlin-every-3h": (
        "Europe/Berlin",
        "0 */3 * * *",
        datetime(2027, 10, 30, 20, 0, tzinfo=UTC),  # 22:00 CEST
        ["00:00+02:00", "03:00+01:00", "06:00+01:00"],
    ),
}


@contextmanager
def fresh_cron_caches() -> Iterator[None]:
    """The cron results are memoised by instant, and a frozen instant equals a real one: empty
    the caches so each clock computes its own (and leaves none of its results behind)."""
    caches: list[Any] = [_cron._next, _cron._dst_notes]
    for cache in caches:
        cache.cache_clear()
    try:
        yield
    finally:
        for cache in caches:
            cache.cache_clear()


def fires(app: Scheduler, spec: TaskSpec, start: datetime, count: int, frozen: bool) -> list[str]:
    """Tick at each ``next_run_at`` of `spec`'s row from `start` (the clock moved there, by
    freezegun or a ManualClock) until it fired `count` times; the fires as local times."""
    instants: list[datetime] = []
    with fresh_cron_caches():
        if frozen:
            with freeze_time(start) as frozen_clock:
                app.sync([spec])
                while len(instants) < count:
                    at = app.get_row(spec.name).next_run_at  # type: ignore[union-attr]
                    assert at is not None
                    frozen_clock.move_to(at)
                    assert app.tick().dispatched == [spec.name], at  # the frozen clock's now
                    assert app.work() == 1
                    instants.append(at)
        else:
            clock = ManualClock(start)
            app.clock = clock
            app.sync([spec])
            while len(instants) < count:
                at = app.get_row(spec.name).next_run_at  # type: ignore[union-attr]
                assert at is not None
                clock.set(at)
                assert app.tick().dispatched == [spec.name], at
                assert app.work() == 1
                instants.append(at)
    zone = ZoneInfo(spec.timezone or "UTC")  # read with real datetimes, after the freeze
    return [
        datetime.fromtimestamp(t.timestamp(), zone).isoformat(timespec="minutes")[11:]
        for t in instants
    ]


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    return make_url("sqlite", tmp_path, sqlite_template)


def local_clock_app(url: str) -> Scheduler:
    """The host's clock (datetime.now(UTC)), the one freezegun freezes."""
    app = Scheduler(url, registry=Registry(), clock="local")
    app.handler("dst.ok")(lambda job: None)
    app.check_schema()  # connect before time stops
    return app


@pytest.mark.parametrize("clock", ["freezegun", "injected"])
@pytest.mark.parametrize("case", list(DST_CASES))
def test_real_time_tasks_across_a_fall_back(sqlite_url: str, case: str, clock: str) -> None:
    tz, cron, start, expected = DST_CASES[case]
    app = local_clock_app(sqlite_url)
    try:
        spec = TaskSpec(case, cron, "dst.ok", {}, tz)
        got = fires(app, spec, start, len(expected), frozen=clock == "freezegun")
    finally:
        app.close()
    assert got == expected


@pytest.mark.parametrize("db_url", ["postgresql", "mariadb"], indirect=True)
def test_lord_howe_under_freezegun_on_the_servers(db_url: str) -> None:
    tz, cron, start, expected = DST_CASES["lord-howe-20min"]
    app = local_clock_app(db_url)
    try:
        got = fires(app, TaskSpec("lh", cron, "dst.ok", {}, tz), start, len(expected), True)
    finally:
        app.close()
    assert got == expected


def test_explain_shows_the_repeated_time_in_its_own_offset_under_freezegun(
    sqlite_url: str,
) -> None:
    tz, cron, start, _ = DST_CASES["lord-howe-20min"]
    app = local_clock_app(sqlite_url)
    try:
        with fresh_cron_caches(), freeze_time(start):
            app.sync([TaskSpec("lh", cron, "dst.ok", {}, tz)])
            fired = app.explain("lh")["next_fires"]
    finally:
        app.close()
    assert [f["local"][11:] for f in fired[:4]] == [
        "01:20:00+11:00",
        "01:40:00+11:00",
        "01:40:00+10:30",
        "02:00:00+10:30",
    ]
    assert [f["dst"] for f in fired[:4]] == [None, None, "UTC+11:00 → UTC+10:30", None]
