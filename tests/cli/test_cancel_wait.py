"""``scheduler cancel ID --wait`` on a running job: returns once its worker stopped it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import RunningJob, Scheduler
from scheduler._model.handlers import Registry
from scheduler._worker.worker import Worker
from scheduler.cli import main


@pytest.fixture
def app(db_url_sp: str) -> Iterator[Scheduler]:
    found = Scheduler(db_url_sp, registry=Registry(), cancel_grace=0.5)
    yield found
    found.close()


def cancel(config: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    try:
        main(["--config", str(config), "cancel", *args])
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr().err
    return capsys.readouterr().out


def test_cancel_wait_returns_once_the_running_job_stopped(
    app: Scheduler,
    db_url_sp: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    config = tmp_path / "app.toml"
    config.write_text(f'[database]\nurl = "{db_url_sp}"\n')
    # The command exports SCHEDULER_CONFIG (for handler modules): set here, so that the
    # test's end takes it away again instead of leaving it to the next test of this process.
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    started = threading.Event()

    @app.handler("s.loop")
    def loop(job: RunningJob) -> None:
        started.set()
        while True:
            time.sleep(0.02)
            job.check()

    job_id = app.enqueue("s.loop")
    worker = Worker(app, serve_metrics=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert started.wait(10)
        began = time.monotonic()
        out = cancel(config, capsys, str(job_id), "--wait", "--reason", "test")
        took = time.monotonic() - began
    finally:
        worker.stop(force=True)
        thread.join(15)
    assert out.strip() == f"job {job_id} stopped: aborted with code cancelled"
    assert took < 2.5
    job = app.get_job(job_id)
    assert job is not None and (job.state, job.last_error_code) == ("aborted", "cancelled")
