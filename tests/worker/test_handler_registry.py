"""Handler settings known to every process: a worker records its handlers when it starts (one
upsert), ``enqueue`` where a handler is not registered uses them (read once, then kept), a
handler no worker registered warns once, and ``status`` lists ready jobs no live worker runs.
On every engine."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, select

from scheduler import Job, Scheduler, TaskSpec, UnknownHandlerWarning
from scheduler._model.handlers import Registry
from scheduler._store import handlers as _handlers
from scheduler._store.status import health as _health
from scheduler._store.tables import handlers as handlers_table
from scheduler._worker.worker import Worker


def worker_app(url: str, **settings: Any) -> Scheduler:
    registry = Registry()
    registry.handler("crm.push", queue="crm", max_attempts=1)(lambda job: None)
    registry.handler("crm.sync", queue="crm", max_attempts=5, retry_safe=True)(lambda job: None)
    return Scheduler(url, registry=registry, **settings)


@contextmanager
def statements(app: Scheduler) -> Iterator[list[str]]:
    """Every SQL statement ``app``'s engine runs inside the block."""
    seen: list[str] = []

    def on_execute(*args: Any) -> None:
        seen.append(str(args[2]))

    event.listen(app.store.engine, "before_cursor_execute", on_execute)
    try:
        yield seen
    finally:
        event.remove(app.store.engine, "before_cursor_execute", on_execute)


def recorded(app: Scheduler) -> dict[str, tuple[str, int, bool]]:
    with app.store.read() as conn:
        return {r.name: (r.queue, r.max_attempts, r.retry_safe) for r in _handlers.recorded(conn)}


def test_a_starting_worker_records_its_handlers_in_one_statement(db_url: str) -> None:
    worker = worker_app(db_url)
    try:
        with statements(worker) as seen:
            Worker(worker).run(once=True)
        touching = [s.lstrip().upper() for s in seen if "scheduler_handlers" in s]
        writes = [s for s in touching if not s.startswith("SELECT")]
        assert len(writes) == 1 and writes[0].startswith("INSERT")  # both handlers at once
        assert recorded(worker) == {
            "crm.push": ("crm", 1, False),
            "crm.sync": ("crm", 5, True),
        }
        # A new release of the handler: the next start updates the row in place.
        worker.registry.handler("crm.push", queue="crm-slow", max_attempts=2)(lambda job: None)
        Worker(worker).run(once=True)
        assert recorded(worker)["crm.push"] == ("crm-slow", 2, False)
        with worker.store.read() as conn:
            by = conn.execute(select(handlers_table.c.registered_by)).scalars().all()
        assert set(by) == {worker.worker_id}
    finally:
        worker.close()


def test_enqueue_where_the_handler_is_not_registered_uses_the_recorded_settings(
    db_url: str,
) -> None:
    worker = worker_app(db_url)
    web = Scheduler(db_url, registry=Registry())  # a web process: imported no handler module
    try:
        Worker(worker).run(once=True)
        with statements(web) as seen:
            first = web.get_job(web.enqueue("crm.push", {"n": 1}))
            lookups = [s for s in seen if "scheduler_handlers" in s]
            seen.clear()
            second = web.get_job(web.enqueue("crm.push", {"n": 2}))
            again = [s for s in seen if "scheduler_handlers" in s]
        assert first is not None and second is not None
        assert (first.queue, first.max_attempts) == ("crm", 1)
        assert (second.queue, second.max_attempts) == ("crm", 1)
        assert len(lookups) == 1 and again == []  # read once, then kept
        # What the caller gives still wins; so does the process's own registration.
        given = web.get_job(web.enqueue("crm.push", queue="urgent", max_attempts=4))
        assert given is not None and (given.queue, given.max_attempts) == ("urgent", 4)
        [item] = web.enqueue_many([{"handler": "crm.sync"}])
        many = web.get_job(item)
        assert many is not None and (many.queue, many.max_attempts) == ("crm", 5)
    finally:
        web.close()
        worker.close()


def test_a_locally_registered_handler_reads_nothing(db_url: str) -> None:
    worker = worker_app(db_url)
    try:
        with statements(worker) as seen:
            worker.enqueue("crm.push")
        assert not [s for s in seen if "scheduler_handlers" in s]
    finally:
        worker.close()


def test_a_handler_no_worker_registered_warns_once_and_is_enqueued(db_url: str) -> None:
    web = Scheduler(db_url, registry=Registry())
    try:
        with pytest.warns(UnknownHandlerWarning, match="'does.not.exist' is not registered"):
            job_id = web.enqueue("does.not.exist")
        job = web.get_job(job_id)
        assert job is not None and (job.queue, job.max_attempts, job.state) == (
            "default",
            3,
            "queued",
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            web.enqueue("does.not.exist")
            web.enqueue_many([{"handler": "does.not.exist"}])
        assert caught == []  # once per name per process
        with pytest.warns(UnknownHandlerWarning, match="'other.name'"):
            web.enqueue_many([{"handler": "other.name"}])
    finally:
        web.close()


def test_a_worker_that_registers_later_is_seen_after_the_cache_expires(db_url: str) -> None:
    web = Scheduler(db_url, registry=Registry())
    worker = worker_app(db_url)
    try:
        with pytest.warns(UnknownHandlerWarning):
            web.enqueue("crm.push")
        Worker(worker).run(once=True)
        kept = web.get_job(web.enqueue("crm.push"))
        assert kept is not None and kept.queue == "default"  # within the cache's time
        web.known_handlers.forget()  # what KEEP_SECONDS' expiry does
        fresh = web.get_job(web.enqueue("crm.push"))
        assert fresh is not None and (fresh.queue, fresh.max_attempts) == ("crm", 1)
    finally:
        worker.close()
        web.close()


def test_status_lists_ready_jobs_that_no_live_worker_runs(db_url: str) -> None:
    app = Scheduler(db_url, registry=Registry())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnknownHandlerWarning)
            for name in ("crm.push", "crm.push", "billing.charge", "reports.build"):
                app.enqueue(name)
        assert app.status()["health"]["unserved"] == [  # no worker at all
            {"handler": "billing.charge", "ready": 1},
            {"handler": "crm.push", "ready": 2},
            {"handler": "reports.build", "ready": 1},
        ]
        now = app.clock()
        served = _handlers.names_text(["crm.push", "reports.build"])
        _health.touch(app.store, "web-1", now, None, handlers=_handlers.names_text([]))
        _health.touch(app.store, "worker-1", now, None, handlers=served)
        assert app.status()["health"]["unserved"] == [{"handler": "billing.charge", "ready": 1}]
        # A worker of an older release did not say what it runs: it may run anything.
        _health.touch(app.store, "old-worker", now, None)
        assert app.status()["health"]["unserved"] == []
    finally:
        app.close()


def triggered(app: Scheduler, name: str) -> Job | None:
    """Trigger task ``name`` and tick: the job the tick dispatched."""
    app.trigger(name)
    app.tick()
    row = app.get_row(name)
    assert row is not None and row.last_job_id is not None
    return app.get_job(row.last_job_id)


def test_a_tick_only_worker_gives_task_jobs_the_recorded_settings(db_url: str) -> None:
    worker = worker_app(db_url)
    task = TaskSpec(name="push-nightly", cron="0 3 * * *", handler="crm.push")
    web = Scheduler(db_url, registry=Registry(), tasks=[task])  # imports no handler module
    try:
        Worker(worker).run(once=True)
        web.sync()
        before = triggered(web, "push-nightly")
        assert before is not None and (before.queue, before.max_attempts) == ("default", 3)
        web.cancel_job(before.id)
        # A worker with concurrency 0 (tick only, as in a web process) reads the records when
        # it starts: its tick and trigger give the task's jobs the handler's settings.
        Worker(web, concurrency=0).run(once=True)
        after = triggered(web, "push-nightly")
        assert after is not None and (after.queue, after.max_attempts) == ("crm", 1)
    finally:
        web.close()
        worker.close()
