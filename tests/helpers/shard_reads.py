"""A sharded app with rows, jobs, runs and audit entries in every shard, for the tests of the
reads across shards (status, the CLI, the dashboard, the metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from scheduler import PermanentError, Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs

SHARDS = 4
TASKS = 60  # more than a dashboard page (50): the pages merge across shards
TENANTS = 12


@dataclass
class Seeded:
    """What :func:`seed` wrote, by shard."""

    app: Scheduler
    tasks: dict[int, list[str]] = field(default_factory=dict)  # shard: task names
    jobs: dict[int, list[int]] = field(default_factory=dict)  # shard: every job id
    aborted: dict[int, list[int]] = field(default_factory=dict)
    queued: dict[int, list[int]] = field(default_factory=dict)
    disabled: dict[int, str] = field(default_factory=dict)  # shard: a task disabled there

    @property
    def names(self) -> list[str]:
        return sorted(name for names in self.tasks.values() for name in names)

    @property
    def job_ids(self) -> list[int]:
        return sorted(i for ids in self.jobs.values() for i in ids)

    def shard_of_task(self, name: str) -> int:
        return next(k for k, names in self.tasks.items() if name in names)


def sharded_app(url: str, **kwargs: Any) -> Scheduler:
    """An app of :data:`SHARDS` shards on `url` (migrated: the ``sharded_url`` fixture's), with
    the handlers ``t.ok`` and ``t.bad`` (which aborts at once)."""
    app = Scheduler(url, shards=SHARDS, registry=Registry(), **kwargs)

    @app.handler("t.ok", retry_safe=True)
    def ok(job: Any) -> None:
        return None

    @app.handler("t.bad", retry_safe=True, max_attempts=1)
    def bad(job: Any) -> None:
        raise PermanentError("bad_input")

    return app


def seed(app: Scheduler) -> Seeded:
    """Tasks of :data:`TENANTS` tenants; in each shard a task triggered and run, a job that
    aborted, queued jobs, and a task disabled with a reason (audited)."""
    app.put_tasks(
        TaskSpec(f"task-{i:02d}", "0 3 * * *", "t.ok", {}, "UTC", tenant=f"tenant-{i % TENANTS}")
        for i in range(TASKS)
    )
    found = Seeded(app)
    for index, shard in enumerate(app.shards):
        found.tasks[index] = [row.name for row in shard.rows(limit=None)]
    assert all(found.tasks[k] for k in range(SHARDS)), found.tasks  # every shard has tasks
    for names in found.tasks.values():
        app.trigger(names[0], reason="seed")  # due now: the tick dispatches it
    app.tick()  # in every shard, and recorded there
    for index, names in found.tasks.items():
        tenant = app.get_row(names[0]).tenant  # type: ignore[union-attr]
        found.aborted[index] = [app.enqueue("t.bad", tenant=tenant)]
    app.work()
    for index, names in found.tasks.items():
        tenant = app.get_row(names[0]).tenant  # type: ignore[union-attr]
        found.queued[index] = app.enqueue_many([{"handler": "t.ok", "tenant": tenant}] * 15)
        app.disable(names[1], reason=f"seed shard {index}")
        found.disabled[index] = names[1]
        with app.shards[index].store.read() as conn:
            found.jobs[index] = list(conn.execute(select(jobs.c.id)).scalars())
    return found
