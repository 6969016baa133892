"""``scheduler worker`` over shards (``[database] shards = 4``): one real worker process serves
every shard (ticks, claims, wake-ups per shard), ``--shards`` limits it to some, two workers
fire each slot once, and SIGTERM stops every shard's worker."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from helpers.cli import run_cli, write_config
from helpers.worker_process import WorkerProcess

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store import shards as _shards

SHARDS = 4
MARKS = """
import os, pathlib, time
from scheduler import default_registry

@default_registry.handler("t.mark", retry_safe=True)
def mark(job):
    folder = pathlib.Path(job.payload["dir"])
    (folder / f"{job.id}~{job.tenant}~{os.getpid()}~{time.monotonic_ns()}").touch()
"""


def _config(tmp_path: Path, url: str, tasks: str = "") -> Path:
    path = write_config(tmp_path, url, tasks=tasks)
    path.write_text(
        path.read_text()
        .replace("[database]\n", f"[database]\nshards = {SHARDS}\n")
        .replace('imports = ["cli_jobs"]', 'imports = ["cli_jobs", "marks"]')
    )
    (tmp_path / "marks.py").write_text(MARKS)
    return path


def _wait(predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def _tenants_per_shard() -> dict[int, list[str]]:
    chosen: dict[int, list[str]] = {i: [] for i in range(SHARDS)}
    i = 0
    while min(len(v) for v in chosen.values()) < 3:
        tenant = f"acct-{i}"
        chosen[_shards.shard_of(tenant, SHARDS)].append(tenant)
        i += 1
    return chosen


def test_one_worker_runs_every_shards_jobs_and_shards_limits_it(
    sharded_url: str, tmp_path: Path
) -> None:
    config = _config(tmp_path, sharded_url)
    marks = tmp_path / "marks"
    marks.mkdir()
    app = Scheduler(sharded_url, shards=SHARDS, registry=Registry())
    tenants = _tenants_per_shard()
    only = WorkerProcess(tmp_path, config, "--shards", "0-1")
    try:
        _wait(lambda: "started" in only.output())
        ids = {
            app.enqueue("t.mark", {"dir": str(marks)}, tenant=tenant): shard
            for shard, names in tenants.items()
            for tenant in names
        }
        served = {job_id for job_id, shard in ids.items() if shard in (0, 1)}
        _wait(lambda: {int(p.name.split("~")[0]) for p in marks.iterdir()} >= served)
        time.sleep(1.0)  # a poll's time: the other shards' jobs stay queued
        ran = {int(p.name.split("~")[0]) for p in marks.iterdir()}
        assert ran == served
        assert only.stop() == 0
    finally:
        only.kill()
    every = WorkerProcess(tmp_path, config)
    try:
        _wait(lambda: len(list(marks.iterdir())) == len(ids))
        assert every.stop() == 0
    finally:
        every.kill()
    ran_ids = [int(p.name.split("~")[0]) for p in marks.iterdir()]
    assert sorted(ran_ids) == sorted(ids)  # each exactly once
    assert all(app.get_job(job_id).state == "succeeded" for job_id in ids)  # type: ignore[union-attr]
    app.close()


def test_two_workers_fire_each_slot_of_every_shard_once(sharded_url: str, tmp_path: Path) -> None:
    tenants = _tenants_per_shard()
    tasks = "".join(
        f'[[tasks]]\nname = "every-second-{tenant}"\ncron = "* * * * * *"\n'
        f'handler = "t.mark"\ntenant = "{tenant}"\npayload = {{dir = "{tmp_path / "marks"}"}}\n'
        for names in tenants.values()
        for tenant in names[:2]
    )
    config = _config(tmp_path, sharded_url, tasks)
    (tmp_path / "marks").mkdir()
    done = run_cli(tmp_path, "--config", str(config), "sync")
    assert done.returncode == 0, done.stderr
    workers = [WorkerProcess(tmp_path, config) for _ in range(2)]
    try:
        for worker in workers:
            _wait(lambda worker=worker: worker.output().count("started") == SHARDS, 60)
        time.sleep(4)
        for worker in workers:
            assert worker.stop() == 0, worker.output()
    finally:
        for worker in workers:
            worker.kill()
    app = Scheduler(sharded_url, shards=SHARDS, registry=Registry())
    jobs = app.jobs(limit=1000)
    by_task: dict[str, list[object]] = {}
    for job in jobs:
        by_task.setdefault(str(job.task_name), []).append(job.slot)
    assert len(by_task) == 2 * SHARDS  # every shard's tasks fired
    for name, slots in by_task.items():
        assert len(slots) == len(set(slots)), name  # each slot once
        assert len(slots) >= 2, name
    pids = {p.name.split("~")[2] for p in (tmp_path / "marks").iterdir()}
    assert len(pids) == 2  # both workers ran jobs
    app.close()


@pytest.mark.direct  # a refused argument: the pooler's connections are never made
@pytest.mark.parametrize("bad", ["4", "0-9", "x"])
def test_worker_shards_outside_the_database_is_one_line(
    sharded_url: str, tmp_path: Path, bad: str
) -> None:
    config = _config(tmp_path, sharded_url)
    done = run_cli(tmp_path, "--config", str(config), "worker", "--shards", bad)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "worker --shards" in lines[0], done.stderr


def test_the_background_worker_serves_every_shard(sharded_url: str) -> None:
    registry = Registry()
    app = Scheduler(sharded_url, shards=SHARDS, registry=registry)
    ran: list[int] = []

    @registry.handler("t.note")
    def note(job: object) -> None:
        ran.append(job.id)  # type: ignore[attr-defined]

    tenants = _tenants_per_shard()
    with app.background_worker(concurrency=4):
        ids = [app.enqueue("t.note", tenant=t) for names in tenants.values() for t in names]
        _wait(lambda: sorted(ran) == sorted(ids))
    with pytest.raises(Exception, match="one shard"):
        app.runner()
    app.close()


def test_the_shards_share_the_workers_threads(sharded_url: str) -> None:
    """One shard's jobs use every thread while the others have none; jobs of every shard
    together never run on more threads than the worker's concurrency."""
    registry = Registry()
    app = Scheduler(sharded_url, shards=SHARDS, registry=registry)
    lock = threading.Lock()
    running = [0]
    most = [0]
    done: list[int] = []

    @registry.handler("t.busy")
    def busy(job: object) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
            done.append(job.id)  # type: ignore[attr-defined]

    tenants = _tenants_per_shard()
    with app.background_worker(concurrency=3):
        one_shard = [app.enqueue("t.busy", tenant=tenants[2][0]) for _ in range(9)]
        _wait(lambda: set(done) >= set(one_shard))
        assert most[0] == 3  # all three threads on shard 2's jobs
        most[0] = 0
        every = [app.enqueue("t.busy", tenant=t) for names in tenants.values() for t in names]
        _wait(lambda: set(done) >= set(every))
    assert most[0] == 3  # never more than the worker's threads, all shards together
    app.close()
