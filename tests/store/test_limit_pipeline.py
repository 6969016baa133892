"""The claim under limits in one round trip (``scheduler/_store/limits_pipeline.py``), on
PostgreSQL directly and through PgBouncer: real connections racing (threads released together
by a barrier, each with its own engine), a rate counted in every window, partitions, a job
cancelled between the unlocked read and the locked claim, what a held job says, and a lock
wait that times out."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from helpers.queue_worker import Clock
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from scheduler import Limit, Scheduler
from scheduler._model.handlers import Registry
from scheduler._model.job import Job
from scheduler._store import limits_pipeline
from scheduler._store.tables import limits
from scheduler._worker.runner import Runner

T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)
RACERS = 6


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def make_app(pg_url: str, clock: Clock) -> Iterator[Callable[..., Scheduler]]:
    made: list[Scheduler] = []

    def make(*limits: Limit) -> Scheduler:
        app = Scheduler(
            pg_url, registry=Registry(), clock=clock, limits=limits, worker_id=f"w{len(made)}"
        )
        made.append(app)
        app.handler("crm.sync", retry_safe=True)(lambda job: None)
        return app

    yield make
    for app in made:
        app.close()


def racers(apps: list[Scheduler]) -> list[Runner]:
    """A runner per app, each on its own queue: their candidates differ, so only the count
    under the lock keeps them from each filling the limit (the same candidates would be
    kept apart by the jobs' own row locks anyway)."""
    return [
        app.runner(dataclasses.replace(app.worker_settings, queues=(f"q{index}",)))
        for index, app in enumerate(apps)
    ]


def race(runners: list[Runner], want: int) -> list[list[Job]]:
    """Every runner claims at once (released by one barrier); what each won."""
    barrier = threading.Barrier(len(runners))
    won: list[list[Job]] = [[] for _ in runners]
    errors: list[BaseException] = []

    def claim(index: int) -> None:
        try:
            runners[index].poke_limits()
            barrier.wait(timeout=30)
            won[index] = runners[index].claim(want, limited=want)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(runners))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return won


def finish(runners: list[Runner], running: list[tuple[int, Job]], n: int) -> list[tuple[int, Job]]:
    """The first ``n`` running attempts end (each recorded by the runner that claimed it)."""
    for index, job in running[:n]:
        runners[index].record([runners[index].execute(job)])
    return running[n:]


def test_the_fast_path_serves_unfair_limits_on_postgresql(
    make_app: Callable[..., Scheduler],
) -> None:
    plain = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=2, rate="5/1s"))
    assert limits_pipeline.covers(plain.store, plain.limit_set())
    fair = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=2, per="tenant", fair=True))
    assert not limits_pipeline.covers(fair.store, fair.limit_set())


@pytest.mark.citus  # on Citus the pipelined claim went past the limit: limits.claim serves it
def test_racing_claims_never_exceed_the_concurrency(make_app: Callable[..., Scheduler]) -> None:
    limit = Limit("crm-api", handlers=["crm.sync"], concurrency=5)
    apps = [make_app(limit) for _ in range(RACERS)]
    apps[0].enqueue_many(
        [{"handler": "crm.sync", "queue": f"q{n % RACERS}"} for n in range(12 * RACERS)]
    )
    runners = racers(apps)
    running: list[tuple[int, Job]] = []
    started = 0
    for _ in range(10):
        won = race(runners, 5)
        running += [(index, job) for index, jobs in enumerate(won) for job in jobs]
        started += sum(len(jobs) for jobs in won)
        assert len(running) == 5  # never more, and every free place taken
        assert len({job.id for _, job in running}) == 5
        running = finish(runners, running, 2)
    assert started == 5 + 9 * 2
    states = Counter(job.state for job in apps[0].jobs(limit=100))
    assert states["claimed"] == 3


def test_racing_claims_keep_each_partitions_concurrency(
    make_app: Callable[..., Scheduler],
) -> None:
    limit = Limit("crm-api", handlers=["crm.sync"], concurrency=2, per="tenant")
    apps = [make_app(limit) for _ in range(RACERS)]
    apps[0].enqueue_many(
        [
            {"handler": "crm.sync", "tenant": tenant, "queue": f"q{n}"}
            for tenant in "abc"
            for n in range(RACERS)
            for _ in range(7)
        ]
    )
    runners = racers(apps)
    running: list[tuple[int, Job]] = []
    for _ in range(6):
        won = race(runners, 4)
        running += [(index, job) for index, jobs in enumerate(won) for job in jobs]
        per_tenant = Counter(job.tenant for _, job in running)
        assert per_tenant == {"a": 2, "b": 2, "c": 2}  # each partition full, none above
        # One of each tenant's attempts ends.
        ending = {job.tenant: (index, job) for index, job in running}
        for index, job in ending.values():
            runners[index].record([runners[index].execute(job)])
        running = [(i, j) for i, j in running if (i, j) not in ending.values()]


def test_racing_claims_never_exceed_a_rate_in_any_window(
    make_app: Callable[..., Scheduler], clock: Clock
) -> None:
    limit = Limit("crm-api", handlers=["crm.sync"], rate="4/10s")
    apps = [make_app(limit) for _ in range(RACERS)]
    apps[0].enqueue_many(
        [{"handler": "crm.sync", "queue": f"q{n % RACERS}"} for n in range(12 * RACERS)]
    )
    runners = racers(apps)
    starts: list[tuple[datetime, int]] = []
    for _ in range(12):
        won = race(runners, 3)
        count = sum(len(jobs) for jobs in won)
        starts.append((clock(), count))
        for index, jobs in enumerate(won):  # done at once: a rate counts starts, not runs
            runners[index].record([runners[index].execute(job) for job in jobs])
        clock.advance(seconds=3)
    for at, _ in starts:  # every window (at - 10s, at] that ends on a claim
        assert sum(n for t, n in starts if at - timedelta(seconds=10) < t <= at) <= 4
    # ... and the rate is used: 4 starts in every window of four claims (12 s).
    assert [n for _, n in starts] == [4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0]


def test_a_job_cancelled_between_the_read_and_the_claim_is_not_claimed(
    make_app: Callable[..., Scheduler],
) -> None:
    from sqlalchemy import event

    app = make_app(Limit("crm-api", handlers=["crm.sync"], concurrency=5))
    operator = make_app()
    first, second = app.enqueue("crm.sync", {}), app.enqueue("crm.sync", {})
    cancelled: list[bool] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        # The candidates were read (both jobs); the lock is about to be asked for.
        if statement.startswith("UPDATE scheduler_limits") and not cancelled:
            cancelled.append(
                operator.cancel_job(first, reason="changed my mind").state == "aborted"
            )

    event.listen(app.store.engine, "before_cursor_execute", before)
    try:
        taken = app.runner().claim(5, limited=5)
    finally:
        event.remove(app.store.engine, "before_cursor_execute", before)
    assert cancelled == [True]
    assert [job.id for job in taken] == [second]
    gone = app.get_job(first)
    assert gone is not None
    assert (gone.state, gone.last_error_code, gone.attempts) == ("aborted", "cancelled", 0)


def test_a_held_job_says_what_it_waits_for(make_app: Callable[..., Scheduler]) -> None:
    app = make_app(
        Limit("crm-api", handlers=["crm.sync"], concurrency=2, per="tenant"),
        Limit("mail", queues=["default"], rate="3/10s"),
    )
    a = [app.enqueue("crm.sync", {}, tenant="a") for _ in range(3)]
    b = [app.enqueue("crm.sync", {}, tenant="b") for _ in range(3)]
    runner = app.runner()
    # Tenant a fills its two places. Its third job counts against the rate's room in the
    # same claim though crm-api holds it back (the ranks are conservative): b's first job
    # comes with the next claim, the rate's last start.
    assert [job.id for job in runner.claim(10, limited=10)] == [a[0], a[1]]
    runner.poke_limits()
    assert [job.id for job in runner.claim(10, limited=10)] == [b[0]]
    held = app.get_job(a[2])
    assert held is not None and (held.state, held.attempts) == ("queued", 0)
    assert held.waiting_for == "limit crm-api: 2 of 2 running"
    other = app.get_job(b[1])
    assert other is not None and (other.state, other.attempts) == ("queued", 0)
    assert other.waiting_for == "limit mail: 3 of 3 started in 10s"
    runner.poke_limits()
    assert runner.claim(10, limited=10) == []


def test_a_limit_name_with_quotes_and_percent_signs(make_app: Callable[..., Scheduler]) -> None:
    # The names are written into the SQL as literals: escaped, and read back as written.
    name = "crm%api's"
    app = make_app(Limit(name, handlers=["crm.sync"], concurrency=1))
    other = make_app(Limit(name, handlers=["crm.sync"], concurrency=1))
    ids = [app.enqueue("crm.sync", {}) for _ in range(2)]
    assert [job.id for job in app.runner().claim(5, limited=5)] == [ids[0]]
    assert other.runner().claim(5, limited=5) == []
    held = app.get_job(ids[1])
    assert held is not None and held.waiting_for == f"limit {name}: 1 of 1 running"
    with app.store.read() as conn:  # the lock was taken by that name, once
        assert conn.execute(select(limits.c.version).where(limits.c.name == name)).scalar() == 1


def test_a_lock_wait_that_times_out_claims_nothing_and_leaves_the_connection_clean(
    make_app: Callable[..., Scheduler],
) -> None:
    limit = Limit("crm-api", handlers=["crm.sync"], concurrency=5)
    app, holder = make_app(limit), make_app(limit)
    ids = [app.enqueue("crm.sync", {}) for _ in range(2)]
    runner = app.runner()
    runner.claim(1, limited=1)  # the limit's row exists
    with holder.store.begin() as conn:  # another transaction holds the limit's lock
        conn.execute(update(limits).values(version=limits.c.version + 1))
        runner.poke_limits()
        with pytest.raises(OperationalError):  # lock_timeout: the whole claim rolled back
            runner.claim(1, limited=1)
    second = app.get_job(ids[1])
    assert second is not None and (second.state, second.attempts) == ("queued", 0)
    runner.poke_limits()
    assert [job.id for job in runner.claim(1, limited=1)] == [ids[1]]
    assert len(app.jobs(state="claimed")) == 2
