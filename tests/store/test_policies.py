"""Run policies (SPEC §8) and the decision log (SPEC §9) on SQLite, PostgreSQL and MariaDB.

Time is a parameter (``tick(now=...)``, a :class:`ManualClock` for work/enable/trigger), so
nothing sleeps. Cron ``*/10 * * * *`` from 2030-01-01 00:00Z: ``slot(n)`` is the n-th slot.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, update

from scheduler import ConfigError, PermanentError, Scheduler, TaskSpec, UnknownRow, signals
from scheduler._store.tables import decisions, jobs, rows, runs
from scheduler.testing import ManualClock, capture_signals

T0 = datetime(2030, 1, 1, tzinfo=UTC)
EVERY_10 = "*/10 * * * *"


def slot(n: int) -> datetime:
    return T0 + timedelta(minutes=10 * n)


def spec(name: str, handler: str = "ok", cron: str = EVERY_10, **kw: Any) -> TaskSpec:
    return TaskSpec(name=name, cron=cron, handler=handler, timezone=kw.pop("timezone", "UTC"), **kw)


def at(app: Scheduler, now: datetime) -> ManualClock:
    clock = ManualClock(now)
    app.clock = clock
    return clock


@pytest.fixture
def sched(app: Scheduler) -> Scheduler:
    at(app, T0)

    @app.handler("ok")
    def ok(job: Any) -> None:
        return None

    @app.handler("boom")
    def boom(job: Any) -> None:
        raise PermanentError("boom_code")

    return app


def log(app: Scheduler, name: str) -> list[tuple[str, datetime | None, int | None, str | None]]:
    """The row's decision log, oldest first: (decision, slot, job id, reason)."""
    with app.store.read() as conn:
        found = conn.execute(
            select(decisions.c.decision, decisions.c.slot, decisions.c.job_id, decisions.c.reason)
            .where(decisions.c.task_name == name)
            .order_by(decisions.c.id)
        ).all()
    return [tuple(r) for r in found]  # type: ignore[misc]


def the_row(app: Scheduler, name: str) -> Any:
    found = app.get_row(name)
    assert found is not None
    return found


def job_slots(app: Scheduler, name: str) -> list[datetime]:
    with app.store.read() as conn:
        found = conn.execute(
            select(jobs.c.slot).where(jobs.c.task_name == name).order_by(jobs.c.id)
        ).scalars()
        return list(found)


# --- overlap ----------------------------------------------------------------------------
def test_overlap_skip_drops_the_slot_logs_it_and_signals(sched: Scheduler) -> None:
    sched.sync([spec("r", overlap="skip")])
    assert sched.tick(now=slot(1)).dispatched == ["r"]
    first = the_row(sched, "r").last_job_id
    with capture_signals(signals.slot_skipped) as sent:
        report = sched.tick(now=slot(2))  # nobody worked: the job is still queued
    assert report.skipped_overlap == ["r"] and report.held_back == []
    assert the_row(sched, "r").next_run_at == slot(3)  # moved on
    assert [(s.sender, s.kwargs) for s in sent] == [
        ("r", {"slot": slot(2), "decision": "skipped_overlap", "reason": "in_flight"})
    ]
    at(sched, slot(3))
    assert sched.work() == 1
    assert sched.tick(now=slot(3)).dispatched == ["r"]
    assert log(sched, "r") == [
        ("dispatched", slot(1), first, None),
        ("skipped_overlap", slot(2), first, "in_flight"),
        ("dispatched", slot(3), the_row(sched, "r").last_job_id, None),
    ]
    assert job_slots(sched, "r") == [slot(1), slot(3)]


def test_overlap_hold_logs_once_per_slot_and_a_repeat_writes_nothing(sched: Scheduler) -> None:
    sched.sync([spec("r")])  # hold is the default
    sched.tick(now=slot(1))
    job_id = the_row(sched, "r").last_job_id
    statements: list[str] = []
    event.listen(sched.store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    for now in (slot(2), slot(2) + timedelta(minutes=3), slot(2) + timedelta(minutes=7)):
        statements.clear()
        assert sched.tick(now=now).held_back == ["r"]
    # the last hold of the same slot: the due query only (record_tick is throttled)
    assert len(statements) == 1 and statements[0].lstrip().upper().startswith("SELECT")
    assert log(sched, "r") == [
        ("dispatched", slot(1), job_id, None),
        ("held_back", slot(2), job_id, "in_flight"),
    ]
    assert the_row(sched, "r").next_run_at == slot(2)


def test_an_idle_tick_is_one_statement(sched: Scheduler) -> None:
    sched.sync([spec(f"r{i}", overlap=("hold", "skip", "allow")[i % 3]) for i in range(9)])
    sched.tick(now=T0)  # the tick's record for `status`, written once
    statements: list[str] = []
    event.listen(sched.store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    assert not sched.tick(now=T0 + timedelta(seconds=1))
    assert len(statements) == 1


def test_overlap_allow_and_its_alias_concurrent(sched: Scheduler) -> None:
    sched.sync([spec("a", overlap="allow"), spec("c", concurrent=True)])
    for name in ("a", "c"):
        assert the_row(sched, name).overlap == "allow"
        assert the_row(sched, name).concurrent is True
    sched.tick(now=slot(1))
    report = sched.tick(now=slot(2))  # both jobs still queued: a second one beside each
    assert sorted(report.dispatched) == ["a", "c"]
    assert [d for d, *_ in log(sched, "a")] == ["dispatched", "dispatched"]
    first = log(sched, "a")[0][2]
    with sched.store.read() as conn:  # the second names the job it runs beside (on PostgreSQL
        details = conn.execute(  # the one-statement dispatch writes it)
            select(decisions.c.detail, decisions.c.reason)
            .where(decisions.c.task_name == "a")
            .order_by(decisions.c.id)
        ).all()
    assert [tuple(d) for d in details] == [
        (None, None),
        (f"beside job {first} (queued): overlap allow", None),
    ]
    # overlap = "allow" without concurrent and concurrent = true without overlap sync alike
    assert sched.sync([spec("a", overlap="allow"), spec("c", concurrent=True)]).update == []


def test_a_policy_change_is_a_change_and_moves_next_run_on_jitter(sched: Scheduler) -> None:
    sched.sync([spec("r")])
    plan = sched.sync([spec("r", overlap="skip", catchup_window=60)])
    assert plan.update == ["r"]
    row = the_row(sched, "r")
    assert (row.overlap, row.catchup_window, row.jitter, row.concurrent) == ("skip", 60, 0, False)
    assert row.next_run_at == slot(1)
    sched.sync([spec("r", overlap="skip", catchup_window=60, jitter=120)])
    moved = the_row(sched, "r").next_run_at
    assert slot(1) <= moved < slot(1) + timedelta(seconds=120)


@pytest.mark.parametrize(
    ("given", "key", "words"),
    [
        ({"overlap": "sometimes"}, "overlap", "expected one of 'hold', 'skip', 'allow'"),
        ({"overlap": 3}, "overlap", "got integer"),
        ({"overlap": "hold", "concurrent": True}, "concurrent", "contradicting 'hold'"),
        ({"catchup_window": -1}, "catchup_window", "at least 0"),
        ({"jitter": "60"}, "jitter", "expected an integer"),
        ({"jitter": 1.5}, "jitter", "expected an integer"),
    ],
)
def test_bad_policies_fail_the_whole_sync(
    tmp_path: Path, given: dict[str, Any], key: str, words: str
) -> None:
    values = "\n".join(
        f"{k} = {v!r}".replace("True", "true").replace("'", '"') for k, v in given.items()
    )
    path = tmp_path / "app.toml"
    path.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/s.db"\n'
        '[[tasks]]\nname = "ok"\ncron = "* * * * *"\nhandler = "h"\n'
        f'[[tasks]]\nname = "bad"\ncron = "* * * * *"\nhandler = "h"\n{values}\n'
    )
    with pytest.raises(ConfigError) as err:
        Scheduler.from_toml(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "task 'bad'" in message and f"key {key!r}" in message
    assert words in message


def test_a_task_built_in_python_is_checked_alike(sched: Scheduler) -> None:
    sched.sync([spec("keep")])
    for bad, key in (
        (spec("x", overlap="never"), "overlap"),
        (spec("x", overlap="skip", concurrent=True), "concurrent"),
        (spec("x", jitter=-5), "jitter"),
        (spec("x", catchup_window=True), "catchup_window"),
    ):
        with pytest.raises(ConfigError, match=f"task 'x': key {key!r}"):
            sched.sync([spec("keep"), bad])
    assert [r.name for r in sched.rows(limit=None)] == ["keep"]  # nothing changed


# --- catch-up window, coalescing ---------------------------------------------------------
def test_a_slot_later_than_the_catchup_window_is_missed(sched: Scheduler) -> None:
    sched.sync([spec("r", catchup_window=300)])
    with capture_signals(signals.slot_skipped) as sent:
        report = sched.tick(now=slot(1) + timedelta(seconds=301))
    assert report.missed == ["r"] and report.dispatched == []
    assert the_row(sched, "r").next_run_at == slot(2)  # waits for its next slot
    assert the_row(sched, "r").last_job_id is None
    assert [s.kwargs["decision"] for s in sent] == ["missed"]
    assert log(sched, "r") == [("missed", slot(1), None, "catchup_window")]
    # within the window, it runs
    assert sched.tick(now=slot(2) + timedelta(seconds=299)).dispatched == ["r"]


def test_missed_slots_coalesce_into_one_run_and_say_how_many(sched: Scheduler) -> None:
    sched.sync([spec("r")])  # catchup_window 0: unlimited, today's rule
    assert sched.tick(now=slot(4) + timedelta(minutes=1)).dispatched == ["r"]
    job_id = the_row(sched, "r").last_job_id
    assert log(sched, "r") == [
        ("dispatched", slot(1), job_id, None),
        ("coalesced", slot(1), job_id, "merged"),
    ]
    with sched.store.read() as conn:
        detail = conn.execute(
            select(decisions.c.detail).where(decisions.c.decision == "coalesced")
        ).scalar_one()
    assert detail.startswith("3 later slot(s)")
    assert the_row(sched, "r").next_run_at == slot(5)


# --- jitter and job.slot ----------------------------------------------------------------
def test_jitter_delays_next_run_at_and_job_slot_is_nominal(sched: Scheduler) -> None:
    sched.sync([spec("j", jitter=240), spec("k", jitter=240)])
    delays = {name: the_row(sched, name).next_run_at - slot(1) for name in ("j", "k")}
    assert all(timedelta(0) <= d < timedelta(seconds=240) for d in delays.values())
    assert delays["j"] != delays["k"]  # drawn from the task name (and the slot)
    assert sched.tick(now=slot(1)).dispatched == []  # not yet: its delayed instant is later
    now = slot(1) + timedelta(seconds=240)
    assert sorted(sched.tick(now=now).dispatched) == ["j", "k"]
    job = sched.get_job(the_row(sched, "j").last_job_id)
    assert job is not None and job.slot == slot(1)
    at(sched, now)
    sched.work()
    assert [h["slot"] for h in sched.history(job.id)] == [slot(1)]  # kept in the run history
    after = the_row(sched, "j").next_run_at
    assert slot(2) <= after < slot(2) + timedelta(seconds=240) and after - slot(2) != delays["j"]


# --- failures: rerun, disable; enable, trigger -------------------------------------------
def test_rerun_and_disable_are_logged_and_rerun_moves_job_slot(sched: Scheduler) -> None:
    sched.settings = dataclasses.replace(sched.settings, max_consecutive_failures=2)
    sched.sync([spec("f", "boom")])
    sched.tick(now=slot(1))
    job_id = the_row(sched, "f").last_job_id
    at(sched, slot(1))
    sched.work()
    assert sched.tick(now=slot(2)).rerun == ["f"]
    assert job_slots(sched, "f") == [slot(2)]  # the same job, now standing for slot 2
    at(sched, slot(2))
    sched.work()
    assert sched.tick(now=slot(3)).disabled == ["f"]
    assert log(sched, "f") == [
        ("dispatched", slot(1), job_id, None),
        ("rerun", slot(2), job_id, "boom_code"),
        ("disabled", slot(3), job_id, "max_consecutive_failures"),
    ]


def test_enable_logs_the_slots_passed_while_paused(sched: Scheduler) -> None:
    sched.sync([spec("r")])
    sched.disable("r")
    at(sched, slot(3) + timedelta(minutes=5))
    with capture_signals(signals.slot_skipped) as sent:
        assert sched.enable("r") is True
    assert [(d, s) for d, s, _j, _r in log(sched, "r")] == [
        ("disabled", slot(1)),
        ("paused", slot(1)),
        ("paused", slot(2)),
        ("paused", slot(3)),
    ]
    assert [(s.kwargs["slot"], s.kwargs["decision"]) for s in sent] == [
        (slot(n), "paused") for n in (1, 2, 3)
    ]
    assert the_row(sched, "r").next_run_at == slot(4)


def test_a_manual_disable_is_logged_once_and_explain_shows_it(sched: Scheduler) -> None:
    sched.sync([spec("r", jitter=30)])
    nominal = slot(1)
    assert the_row(sched, "r").next_run_at != nominal  # jittered: the entry has the nominal slot
    sched.disable("r", reason="db maintenance")
    assert log(sched, "r") == [("disabled", nominal, None, "manual")]
    sched.disable("r", reason="still down")  # disabled already: no second decision
    assert log(sched, "r") == [("disabled", nominal, None, "manual")]
    [entry] = sched.explain("r")["decisions"]
    assert (entry["decision"], entry["reason"], entry["detail"]) == (
        "disabled",
        "manual",
        "db maintenance",
    )
    assert sched.tick(now=slot(2)).dispatched == []


def test_trigger_is_logged_then_dispatched(sched: Scheduler) -> None:
    sched.sync([spec("r")])
    now = at(sched, T0 + timedelta(minutes=3)).now
    sched.trigger("r")
    assert sched.tick(now=now).dispatched == ["r"]
    assert [(d, s) for d, s, _j, _r in log(sched, "r")] == [
        ("triggered", now),
        ("dispatched", now),
    ]


# --- DST ----------------------------------------------------------------------------------
def test_dst_gap_and_repeat_are_logged(sched: Scheduler) -> None:
    berlin = "Europe/Berlin"  # 2030-03-31 02:00 -> 03:00; 2030-10-27 03:00 -> 02:00
    at(sched, datetime(2030, 3, 30, 12, tzinfo=UTC))
    sched.sync([spec("gap", cron="30 2 * * *", timezone=berlin)])
    sched.tick(now=datetime(2030, 3, 30, 1, 31, tzinfo=UTC))  # not due
    assert sched.tick(now=datetime(2030, 3, 30, 12, tzinfo=UTC)).dispatched == []
    moved = datetime(2030, 3, 31, 1, 0, tzinfo=UTC)  # 03:00 CEST, the first instant after
    assert the_row(sched, "gap").next_run_at == moved
    at(sched, datetime(2030, 3, 31, 0, 0, tzinfo=UTC))
    sched.trigger("gap")  # runs now; the tick that moves it on logs the gap ahead
    sched.tick(now=datetime(2030, 3, 31, 0, 0, tzinfo=UTC))
    assert ("dst_gap", moved) in [(d, s) for d, s, _j, _r in log(sched, "gap")]

    at(sched, datetime(2030, 10, 26, 12, tzinfo=UTC))
    sched.sync([spec("rep", cron="30 2 * * *", timezone=berlin)])
    first = datetime(2030, 10, 27, 0, 30, tzinfo=UTC)  # 02:30 CEST
    assert the_row(sched, "rep").next_run_at == first
    assert sched.tick(now=first).dispatched == ["rep"]
    assert the_row(sched, "rep").next_run_at == datetime(2030, 10, 28, 1, 30, tzinfo=UTC)
    repeat = datetime(2030, 10, 27, 1, 30, tzinfo=UTC)  # 02:30 CET: not fired again
    assert ("dst_repeat", repeat) in [(d, s) for d, s, _j, _r in log(sched, "rep")]


# --- a lost race writes no entry; purge -------------------------------------------------
def test_a_lost_race_logs_nothing(sched: Scheduler) -> None:
    sched.sync([spec("r")])
    with sched.store.begin() as conn:  # another process wrote the row after it was read
        conn.execute(update(rows).values(version=rows.c.version + 1))
    from scheduler import _tick as loop

    original = loop.due

    def stale(*args: Any) -> Any:
        found = original(*args)
        return [r._replace(version=r.version - 1) for r in found]

    loop.due = stale  # type: ignore[assignment]
    try:
        assert sched.tick(now=slot(1)).lost_race == ["r"]
    finally:
        loop.due = original  # type: ignore[assignment]
    assert log(sched, "r") == []
    with sched.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 0


def test_the_log_is_purged_with_the_jobs_retention(sched: Scheduler) -> None:
    sched.sync([spec("r")])
    sched.tick(now=slot(1))
    days = max(
        sched.worker_settings.purge_succeeded_after_days,
        sched.worker_settings.purge_aborted_after_days,
    )
    at(sched, slot(1) + timedelta(days=days) - timedelta(seconds=1))
    sched.purge()
    assert len(log(sched, "r")) == 1
    at(sched, slot(1) + timedelta(days=days, seconds=1))
    sched.purge()
    assert log(sched, "r") == []


def test_the_purge_finds_its_range_by_id_and_never_drops_a_newer_entry(sched: Scheduler) -> None:
    from scheduler._store import decisions as _decisions

    cut = T0 + timedelta(days=10)
    old, new = cut - timedelta(seconds=1), cut
    with sched.store.begin() as conn:
        assert _decisions.purge(conn, before=cut) == 0  # an empty log
        # In id order: two old, a new one, an old one out of order (a clock set back), a new.
        for n, decided_at in enumerate((old, old, new, old, new)):
            _decisions.record(conn, "r", "missed", slot(n), decided_at)
        assert _decisions.purge(conn, before=cut) == 2
    assert [s for _d, s, _j, _r in log(sched, "r")] == [slot(2), slot(3), slot(4)]
    with sched.store.begin() as conn:
        assert _decisions.purge(conn, before=cut + timedelta(days=1)) == 3  # all older now
    assert log(sched, "r") == []


# --- explain ----------------------------------------------------------------------------
def test_explain_a_held_back_task(sched: Scheduler) -> None:
    sched.sync([spec("r", timezone="Europe/Berlin")])
    sched.tick(now=slot(1))
    job_id = the_row(sched, "r").last_job_id
    clock = at(sched, slot(1) + timedelta(seconds=5))
    with sched.store.begin() as conn:  # claimed by a worker on host-a (its lease, 60 s)
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values(
                state="claimed",
                lease_owner="host-a:1234",
                started_at=clock.now,
                lease_expires_at=clock.now + timedelta(seconds=600),
                attempts=1,
            )
        )
    sched.tick(now=slot(2))
    clock.set(slot(2))
    data = sched.explain("r")
    assert data["state"].startswith(f"held back: job {job_id} is claimed by ")
    assert "lease until" in data["state"]
    assert data["policies"]["overlap"] == "hold"
    assert [d["decision"] for d in data["decisions"]] == ["held_back", "dispatched"]
    assert data["decisions"][0]["job_id"] == job_id
    assert len(data["next_fires"]) == 10
    assert data["next_fires"][0]["slot"] == "2030-01-01T00:20:00Z"
    with pytest.raises(UnknownRow, match="no task named 'nope'"):
        sched.explain("nope")


def test_explain_marks_dst_and_is_three_statements(sched: Scheduler) -> None:
    at(sched, datetime(2030, 3, 25, tzinfo=UTC))
    sched.sync([spec("b", cron="30 2 * * *", timezone="Europe/Berlin", jitter=60)])
    sched.explain("b")  # the schema check, once per app
    statements: list[str] = []
    event.listen(sched.store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    data = sched.explain("b")
    assert len(statements) == 3
    fires = data["next_fires"]
    shifted = [f for f in fires if f["dst"]]
    assert len(shifted) == 1 and shifted[0]["dst"] == "UTC+01:00 → UTC+02:00"
    assert shifted[0]["dst_case"] == "dst_gap" and shifted[0]["slot"] == "2030-03-31T01:00:00Z"
    for fire in fires:  # the jitter only delays the fire
        assert fire["at"] >= fire["slot"]
    assert data["policies"]["jitter"] == 60


def test_explain_shows_the_last_ten_runs_and_twenty_decisions(sched: Scheduler) -> None:
    sched.sync([spec("r", overlap="skip")])
    for n in range(1, 26):
        at(sched, slot(n))
        sched.tick(now=slot(n))
        sched.work()
    data = sched.explain("r")
    assert len(data["runs"]) == 10 and len(data["decisions"]) == 20
    assert data["runs"][0]["slot"] == "2030-01-01T04:10:00Z"  # the newest first
    assert data["state"].startswith("scheduled: job ")
    with sched.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(runs)).scalar_one() == 25


def test_a_sync_that_re_enables_a_task_logs_its_paused_slots(sched: Scheduler) -> None:
    sched.sync([spec("r", enabled=False)])  # disabled in the file from the start
    sched.sync([spec("r", enabled=False)])
    at(sched, slot(2) + timedelta(minutes=1))
    with capture_signals(signals.slot_skipped) as sent:
        plan = sched.sync([spec("r")])
    assert plan.update == ["r"]
    assert [(d, s, r) for d, s, _j, r in log(sched, "r")] == [
        ("paused", slot(1), "disabled_in_config"),
        ("paused", slot(2), "disabled_in_config"),
    ]
    assert [s.kwargs["slot"] for s in sent] == [slot(1), slot(2)]
    assert the_row(sched, "r").next_run_at == slot(3)
