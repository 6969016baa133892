"""Fences: every attempt carries ``job.fence``, and ``job.complete(connection=...)`` records the
success in the handler's own transaction unless the attempt was fenced.

The victim, a real worker process, claims the job under a 1-second lease and stalls in its
handler; the test stops it with SIGSTOP past its lease. A rescuer takes the job over (a larger
fence), writes its result guarded by ``WHERE fence < :fence`` and completes. Then the victim is
resumed with SIGCONT: its guarded write changes nothing and ``complete`` raises ``LeaseLost``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.fenced_effect import effect_handler, effects, effects_metadata
from sqlalchemy import delete, insert, select, update

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import runs

VICTIM = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    sys.path.insert(0, sys.argv[3])
    from fenced_effect import effect_handler

    from scheduler import Scheduler
    from scheduler._model.handlers import Registry

    app = Scheduler(sys.argv[1], registry=Registry(), worker_id="victim", lease_seconds=1)
    effect_handler(app, "victim", Path(sys.argv[2]))
    app.work()
    app.close()
    """
)


def test_a_resumed_worker_past_its_lease_changes_nothing_and_complete_raises(
    db_url: str, tmp_path: Path
) -> None:
    app = Scheduler(db_url, registry=Registry(), worker_id="rescuer", lease_seconds=30)
    effect_handler(app, "rescuer", tmp_path)
    effects_metadata.create_all(app.store.engine)
    with app.store.begin() as conn:  # the table outlives a test (the scheduler's are reset)
        conn.execute(delete(effects))
        conn.execute(insert(effects).values(id=1, owner="nobody", fence=0))
    job_id = app.enqueue("effect", {})
    here = str(Path(__file__).resolve().parents[1] / "helpers")
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIM, db_url, str(tmp_path), here],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            if victim.poll() is not None:
                pytest.fail(f"the victim exited first: {victim.stderr.read().decode()}")  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the victim never ran its handler"
            time.sleep(0.02)
        os.kill(victim.pid, signal.SIGSTOP)
        time.sleep(1.5)  # past the victim's 1-second lease
        deadline = time.monotonic() + 30
        while app.get_job(job_id).state != "succeeded":  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the rescuer never took the job over"
            app.work()
            time.sleep(0.1)
        (tmp_path / "go").touch()
        os.kill(victim.pid, signal.SIGCONT)
        _, err = victim.communicate(timeout=60)
        assert victim.returncode == 0, err.decode()
    finally:
        if victim.poll() is None:
            os.kill(victim.pid, signal.SIGCONT)
            victim.kill()
            victim.wait()
    lines = sorted((tmp_path / "results").read_text().splitlines())
    assert lines == ["rescuer 2 1 completed", "victim 1 0 lease_lost"]
    job = app.get_job(job_id)
    assert job is not None and job.state == "succeeded" and job.fence == 2
    with app.store.read() as conn:
        assert tuple(conn.execute(select(effects.c.owner, effects.c.fence)).one()) == (
            "rescuer",
            2,
        )
        outcomes = conn.execute(
            select(runs.c.outcome, runs.c.worker).where(runs.c.job_id == job_id).order_by(runs.c.id)
        ).all()
    # the victim's lost attempt, the rescuer's success (written by complete): nothing more
    assert [tuple(o) for o in outcomes] == [("lost", "victim"), ("succeeded", "rescuer")]
    app.close()


def test_fences_grow_with_each_claim_and_rerun_and_complete_records_once(db_url: str) -> None:
    app = Scheduler(db_url, registry=Registry())
    seen: list[int] = []

    @app.handler("twice", retry_safe=True, max_attempts=3)
    def twice(job: Any) -> None:
        seen.append(job.fence)
        if len(seen) == 1:
            raise RuntimeError("first attempt fails")
        with app.store.engine.begin() as conn:
            job.complete(connection=conn)

    job_id = app.enqueue("twice", {})
    app.work()
    job = app.get_job(job_id)
    assert job is not None and job.state == "queued"  # a retry
    with app.store.begin() as conn:  # due now
        from scheduler._store.tables import jobs

        conn.execute(update(jobs).where(jobs.c.id == job_id).values(run_at=job.created_at))
    app.work()
    job = app.get_job(job_id)
    assert job is not None and job.state == "succeeded"
    assert seen == [1, 2] and job.fence == 2
    with app.store.read() as conn:
        outcomes = [
            r[0] for r in conn.execute(select(runs.c.outcome).where(runs.c.job_id == job_id))
        ]
    assert outcomes == ["failed", "succeeded"]  # complete() wrote the success, once
    app.close()
