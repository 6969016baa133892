"""A cron change by ``put_task`` racing a tick that dispatches the row's slot (issue 33).

The change moves ``next_run_at`` to the new schedule's first slot after "now". That "now" was
read before the row was: a tick committing in between (it dispatched slot S and moved the row
past it) made the first slot after that earlier instant S again, and the next tick dispatched
S a second time. Now the row is read ``FOR UPDATE`` before the clock: the tick waits or loses,
or it committed first and the clock is read after it. Reproduced here without timing luck: the
``put_task``'s clock runs the other process's tick the first time it is read."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs
from scheduler.testing import ManualClock

BASE = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
SLOT = BASE + timedelta(seconds=14)  # the slot both schedules have (an even second)


class TickWhenRead:
    """A clock that, read for the first time once armed, lets ``ticker`` tick at ``at``
    (another Scheduler: another connection, as another process would), then answers the
    instant it was read at, just before that tick; read again, it answers a later instant."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.armed: tuple[Scheduler, datetime] | None = None
        self.reports: list[Any] = []

    def __call__(self) -> datetime:
        if self.armed is None:
            return self.now
        ticker, at = self.armed
        self.armed = None
        read = self.now
        self.reports.append(ticker.tick(now=at))
        self.now = at + timedelta(milliseconds=10)
        return read


@pytest.fixture
def apps(db_url: str) -> Iterator[tuple[Scheduler, Scheduler, TickWhenRead]]:
    clock = TickWhenRead(BASE + timedelta(seconds=13))
    editor = Scheduler(db_url, registry=Registry(), clock=clock)
    ticker = Scheduler(db_url, registry=Registry(), clock=ManualClock(BASE))
    ticker.handler("race.ok", queue="unserved")(lambda job: None)
    yield editor, ticker, clock
    editor.close()
    ticker.close()


def spec(cron: str, edit: int) -> TaskSpec:
    return TaskSpec("crm-sync-7", cron, "race.ok", {"edit": edit}, "UTC", overlap="allow")


@pytest.mark.parametrize("db_url", ["postgresql", "mariadb"], indirect=True)
def test_a_cron_change_never_brings_back_a_dispatched_slot(
    apps: tuple[Scheduler, Scheduler, TickWhenRead],
) -> None:
    editor, ticker, clock = apps
    editor.put_task(spec("* * * * * *", 0))
    row = editor.get_row("crm-sync-7")
    assert row is not None and row.next_run_at == SLOT

    clock.now = SLOT - timedelta(milliseconds=100)
    clock.armed = (ticker, SLOT + timedelta(milliseconds=50))
    change = editor.put_task(spec("*/2 * * * * *", 1))  # the tick runs while it reads the clock
    assert change.action == "updated" and "cron" in change.changed
    assert clock.armed is None and len(clock.reports) == 1

    for ms in (100, 1100, 2100):  # the next ticks dispatch what is due after the change
        ticker.tick(now=SLOT + timedelta(milliseconds=ms))
    with editor.store.read() as conn:
        found = conn.execute(select(jobs.c.slot, jobs.c.payload).order_by(jobs.c.id)).all()
    slots = [slot for slot, _payload in found]
    assert slots.count(SLOT) == 1, found  # at most once, whichever process won it
    assert slots == sorted(set(slots))


@pytest.mark.parametrize("db_url", ["postgresql", "mariadb"], indirect=True)
def test_a_cron_change_by_sync_never_brings_back_a_dispatched_slot(
    apps: tuple[Scheduler, Scheduler, TickWhenRead],
) -> None:
    """The same race with the file's owner: ``sync`` changes a file task's cron while a tick
    dispatches the slot both schedules have."""
    editor, ticker, clock = apps
    editor.sync([spec("* * * * * *", 0)])
    row = editor.get_row("crm-sync-7")
    assert row is not None and row.next_run_at == SLOT and row.source == "file"

    clock.now = SLOT - timedelta(milliseconds=100)
    clock.armed = (ticker, SLOT + timedelta(milliseconds=50))
    plan = editor.sync([spec("*/2 * * * * *", 1)])  # the tick runs while it reads the clock
    assert plan.update == ["crm-sync-7"]
    assert clock.armed is None and len(clock.reports) == 1

    for ms in (100, 1100, 2100):
        ticker.tick(now=SLOT + timedelta(milliseconds=ms))
    with editor.store.read() as conn:
        found = conn.execute(select(jobs.c.slot, jobs.c.payload).order_by(jobs.c.id)).all()
    slots = [slot for slot, _payload in found]
    assert slots.count(SLOT) == 1, found
    assert slots == sorted(set(slots))
