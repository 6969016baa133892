"""The web/worker split with real processes: a worker process (``scheduler worker --queues
crm``) registered the handler; a web process (``background_worker(concurrency=0)``, which never
imported the handler module) enqueues it, and the job gets the handler's queue and
max_attempts and runs on the worker. SQLite files and PostgreSQL (directly and through
PgBouncer)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store import handlers as _handlers

HANDLERS = """\
from pathlib import Path

from scheduler import default_registry


@default_registry.handler("crm.push", queue="crm", max_attempts=1)
def push(job):
    Path("ran.txt").write_text(str(job.id))
"""

WEB = """\
import json
import sys
import warnings

from scheduler import Scheduler

app = Scheduler.from_toml("web.toml")  # imports no handler module
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with app.background_worker(concurrency=0):
        job_id = app.enqueue("crm.push", {"customer": 42})
        unknown = app.enqueue("does.not.exist")
print(json.dumps({
    "job": job_id,
    "unknown": unknown,
    "registered": "crm.push" in app.registry,
    "warnings": [str(w.message) for w in caught],
}))
"""


def env() -> dict[str, str]:
    keep = ("SCHEDULER_DATABASE_POOLER", "SCHEDULER_DATABASE_LISTEN_URL")
    return {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_") or k in keep}


def wait_for(check: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s")


def test_a_web_process_enqueues_a_handler_only_the_worker_registered(
    db_url_sp: str, tmp_path: Path
) -> None:
    (tmp_path / "crm_handlers.py").write_text(HANDLERS)
    (tmp_path / "web.py").write_text(WEB)
    (tmp_path / "app.toml").write_text(
        f'[database]\nurl = "{db_url_sp}"\n\n[worker]\nimports = ["crm_handlers"]\n'
    )
    (tmp_path / "web.toml").write_text(f'[database]\nurl = "{db_url_sp}"\n')
    log = (tmp_path / "worker.log").open("w")
    reader = Scheduler(db_url_sp, registry=Registry())
    worker = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "worker", "--queues", "crm", "--concurrency", "2"],
        cwd=tmp_path,
        env=env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def registered() -> bool:
            with reader.store.read() as conn:
                return any(r.name == "crm.push" for r in _handlers.recorded(conn))

        wait_for(registered)
        web = subprocess.run(
            [sys.executable, "web.py"],
            cwd=tmp_path,
            env=env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert web.returncode == 0, web.stderr
        said = json.loads(web.stdout)
        assert said["registered"] is False  # the web process never imported the handlers
        [warning] = said["warnings"]
        assert "'does.not.exist'" in warning

        def done() -> bool:
            job = reader.get_job(said["job"])
            return job is not None and job.state == "succeeded"

        wait_for(done)
        job = reader.get_job(said["job"])
        assert job is not None and (job.queue, job.max_attempts) == ("crm", 1)
        assert (tmp_path / "ran.txt").read_text() == str(said["job"])
        # The job no process can run is listed by status, beside nothing else.
        health = reader.status()["health"]
        assert health["unserved"] == [{"handler": "does.not.exist", "ready": 1}]
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        reader.close()
        log.close()
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()
