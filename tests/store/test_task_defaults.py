"""A task's defaults: a :class:`TaskSpec` synced from Python gets the same values as the same
task in a TOML file; its ``overlap`` defaults to ``hold`` and ``concurrent=True`` means
``allow``; and the health warning about a host's clock names the clock in force.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers.cli_project import migrated as migrated  # the fixture

from scheduler import ConfigError, PermanentError, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.status.health import touch
from scheduler.testing import ManualClock


def test_taskspec_takes_the_same_defaults_as_the_file(migrated: str) -> None:
    from scheduler import TaskSpec

    spec = TaskSpec(name="t", cron="0 3 * * *", handler="t.ok")  # TypeError before
    assert (spec.payload, spec.concurrent, spec.enabled, spec.max_consecutive_failures) == (
        {},
        False,
        True,
        None,
    )
    assert TaskSpec(name="u", cron="0 3 * * *", handler="t.ok").payload is not spec.payload
    # timezone: the app's [scheduler] timezone, as a task without one in the file gets.
    berlin = Scheduler(migrated, registry=Registry(), timezone="Europe/Berlin")
    try:
        berlin.sync(
            [spec, TaskSpec(name="tokyo", cron="0 3 * * *", handler="t.ok", timezone="Asia/Tokyo")]
        )
        assert berlin.get_row("t").timezone == "Europe/Berlin"  # type: ignore[union-attr]
        assert berlin.get_row("tokyo").timezone == "Asia/Tokyo"  # type: ignore[union-attr]
    finally:
        berlin.close()
    plain = Scheduler(migrated, registry=Registry(), tasks=[spec])
    try:
        plain.sync()
        assert plain.get_row("t").timezone == "UTC"  # type: ignore[union-attr]
        assert plain.get_row("t").payload == {}  # type: ignore[union-attr]
    finally:
        plain.close()


T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def db(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "words.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def app(db: str, clock: ManualClock) -> Iterator[Scheduler]:
    found = Scheduler(db, registry=Registry(), clock=clock)

    @found.handler("fails")
    def fails(job: object) -> None:
        raise PermanentError("boom")

    @found.handler("works")
    def works(job: object) -> None:
        return None

    yield found
    found.close()


def test_task_spec_overlap_defaults_to_hold_and_concurrent_is_allow(app: Scheduler) -> None:
    assert TaskSpec("x", "* * * * *", "h").overlap == "hold"
    assert TaskSpec("x", "* * * * *", "h", concurrent=True).overlap == "allow"
    assert TaskSpec("x", "* * * * *", "h", overlap="skip").policy == "skip"
    assert TaskSpec("x", "* * * * *", "h", overlap=None).overlap == "hold"  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="contradicting 'skip'"):
        app.sync([TaskSpec("x", "* * * * *", "works", concurrent=True, overlap="skip")])
    app.sync([TaskSpec("x", "* * * * *", "works", concurrent=True)])
    assert app.rows(limit=None)[0].overlap == "allow"


def test_the_clock_warning_names_the_clock_in_force(app: Scheduler) -> None:
    assert app.clock_mode == "local"  # SQLite: the host's clock, always
    touch(app.store, "far-host:1:x", T0, None, clock_offset=-5.0)
    (warning,) = [w for w in app.status()["health"]["warnings"] if "clock" in w]
    assert 'with clock = "local"' in warning and '"database"' not in warning
