"""A place under a limit handed on: an attempt that ends passes its places to the next ready job
that fits them, in the transaction that records the ending, so the running count of every
partition stays what it was and no claim needs to count. Only a ``concurrency`` hands on; a
rate, ``fair`` and a payload partition give their places back. Real databases, every engine;
many processes racing over one limit are ``tests/e2e/test_limits_race.py``'s (its workers hand
places on)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from helpers.queue_worker import Clock
from sqlalchemy import func, select

from scheduler import Limit, Scheduler
from scheduler._model.handlers import Registry
from scheduler._model.job import Job
from scheduler._store.tables import jobs, limit_holds

T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)


class Taker:
    """Stands where a worker stands (the runner's ``successors``): keeps what it is handed."""

    def __init__(self, queues: tuple[str, ...] | None = ("default",)) -> None:
        self.queues = queues
        self.handed: list[Job] = []

    def hand_on_queues(self) -> tuple[str, ...] | None:
        return self.queues

    def take_handed(self, handed: list[Job]) -> None:
        self.handed += handed


@pytest.fixture
def make_app(db_url: str) -> Iterator[Callable[..., Scheduler]]:
    made: list[Scheduler] = []

    def make(*limits: Limit) -> Scheduler:
        app = Scheduler(
            db_url, registry=Registry(), clock=Clock(T0), limits=limits, worker_id=f"w{len(made)}"
        )
        made.append(app)
        for name in ("crm.sync", "crm.push", "mail.send", "free"):
            app.registry.handler(name, retry_safe=True)(lambda job: None)
        return app

    yield make
    for app in made:
        app.close()


def claimed(app: Scheduler, handlers: list[str]) -> int:
    with app.store.read() as conn:
        query = select(func.count()).where(jobs.c.state == "claimed", jobs.c.handler.in_(handlers))
        return int(conn.execute(query).scalar_one())


def holds_of(app: Scheduler, job_id: int) -> list[tuple[str, str]]:
    with app.store.read() as conn:
        rows = conn.execute(
            select(limit_holds.c.limit_name, limit_holds.c.part).where(
                limit_holds.c.job_id == job_id
            )
        )
        return sorted((name, part) for name, part in rows)


def test_an_ending_attempt_hands_its_place_to_the_next_ready_job(
    make_app: Callable[..., Scheduler],
) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=2))
    ids = [app.enqueue("crm.sync", {"n": n}) for n in range(5)]
    runner, taker = app.runner(), Taker()
    runner.successors = taker
    running = runner.claim(10)
    assert [j.id for j in running] == ids[:2]
    runner.record([runner.execute(running[0])])
    assert [j.id for j in taker.handed] == [ids[2]]  # the next in the queue's order
    assert taker.handed[0].state == "claimed" and taker.handed[0].attempts == 1
    assert claimed(app, ["crm.sync"]) == 2  # the same two places
    assert holds_of(app, ids[2]) == [("crm-api", "")]
    assert app.runner().claim(10) == []  # another worker: still full
    runner.record([runner.execute(taker.handed[0])])  # a handed job hands on in turn
    assert [j.id for j in taker.handed] == [ids[2], ids[3]]
    assert app.get_job(ids[2]).state == "succeeded"


def test_without_a_taker_or_once_stopping_the_place_goes_back(
    make_app: Callable[..., Scheduler],
) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=1))
    ids = [app.enqueue("crm.sync", {"n": n}) for n in range(3)]
    runner = app.runner()
    [first] = runner.claim(10)
    runner.record([runner.execute(first)])  # no successors: given back
    assert claimed(app, ["crm.sync"]) == 0
    stopping = Taker(queues=None)
    runner.successors = stopping
    [second] = runner.claim(10)
    assert second.id == ids[1]
    runner.record([runner.execute(second)])
    assert stopping.handed == [] and claimed(app, ["crm.sync"]) == 0


def test_a_job_claimed_without_the_limit_hands_nothing_on(
    make_app: Callable[..., Scheduler],
) -> None:
    """A job that holds no place (claimed by a runner that knew no limit) frees none: handing
    one on would put one more attempt under the limit than its count says."""
    limit = Limit("crm-api", handlers=["crm.sync"], concurrency=1)
    app = make_app(limit)
    unaware = make_app()
    ids = [app.enqueue("crm.sync", {"n": n}) for n in range(3)]
    plain = unaware.runner()
    [first] = plain.claim(1)
    taker = Taker()
    plain.successors = taker
    plain.record([plain.execute(first)])
    assert taker.handed == []
    runner = app.runner()
    runner.successors = taker
    [second] = runner.claim(10)
    assert second.id == ids[1]


@pytest.mark.parametrize(
    "limit",
    [
        Limit("crm-api", handlers=["crm.sync"], concurrency=1, rate="100/1s"),
        Limit("crm-api", handlers=["crm.sync"], concurrency=1, per="tenant", fair=True),
        Limit("crm-api", handlers=["crm.sync"], concurrency=1, per="payload.account"),
    ],
    ids=["rate", "fair", "payload"],
)
def test_a_rate_fair_or_a_payload_partition_gives_the_place_back(
    make_app: Callable[..., Scheduler], limit: Limit
) -> None:
    app = make_app(limit)
    for _ in range(3):
        app.enqueue("crm.sync", {"account": "a"}, tenant="t1")
    runner, taker = app.runner(), Taker()
    runner.successors = taker
    [first] = runner.claim(10)
    runner.record([runner.execute(first)])
    assert taker.handed == []
    assert claimed(app, ["crm.sync"]) == 0


def test_a_partition_hands_its_place_within_itself(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=1, per="tenant"))
    a1 = app.enqueue("crm.sync", {}, tenant="a")
    b1 = app.enqueue("crm.sync", {}, tenant="b")
    b2 = app.enqueue("crm.sync", {}, tenant="b")
    a2 = app.enqueue("crm.sync", {}, tenant="a")
    runner, taker = app.runner(), Taker()
    runner.successors = taker
    assert [j.id for j in runner.claim(10)] == [a1, b1]
    runner.record([runner.execute(app.get_job(a1))])
    assert [j.id for j in taker.handed] == [a2]  # not b2, first in the queue: no place of b
    assert holds_of(app, a2) == [("crm-api", "a")]
    runner.record([runner.execute(app.get_job(b1))])
    assert [j.id for j in taker.handed] == [a2, b2]


def test_a_place_goes_only_to_a_job_under_no_other_limit(
    make_app: Callable[..., Scheduler],
) -> None:
    """``crm.push`` is under both limits, ``crm.sync`` under ``crm-api`` only: a push's places
    fit a sync (a subset), a sync's place does not fit a push (it would take a ``push`` place
    nobody gave up)."""
    api = Limit("crm-api", handlers=["crm.sync", "crm.push"], concurrency=2)
    push = Limit("push", handlers=["crm.push"], concurrency=1)
    app = make_app(api, push)
    sync1 = app.enqueue("crm.sync", {})
    push1 = app.enqueue("crm.push", {})
    push2 = app.enqueue("crm.push", {})
    sync2 = app.enqueue("crm.sync", {})
    runner, taker = app.runner(), Taker()
    runner.successors = taker
    assert [j.id for j in runner.claim(10)] == [sync1, push1]
    runner.record([runner.execute(app.get_job(sync1))])
    assert [j.id for j in taker.handed] == [sync2]  # push2 came first, but needs a push place
    runner.record([runner.execute(app.get_job(push1))])
    assert [j.id for j in taker.handed] == [sync2, push2]  # both places: push2 fits
    assert holds_of(app, push2) == [("crm-api", ""), ("push", "")]


def test_several_endings_in_one_batch_hand_on_as_many(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=3))
    ids = [app.enqueue("crm.sync", {"n": n}) for n in range(8)]
    runner, taker = app.runner(), Taker()
    runner.successors = taker
    running = runner.claim(10)
    runner.record([runner.execute(job) for job in running])
    assert [j.id for j in taker.handed] == ids[3:6]
    assert claimed(app, ["crm.sync"]) == 3


def test_handing_on_races_the_claims_that_count(
    db_url: str, make_app: Callable[..., Scheduler]
) -> None:
    """Four runners on their own connections, two handing places on and two claiming by the
    count, over a limit of 3: never more than 3 claimed at once (read after every step by the
    runners themselves), and every job runs once."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite has one writer at a time: nothing to race")
    concurrency, total = 3, 120
    limit = Limit("crm-api", handlers=["crm.sync"], concurrency=concurrency)
    apps = [make_app(limit) for _ in range(4)]
    for n in range(total):
        apps[0].enqueue("crm.sync", {"n": n})
    seen: list[int] = []
    most = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(len(apps))
    errors: list[BaseException] = []

    def race(app: Scheduler, hands_on: bool) -> None:
        try:
            runner, taker = app.runner(), Taker()
            if hands_on:
                runner.successors = taker
            barrier.wait()
            idle = 0
            while idle < 20:
                mine = runner.claim(2) + taker.handed
                taker.handed = []
                if not mine:
                    idle += 1
                    continue
                idle = 0
                while mine:
                    now = claimed(app, ["crm.sync"])
                    with lock:
                        most[0] = max(most[0], now)
                        seen.extend(job.id for job in mine[:1])
                    runner.record([runner.execute(mine[0])])
                    mine = mine[1:] + taker.handed
                    taker.handed = []
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(app, n % 2 == 0)) for n, app in enumerate(apps)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert most[0] <= concurrency
    assert sorted(seen) == sorted(set(seen)) and len(seen) == total
