"""``sync``: TOML tasks -> rows, atomically, on SQLite, PostgreSQL and MariaDB (SPEC §3).

New tasks are inserted, changed ones updated (a changed cron or timezone recomputes
``next_run_at``), unchanged ones untouched, and rows gone from the file disabled with reason
``removed_from_config``, never deleted. A dry run plans without writing; an invalid file
changes nothing.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, insert, select

from scheduler import ConfigError, PermanentError, Scheduler, TaskSpec, load_config, signals
from scheduler._model import cron as _cron
from scheduler._model.handlers import Registry
from scheduler._store.tables import metadata, rows
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


# -- at scale: one read, one statement per kind of write, all or nothing ---------------------
def specs(n: int, *, start: int = 0, cron: str = "H H * * *") -> list[TaskSpec]:
    return [
        TaskSpec(f"c-{i:06d}", cron, "ok", {"customer": i}, ("UTC", "Europe/Berlin")[i % 2])
        for i in range(start, start + n)
    ]


class Statements:
    """The SQL an engine runs while the block runs (``before_cursor_execute``)."""

    def __init__(self, app: Scheduler) -> None:
        self.engine = app.store.engine
        self.seen: list[str] = []

    def _record(self, _conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        self.seen.append(" ".join(statement.split())[:60])

    def __enter__(self) -> Statements:
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *_exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)


def test_resync_of_unchanged_tasks_reads_once_and_writes_nothing(sched: Scheduler) -> None:
    tasks = [
        *specs(300),
        TaskSpec("hourly", "H * * * *", "ok", {"n": {"deep": [1, 2]}}, "America/New_York"),
        TaskSpec("paused", "0 3 * * *", "ok", {}, "UTC", enabled=False),
    ]
    sched.sync([*tasks, TaskSpec("gone", "0 4 * * *", "ok", {}, "UTC")])
    sched.sync(tasks)  # "gone" is disabled: removed_from_config
    sched.check_schema()
    state = snapshot(sched)
    with Statements(sched) as sql:
        plan = sched.sync(tasks)
    assert plan.unchanged == [t.name for t in tasks] + ["gone"]
    assert not (plan.insert or plan.update or plan.disable)
    assert len(sql.seen) == 1 and sql.seen[0].startswith("SELECT"), sql.seen
    assert snapshot(sched) == state


def test_a_first_sync_is_one_read_and_one_insert(sched: Scheduler) -> None:
    sched.check_schema()
    with Statements(sched) as sql:
        assert len(sched.sync(specs(2000)).insert) == 2000
    # The rows' read, their insert, and the sync's audit entry (SPEC §10), one transaction.
    assert [s.split()[0] for s in sql.seen] == ["SELECT", "INSERT", "INSERT"], sql.seen
    assert "scheduler_audit" in sql.seen[2]
    assert len(sched.rows(limit=None)) == 2000


def test_each_row_gets_its_own_next_run_at(sched: Scheduler) -> None:
    """Tasks share a computed slot only when their H draws are equal: each row's next_run_at
    is what next_after gives for its own name."""
    tasks = (
        specs(150)
        + specs(150, start=150, cron="H * * * *")
        + specs(50, start=300, cron="H/20 H(2-4) * * *")
    )
    tasks.append(TaskSpec("berlin-3am", "0 3 * * *", "ok", {}, "Europe/Berlin"))
    sched.sync(tasks)
    stored = {r.name: r.next_run_at for r in sched.rows(limit=None)}
    assert stored == {t.name: _cron.next_after(t.cron, t.timezone, T0, t.name) for t in tasks}
    assert len(set(stored.values())) > 100  # the draws spread them


def test_bulk_insert_stores_what_core_stores(sched: Scheduler) -> None:
    """The bulk insert converts values through each column's own bind processing: every
    column, as the database holds it, equals a row written by a plain Core INSERT."""
    task = TaskSpec("t", "H H * * *", "ok", {"b": 1, "a": "é"}, "Europe/Berlin", enabled=False)
    sched.sync([task, TaskSpec("on", "*/5 * * * *", "ok", {}, "UTC", True, 0)])
    row_t = row(sched, "t")
    columns = [c for c in rows.columns if c.name not in ("id", "name")]
    with sched.store.begin() as conn:
        # probe_intervals: the row shows them decoded; the column holds NULL for the defaults
        shown = [c for c in columns if hasattr(row_t, c.name) and c.name != "probe_intervals"]
        values = {c.name: getattr(row_t, c.name) for c in shown}
        values["payload"] = '{"a":"\\u00e9","b":1}'
        conn.execute(insert(rows).values(name="core", created_at=T0, updated_at=T0, **values))
    with sched.store.read() as conn:
        quoted = ", ".join(c.name for c in columns)
        stored = {
            name: tuple(found)
            for name, *found in conn.exec_driver_sql(f"SELECT name, {quoted} FROM scheduler_rows")
        }
    assert stored["t"] == stored["core"]
    assert stored["on"] != stored["core"]


def test_a_big_list_refused_at_its_last_task_changes_nothing(sched: Scheduler) -> None:
    sched.sync([*specs(10, start=19_990), TaskSpec("old", "0 4 * * *", "ok", {}, "UTC")])
    state = snapshot(sched)
    tasks = specs(20_000)  # 19,990 new, 10 unchanged, "old" would be disabled
    tasks[-2] = TaskSpec("c-019998", "0 3 * * *", "ok", {}, "UTC")  # an update
    tasks[-1] = TaskSpec("c-019999", "0 25 * * *", "ok", {}, "UTC")
    with pytest.raises(ConfigError, match=r"^task 'c-019999': key 'cron': invalid cron"):
        sched.sync(tasks)
    assert snapshot(sched) == state


def test_a_failure_in_the_last_write_rolls_back_the_whole_sync(sched: Scheduler) -> None:
    """The bulk insert has run when the disable fails: the transaction takes it back."""
    sched.sync([*specs(3), TaskSpec("old", "0 4 * * *", "ok", {}, "UTC")])
    state = snapshot(sched)
    tasks = specs(5_000)
    tasks[1] = TaskSpec("c-000001", "0 3 * * *", "ok", {}, "UTC")  # an update

    def refuse_the_disable(_c: Any, _cur: Any, statement: str, params: Any, *_rest: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and "removed_from_config" in str(params):
            raise RuntimeError("the disk is full")

    event.listen(sched.store.engine, "before_cursor_execute", refuse_the_disable)
    try:
        with pytest.raises(RuntimeError, match="the disk is full"):
            sched.sync(tasks)
    finally:
        event.remove(sched.store.engine, "before_cursor_execute", refuse_the_disable)
    assert snapshot(sched) == state
    plan = sched.sync(tasks)
    assert (len(plan.insert), plan.update, plan.disable) == (4_997, ["c-000001"], ["old"])
    assert len(sched.rows(limit=None)) == 5_001


def test_many_changed_rows_are_updated_by_kind_of_change(sched: Scheduler) -> None:
    sched.sync(specs(400))
    at(sched, T0 + timedelta(minutes=7))
    before = {r.name: r for r in sched.rows(limit=None)}
    changed = specs(400)
    for i in range(0, 400, 4):  # a new payload: the schedule stays
        changed[i] = TaskSpec(changed[i].name, "H H * * *", "ok", {"v": 2}, changed[i].timezone)
    for i in range(1, 400, 4):  # a new cron: next_run_at recomputed from now
        changed[i] = TaskSpec(
            changed[i].name, "*/10 * * * *", "ok", {"customer": i}, changed[i].timezone
        )
    for i in range(2, 400, 4):  # disabled in the file
        changed[i] = TaskSpec(
            changed[i].name, "H H * * *", "ok", {"customer": i}, changed[i].timezone, enabled=False
        )
    with Statements(sched) as sql:
        plan = sched.sync(changed)
    assert len(plan.update) == 300 and len(plan.unchanged) == 100
    # One UPDATE per kind of change, then the sync's audit entry.
    assert [s.split()[0] for s in sql.seen] == ["SELECT", "UPDATE", "UPDATE", "UPDATE", "INSERT"]
    after = {r.name: r for r in sched.rows(limit=None)}
    for i, t in enumerate(changed):
        old, new = before[t.name], after[t.name]
        if i % 4 == 3:
            assert new == old
            continue
        assert new.version == old.version + 1
        if i % 4 == 0:
            assert (new.payload, new.next_run_at) == ({"v": 2}, old.next_run_at)
        elif i % 4 == 1:
            assert new.next_run_at == T0 + timedelta(minutes=10)
        else:
            assert (new.enabled, new.disabled_reason) == (False, "disabled_in_config")


@pytest.mark.parametrize(
    ("spec", "key", "fragment"),
    [
        (TaskSpec("", "* * * * *", "ok", {}, "UTC"), "name", "non-empty"),
        (TaskSpec("x" * 201, "* * * * *", "ok", {}, "UTC"), "name", "longer than 200"),
        (TaskSpec("tab\there", "* * * * *", "ok", {}, "UTC"), "name", "control characters"),
        (TaskSpec("h", "* * * * *", " ok", {}, "UTC"), "handler", "whitespace"),
        (TaskSpec("c", "* " * 101, "ok", {}, "UTC"), "cron", "at most 200"),
        (TaskSpec("a", "* * * * *", "ok", {}, "UTC"), "name", "duplicate task name"),
    ],
)
def test_python_tasks_get_the_files_name_rules(
    sched: Scheduler, spec: TaskSpec, key: str, fragment: str
) -> None:
    sched.sync([TaskSpec("b", "* * * * *", "ok", {}, "UTC")])
    state = snapshot(sched)
    with pytest.raises(ConfigError) as raised:
        sched.sync([TaskSpec("a", "*/5 * * * *", "ok", {}, "UTC"), spec])
    message = str(raised.value)
    assert f"key '{key}'" in message and fragment in message, message
    assert snapshot(sched) == state


def test_an_unchanged_task_is_checked_again_where_the_rules_can_have_moved(
    sched: Scheduler,
) -> None:
    """A re-sync skips the name, cron and timezone checks of a task whose handler, cron and
    zone equal its stored row's (they passed them when written), but never the payload's:
    under a lower limit an unchanged payload fails the sync, naming task and key."""
    big = TaskSpec("big", "0 3 * * *", "ok", {"text": "x" * 200}, "UTC")
    sched.sync([big, *specs(5)])
    state = snapshot(sched)
    sched.settings = dataclasses.replace(sched.settings, payload_limit_bytes=100)
    with pytest.raises(ConfigError, match=r"^task 'big': key 'payload': payload is \d+ bytes"):
        sched.sync([big, *specs(5)])
    assert snapshot(sched) == state
    # A changed cron on a stored row goes through the full check again.
    with pytest.raises(ConfigError, match=r"^task 'c-000001': key 'cron': invalid cron"):
        sched.sync([*specs(5)[:1], TaskSpec("c-000001", "0 25 * * *", "ok", {}, "UTC")])
    assert snapshot(sched) == state
