"""``sync``: TOML tasks -> rows, atomically, on SQLite, PostgreSQL and MariaDB (SPEC §3).

New tasks are inserted, changed ones updated (a changed cron or timezone recomputes
``next_run_at``), unchanged ones untouched, and rows gone from the file disabled with reason
``removed_from_config``, never deleted. A dry run plans without writing; an invalid file
changes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from scheduler import (
    ConfigError,
    PermanentError,
    Scheduler,
    TaskSpec,
    load_config,
    signals,
)
from scheduler._handlers import Registry
from scheduler._store.tables import metadata
from scheduler.testing import ManualClock, capture_signals, drive

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)


def task(name: str, cron: str = "*/10 * * * *", handler: str = "ok", **keys: str) -> str:
    """One ``[[tasks]]`` table; ``keys`` are TOML values written as given."""
    lines = ["[[tasks]]", f'name = "{name}"', f'cron = "{cron}"', f'handler = "{handler}"']
    lines += [f"{key} = {value}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


class Files:
    """Writes numbered TOML files for one database."""

    def __init__(self, directory: Path, url: str) -> None:
        self.directory = directory
        self.url = url
        self.count = 0

    def write(self, *tasks: str, scheduler: str = "") -> Path:
        self.count += 1
        path = self.directory / f"app{self.count}.toml"
        head = f'[database]\nurl = "{self.url}"\n\n[scheduler]\n{scheduler}\n'
        path.write_text(head + "\n".join(tasks), encoding="utf-8")
        return path


@pytest.fixture
def files(tmp_path: Path, db_url: str) -> Files:
    return Files(tmp_path, db_url)


@pytest.fixture
def sched(app: Scheduler) -> Scheduler:
    app.clock = ManualClock(T0)
    app.handler("ok")(lambda job: None)

    def boom(job: Any) -> None:
        raise PermanentError("boom_code")

    app.handler("boom")(boom)
    return app


def sync_file(app: Scheduler, path: Path, **kwargs: Any) -> Any:
    return app.sync(load_config(path).tasks, **kwargs)


def snapshot(app: Scheduler) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in primary-key order."""
    with app.store.read() as conn:
        return {
            table.name: [tuple(r) for r in conn.execute(select(table).order_by(*table.primary_key))]
            for table in metadata.sorted_tables
        }


def row(app: Scheduler, name: str) -> Any:
    found = app.get_row(name)
    assert found is not None
    return found


def at(app: Scheduler, now: datetime) -> None:
    app.clock = ManualClock(now)


def test_plan_insert_update_unchanged_disable(sched: Scheduler, files: Files) -> None:
    first = files.write(task("a"), task("b", payload='{ region = "eu" }'), task("c"))
    plan = sync_file(sched, first)
    assert plan.as_dict() == {
        "insert": ["a", "b", "c"],
        "update": [],
        "unchanged": [],
        "disable": [],
    }
    before = {name: row(sched, name) for name in "abc"}
    assert before["b"].payload == {"region": "eu"}
    assert before["a"].next_run_at == T0 + timedelta(minutes=10)

    at(sched, T0 + timedelta(minutes=3))
    second = files.write(task("a"), task("b", payload='{ region = "us" }'), task("d"))
    plan = sync_file(sched, second)
    assert plan.as_dict() == {
        "insert": ["d"],
        "update": ["b"],
        "unchanged": ["a"],
        "disable": ["c"],
    }
    a, b, c, d = (row(sched, name) for name in "abcd")
    assert a == before["a"]  # untouched: same version, same everything
    assert (b.payload, b.version) == ({"region": "us"}, before["b"].version + 1)
    assert b.next_run_at == before["b"].next_run_at  # same cron: the schedule stays
    assert (c.enabled, c.disabled_reason, c.disabled_at) == (
        False,
        "removed_from_config",
        T0 + timedelta(minutes=3),
    )
    assert d.enabled and d.next_run_at == T0 + timedelta(minutes=10)
    # a second identical sync changes nothing at all
    state = snapshot(sched)
    plan = sync_file(sched, second)
    assert plan.as_dict() == {
        "insert": [],
        "update": [],
        "unchanged": ["a", "b", "d", "c"],
        "disable": [],
    }
    assert snapshot(sched) == state


def test_changed_cron_or_timezone_recomputes_next_run_at(sched: Scheduler, files: Files) -> None:
    sync_file(sched, files.write(task("r", "0 * * * *"), task("s", "0 3 * * *")))
    assert row(sched, "r").next_run_at == T0 + timedelta(hours=1)
    assert row(sched, "s").next_run_at == T0 + timedelta(hours=3)

    at(sched, T0 + timedelta(minutes=12))
    plan = sync_file(
        sched,
        files.write(task("r", "*/5 * * * *"), task("s", "0 3 * * *", timezone='"Europe/Berlin"')),
    )
    assert plan.update == ["r", "s"]
    assert row(sched, "r").next_run_at == T0 + timedelta(minutes=15)
    assert row(sched, "s").next_run_at == T0 + timedelta(hours=2)  # 03:00 CET
    assert row(sched, "s").timezone == "Europe/Berlin"


def test_unchanged_rows_keep_failures_and_an_automatic_disable(
    sched: Scheduler, files: Files
) -> None:
    path = files.write(task("r", handler="boom", max_consecutive_failures="3"), task("m"))
    sync_file(sched, path)
    drive(sched, T0 + timedelta(minutes=10), T0 + timedelta(minutes=20))
    kept = row(sched, "r")
    assert kept.consecutive_failures == 1
    sched.disable("m")  # a manual pause survives too

    at(sched, T0 + timedelta(minutes=25))
    plan = sync_file(sched, path)
    assert plan.unchanged == ["r", "m"] and not plan.update
    assert row(sched, "r") == kept
    assert row(sched, "m").disabled_reason == "manual"

    with capture_signals(signals.row_disabled) as records:
        drive(sched, T0 + timedelta(minutes=30), T0 + timedelta(minutes=40))
    assert [r.sender for r in records] == ["r"]
    disabled = row(sched, "r")
    assert (disabled.enabled, disabled.disabled_reason) == (False, "max_consecutive_failures")

    at(sched, T0 + timedelta(minutes=45))
    assert sync_file(sched, path).unchanged == ["r", "m"]
    assert row(sched, "r") == disabled
    # a definition change is applied, and the row stays disabled until `enable`
    changed = files.write(
        task("r", handler="boom", max_consecutive_failures="3", payload="{ v = 2 }"), task("m")
    )
    assert sync_file(sched, changed).update == ["r"]
    after = row(sched, "r")
    assert (after.enabled, after.disabled_reason, after.consecutive_failures) == (
        False,
        "max_consecutive_failures",
        3,
    )
    assert after.payload == {"v": 2}
    assert not sched.tick(now=T0 + timedelta(hours=5))


def test_removed_rows_are_disabled_never_deleted_and_come_back(
    sched: Scheduler, files: Files
) -> None:
    both = files.write(task("a"), task("b"))
    sync_file(sched, both)
    drive(sched, T0 + timedelta(minutes=10), T0 + timedelta(minutes=20))
    job_id = row(sched, "b").last_job_id
    history = sched.history(job_id)
    assert [h["outcome"] for h in history] == ["succeeded"]

    at(sched, T0 + timedelta(minutes=21))
    only_a = files.write(task("a"))
    assert sync_file(sched, only_a).disable == ["b"]
    gone = row(sched, "b")
    assert (gone.enabled, gone.disabled_reason) == (False, "removed_from_config")
    assert gone.last_job_id == job_id
    assert sched.get_job(job_id) is not None and sched.history(job_id) == history
    assert sched.tick(now=T0 + timedelta(hours=1)).dispatched == ["a"]
    assert sync_file(sched, only_a).as_dict()["disable"] == []  # already disabled

    at(sched, T0 + timedelta(hours=2, minutes=1))
    plan = sync_file(sched, both)
    assert plan.update == ["b"]
    back = row(sched, "b")
    assert (back.enabled, back.disabled_reason, back.disabled_at) == (True, None, None)
    assert back.consecutive_failures == 0
    assert back.next_run_at == T0 + timedelta(hours=2, minutes=10)  # re-armed from now
    assert back.last_job_id == job_id and sched.history(job_id) == history


def test_enabled_false_in_toml(sched: Scheduler, files: Files) -> None:
    off = files.write(task("r", enabled="false"))
    assert sync_file(sched, off).insert == ["r"]
    paused = row(sched, "r")
    assert (paused.enabled, paused.disabled_reason, paused.disabled_at) == (
        False,
        "disabled_in_config",
        T0,
    )
    assert not sched.tick(now=T0 + timedelta(hours=1))

    at(sched, T0 + timedelta(hours=1, minutes=1))
    on = files.write(task("r", enabled="true"))
    assert sync_file(sched, on).update == ["r"]
    assert row(sched, "r").enabled
    assert row(sched, "r").next_run_at == T0 + timedelta(hours=1, minutes=10)
    assert sched.tick(now=T0 + timedelta(hours=1, minutes=10)).dispatched == ["r"]

    at(sched, T0 + timedelta(hours=1, minutes=11))
    assert sync_file(sched, off).update == ["r"]
    assert row(sched, "r").disabled_reason == "disabled_in_config"
    assert not sched.tick(now=T0 + timedelta(hours=3))


def test_enabled_true_does_not_lift_a_failure_disable(sched: Scheduler, files: Files) -> None:
    path = files.write(task("r", handler="boom", max_consecutive_failures="1", enabled="true"))
    sync_file(sched, path)
    drive(sched, T0 + timedelta(minutes=10), T0 + timedelta(minutes=20))
    assert row(sched, "r").disabled_reason == "max_consecutive_failures"
    assert sync_file(sched, path).unchanged == ["r"]
    assert not row(sched, "r").enabled


def test_dry_run_changes_nothing_and_returns_the_plan(sched: Scheduler, files: Files) -> None:
    sync_file(sched, files.write(task("a"), task("b"), task("c", enabled="false")))
    drive(sched, T0 + timedelta(minutes=10), T0 + timedelta(minutes=10))
    at(sched, T0 + timedelta(minutes=15))
    change = files.write(task("a", "*/5 * * * *"), task("c"), task("d"))
    before = snapshot(sched)

    dry = sync_file(sched, change, dry_run=True)
    assert dry.as_dict() == {
        "insert": ["d"],
        "update": ["a", "c"],
        "unchanged": [],
        "disable": ["b"],
    }
    assert snapshot(sched) == before  # every table, every column

    real = sync_file(sched, change)
    assert real.as_dict() == dry.as_dict()
    assert snapshot(sched) != before
    assert row(sched, "d").enabled and not row(sched, "b").enabled


INVALID = {
    "bad cron": (task("bad", "61 * * * *"), "bad", "cron", "61 * * * *"),
    "unknown timezone": (task("bad", timezone='"Mars/Olympus"'), "bad", "timezone", "Mars"),
    "unknown key": (task("bad", colour='"red"'), "bad", "colour", "unknown key"),
    "duplicate name": (task("a", "*/5 * * * *"), "a", "name", "duplicate"),
    "wrong type": (task("bad", concurrent='"yes"'), "bad", "concurrent", "boolean"),
    "wrong type of limit": (
        task("bad", max_consecutive_failures='"3"'),
        "bad",
        "max_consecutive_failures",
        "integer",
    ),
    "credential key": (
        task("bad", payload='{ api_token = "hunter2" }'),
        "bad",
        "payload.api_token",
        "credential",
    ),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_an_invalid_file_names_file_task_key_and_changes_nothing(
    sched: Scheduler, files: Files, case: str
) -> None:
    entry, name, key, fragment = INVALID[case]
    sync_file(sched, files.write(task("a"), task("b")))
    before = snapshot(sched)
    # valid changes (an update, a new task, a removal) next to one invalid entry
    path = files.write(task("a", "0 * * * *"), task("new"), entry)
    with pytest.raises(ConfigError) as raised:
        sync_file(sched, path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ")
    assert f"task '{name}'" in message and f"key '{key}'" in message and fragment in message
    assert "hunter2" not in message
    with pytest.raises(ConfigError):
        Scheduler.from_toml(path, registry=Registry())
    assert snapshot(sched) == before


def test_a_bad_task_built_in_python_changes_nothing(sched: Scheduler) -> None:
    """Tasks built in Python are checked like the file's: the error names task and key."""
    good = TaskSpec("a", "*/10 * * * *", "ok", {}, "UTC")
    sched.sync([good, TaskSpec("b", "*/10 * * * *", "ok", {}, "UTC")])
    before = snapshot(sched)
    tasks = [
        TaskSpec("a", "*/5 * * * *", "ok", {}, "UTC"),  # an update
        TaskSpec("new", "*/10 * * * *", "ok", {}, "UTC"),  # an insert
        TaskSpec("z", "*/10 * * * *", "ok", {"password": "x"}, "UTC"),  # refused last
    ]
    with pytest.raises(ConfigError, match=r"task 'z': key 'payload': .*'password'"):
        sched.sync(tasks)
    assert snapshot(sched) == before
    bad_cron = [tasks[0], TaskSpec("c", "61 * * * *", "ok", {}, "UTC")]
    with pytest.raises(ConfigError, match=r"task 'c': key 'cron': invalid cron"):
        sched.sync(bad_cron)
    bad_zone = [tasks[0], TaskSpec("t", "* * * * *", "ok", {}, "Mars/Base")]
    with pytest.raises(ConfigError, match=r"task 't': key 'timezone': unknown timezone"):
        sched.sync(bad_zone)
    assert snapshot(sched) == before


def test_from_toml_syncs_the_file_and_applies_its_settings(files: Files) -> None:
    path = files.write(
        task("flaky", handler="boom"), task("fine"), scheduler="max_consecutive_failures = 2"
    )
    app = Scheduler.from_toml(path, registry=Registry(), clock=ManualClock(T0))
    try:
        app.handler("ok")(lambda job: None)

        def boom(job: Any) -> None:
            raise PermanentError("boom_code")

        app.handler("boom")(boom)
        assert app.sync().insert == ["flaky", "fine"]  # the file's own tasks
        result = drive(app, T0, T0 + timedelta(minutes=40))
        assert result.times("flaky", "disabled") == [T0 + timedelta(minutes=30)]
        assert result.times("fine") == [T0 + timedelta(minutes=m) for m in (10, 20, 30, 40)]
    finally:
        app.close()
