"""Limits every worker shares, on every engine: the claim counts running and started attempts
per partition, a held job stays queued and says why, a takeover gives the place back, and
``fair`` rotates across the partitions. Real databases; time is the Scheduler's ``clock=``.
(The races of many worker processes are ``tests/e2e/test_limits_race.py``'s.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from helpers.queue_worker import Clock
from sqlalchemy import func, select

from scheduler import Limit, Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import limit_holds

T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def make_app(db_url: str, clock: Clock) -> Iterator[Callable[..., Scheduler]]:
    made: list[Scheduler] = []

    def make(*limits: Limit, **kwargs: Any) -> Scheduler:
        kwargs.setdefault("registry", Registry())
        app = Scheduler(db_url, clock=clock, limits=limits, worker_id=f"w{len(made)}", **kwargs)
        made.append(app)

        @app.handler("crm.sync", retry_safe=True)
        def sync(job: Any) -> None:
            pass

        @app.handler("free")
        def free(job: Any) -> None:
            pass

        return app

    yield make
    for app in made:
        app.close()


def test_concurrency_is_shared_by_every_claimer(make_app: Callable[..., Scheduler]) -> None:
    limit = Limit("crm-api", handlers=["crm.sync"], concurrency=2)
    first, second = make_app(limit), make_app(limit)
    ids = [first.enqueue("crm.sync", {"n": n}) for n in range(5)]
    one, two = first.runner(), second.runner()
    assert [j.id for j in one.claim(10)] == ids[:2]
    assert two.claim(10) == []  # another worker: the limit is full
    held = first.get_job(ids[2])
    assert held is not None
    assert (held.state, held.attempts) == ("queued", 0)
    assert held.waiting_for == "limit crm-api: 2 of 2 running"
    running = first.jobs(state="claimed")
    assert len(running) == 2 and all(j.waiting_for is None for j in running)
    # One attempt ends: one place is free, for whichever worker claims next.
    one.record([one.execute(running[-1])])
    assert [j.id for j in two.claim(10)] == [ids[2]]
    assert two.claim(10) == []
    view = first.get_job(ids[3])
    assert view is not None and view.waiting_for == "limit crm-api: 2 of 2 running"


def test_jobs_under_no_limit_pass_a_full_limit(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=1))
    limited = [app.enqueue("crm.sync", {}, priority=-5) for _ in range(20)]
    free = app.enqueue("free", {})
    runner = app.runner()
    assert sorted(j.id for j in runner.claim(10)) == sorted([limited[0], free])
    assert app.enqueue("free", {}) in [j.id for j in runner.claim(10)]


def test_rate_counts_starts_in_any_window(make_app: Callable[..., Scheduler], clock: Clock) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], rate="3/10s"))
    ids = [app.enqueue("crm.sync", {}) for _ in range(8)]
    runner = app.runner()
    taken = runner.claim(10)
    assert [j.id for j in taken] == ids[:3]
    runner.record([runner.execute(j) for j in taken])  # finished: still started in the window
    clock.advance(seconds=9.9)
    runner.poke_limits()
    assert runner.claim(10) == []
    view = app.get_job(ids[3])
    assert view is not None and view.waiting_for == "limit crm-api: 3 of 3 started in 10s"
    clock.advance(seconds=0.2)  # the first three left the window
    runner.poke_limits()
    assert [j.id for j in runner.claim(10)] == ids[3:6]


def test_per_tenant_partitions_each_have_the_limit(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=1, per="tenant"))
    for tenant in ("a", "b", "c"):
        for _ in range(2):
            app.enqueue("crm.sync", {}, tenant=tenant)
    app.enqueue("crm.sync", {})  # no tenant: the "" partition
    taken = app.runner().claim(10)
    assert sorted(j.tenant or "" for j in taken) == ["", "a", "b", "c"]


def test_per_payload_key(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=1, per="payload.account"))
    for account in (1, 1, 2, "x", "x"):
        app.enqueue("crm.sync", {"account": account})
    taken = app.runner().claim(10)
    assert sorted(str(j.payload["account"]) for j in taken) == ["1", "2", "x"]


def test_queue_limit_and_handler_naming_a_limit(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(Limit("mail", queues=["mail"], concurrency=1), Limit("api", concurrency=1))

    @app.handler("mail.send", queue="mail")
    def send(job: Any) -> None:
        pass

    @app.handler("api.call", limits=["api"])
    def call(job: Any) -> None:
        pass

    for _ in range(3):
        app.enqueue("api.call", {})
    mail = [app.enqueue("mail.send", {}, queue="mail") for _ in range(3)]
    runner = app.runner(dataclasses.replace(app.worker_settings, queues=("default", "mail")))
    taken = runner.claim(10)
    assert sorted(j.handler for j in taken) == ["api.call", "mail.send"]
    view = app.get_job(mail[1])
    assert view is not None and view.waiting_for == "limit mail: 1 of 1 running"


def test_a_job_under_two_limits_needs_room_in_both(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(
        Limit("a", handlers=["crm.sync"], concurrency=3),
        Limit("b", queues=["default"], concurrency=1),
    )
    for _ in range(3):
        app.enqueue("crm.sync", {})
    assert len(app.runner().claim(10)) == 1


def test_takeover_of_a_stopped_worker_gives_the_place_back(
    make_app: Callable[..., Scheduler], clock: Clock
) -> None:
    limit = Limit("crm-api", handlers=["free"], concurrency=1)
    dead, alive = make_app(limit, lease_seconds=5), make_app(limit, lease_seconds=5)
    first, second = alive.enqueue("free", {}), alive.enqueue("free", {})
    assert [j.id for j in dead.runner().claim(5)] == [first]  # then it "dies"
    runner = alive.runner()
    assert runner.claim(5) == []
    clock.advance(seconds=6)  # its lease ran out; "free" is not retry-safe: abandoned
    assert runner.take_over() == []
    gone = alive.get_job(first)
    assert gone is not None and (gone.state, gone.last_error_code) == ("aborted", "abandoned")
    runner.poke_limits()
    assert [j.id for j in runner.claim(5)] == [second]


def test_takeover_that_runs_again_keeps_one_place(
    make_app: Callable[..., Scheduler], clock: Clock
) -> None:
    limit = Limit("crm-api", handlers=["crm.sync"], concurrency=1)
    dead, alive = make_app(limit, lease_seconds=5), make_app(limit, lease_seconds=5)
    first, second = alive.enqueue("crm.sync", {}), alive.enqueue("crm.sync", {})
    assert [j.id for j in dead.runner().claim(5)] == [first]
    clock.advance(seconds=6)
    runner = alive.runner()
    again = runner.take_over()
    assert [j.id for j in again] == [first]  # retry-safe: it runs again, still one place
    runner.poke_limits()
    assert runner.claim(5) == []
    runner.record([runner.execute(again[0])])
    runner.poke_limits()
    assert [j.id for j in runner.claim(5)] == [second]


def test_fair_rotation_starts_every_single_job_tenant_within_one_round(
    make_app: Callable[..., Scheduler], db_url: str
) -> None:
    big, small = (2000, 200) if db_url.startswith("sqlite") else (600, 60)
    app = make_app(
        Limit("crm-api", handlers=["crm.sync"], concurrency=10_000, per="tenant", fair=True)
    )
    app.enqueue_many(
        [{"handler": "crm.sync", "tenant": "big"} for _ in range(big)]
        + [{"handler": "crm.sync", "tenant": f"t{n:04}"} for n in range(small)]
    )
    runner = app.runner()
    order: list[str] = []
    while len(order) < small + 1:
        runner.poke_limits()
        order += [j.tenant or "" for j in runner.claim(1)]
    # One rotation: every tenant once, the big one included, no tenant twice.
    assert sorted(order) == sorted(["big", *(f"t{n:04}" for n in range(small))])
    runner.poke_limits()
    assert [j.tenant for j in runner.claim(1)] == ["big"]  # the next round


def test_unfair_order_is_the_queue_order(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=100, per="tenant"))
    ids = [app.enqueue("crm.sync", {}, tenant="big") for _ in range(5)]
    app.enqueue("crm.sync", {}, tenant="small")
    assert [j.id for j in app.runner().claim(5)] == ids


def test_prune_keeps_what_still_counts(make_app: Callable[..., Scheduler], clock: Clock) -> None:
    from scheduler._store import limits as _limits

    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=5, rate="10/60s"))
    for _ in range(3):
        app.enqueue("crm.sync", {})
    runner = app.runner()
    taken = runner.claim(3)
    runner.record([runner.execute(taken[0])])
    clock.advance(seconds=61)
    with app.store.begin() as conn:  # in the window's margin: kept (other workers' clocks)
        assert _limits.prune(conn, app.limit_set(), clock()) == 0
    clock.advance(seconds=5)
    with app.store.begin() as conn:
        assert _limits.prune(conn, app.limit_set(), clock()) == 1  # the finished one
        left = conn.execute(select(func.count()).select_from(limit_holds)).scalar_one()
    assert left == 2  # still running


def test_work_runs_jobs_under_limits(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=2, per="tenant"))
    for tenant in ("a", "b"):
        for _ in range(3):
            app.enqueue("crm.sync", {}, tenant=tenant)
    assert app.work() == 6
    assert {j.state for j in app.jobs()} == {"succeeded"}


def test_the_presence_write_carries_the_look_under_limits(
    make_app: Callable[..., Scheduler], clock: Clock
) -> None:
    """An idle worker's look for jobs under its limits rides on its presence write where the
    engine returns from an UPDATE (PostgreSQL, SQLite): False with nothing ready, True once a
    job under a limit is, and not asked at all on MariaDB (the worker looks by itself)."""
    from scheduler._store.status import health

    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=2))
    runner = app.runner()
    probe = runner.limits_probe(("default",))
    if not app.store.caps.update_returning:
        assert probe is None
        return
    health.touch(app.store, "w-probe", clock(), None)  # registered: the next is an update

    def look() -> bool | None:
        seen = health.touch(
            app.store,
            "w-probe",
            clock(),
            None,
            paused=True,
            probe=runner.limits_probe(("default",)),
        )
        assert seen is not None
        return seen.ready_under_limits

    assert look() is False
    app.enqueue("free")  # under no limit: not this look's
    assert look() is False
    app.enqueue("crm.sync")
    assert look() is True
    assert make_app().runner().limits_probe(("default",)) is None  # no limits: nothing to carry
