"""Shared by the clock and lock tests: worker processes, and the database's own
record of when each job was inserted.

:func:`record_inserts` installs a trigger on ``scheduler_jobs`` that writes each new job's id
and the server's time (``clock_timestamp()``; MariaDB ``UTC_TIMESTAMP(6)``, the statement's
start) into ``t17_inserted``: the tests judge lateness and early fires on the database's clock,
not on any host's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

WORKER = Path(__file__).with_name("clock_worker.py")

_PG_SETUP = [
    "CREATE TABLE t17_inserted (job_id BIGINT PRIMARY KEY,"
    " at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
    "CREATE FUNCTION t17_log() RETURNS trigger LANGUAGE plpgsql AS"
    " $$ BEGIN INSERT INTO t17_inserted (job_id) VALUES (NEW.id); RETURN NEW; END $$",
    "CREATE TRIGGER t17 AFTER INSERT ON scheduler_jobs FOR EACH ROW EXECUTE FUNCTION t17_log()",
]
_PG_TEARDOWN = [
    "DROP TRIGGER IF EXISTS t17 ON scheduler_jobs",
    "DROP FUNCTION IF EXISTS t17_log()",
    "DROP TABLE IF EXISTS t17_inserted",
]
_MY_SETUP = [
    "CREATE TABLE t17_inserted (job_id BIGINT PRIMARY KEY, at DATETIME(6) NOT NULL)",
    "CREATE TRIGGER t17 AFTER INSERT ON scheduler_jobs FOR EACH ROW"
    " INSERT INTO t17_inserted VALUES (NEW.id, UTC_TIMESTAMP(6))",
]
_MY_TEARDOWN = ["DROP TRIGGER IF EXISTS t17", "DROP TABLE IF EXISTS t17_inserted"]


@contextmanager
def record_inserts(url: str) -> Iterator[dict[str, Any]]:
    """Within: a trigger records each job's insert time on the server's clock. The dict it
    yields gets ``read()``: {job_id: aware UTC time}."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    pg = engine.dialect.name == "postgresql"
    setup, teardown = (_PG_SETUP, _PG_TEARDOWN) if pg else (_MY_SETUP, _MY_TEARDOWN)

    def run(statements: list[str]) -> None:
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(text(statement))

    def read() -> dict[int, datetime]:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT job_id, at FROM t17_inserted")).all()
        return {
            int(job_id): at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
            for job_id, at in found
        }

    run(teardown)
    run(setup)
    try:
        yield {"read": read, "engine": engine}
    finally:
        run(teardown)
        engine.dispose()


def server_now(url: str) -> datetime:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            pg = engine.dialect.name == "postgresql"
            value = conn.execute(
                text("SELECT clock_timestamp()" if pg else "SELECT UTC_TIMESTAMP(6)")
            ).scalar_one()
    finally:
        engine.dispose()
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def start_worker(
    url: str,
    out: Path,
    worker_id: str,
    seconds: float,
    *,
    shift: str | None = None,
    clock: str = "-",
    tick: float = 0.25,
) -> subprocess.Popen[str]:
    """A worker process (``clock_worker.py``); `shift`: its host's wall clock moved by faketime
    (``"+5m"``, ``"-5m"``)."""
    command = [sys.executable, str(WORKER), url, str(out), worker_id, str(seconds), clock]
    command.append(str(tick))
    if shift is not None:
        faketime = shutil.which("faketime")
        assert faketime is not None, "faketime is not installed (apt-get install faketime)"
        command = [faketime, "-f", shift, *command]
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent)}
    env.pop("SCHEDULER_CLOCK", None)
    # The host's wall clock moves; its steady counters do not (as with a drifting NTP): with
    # them faked too, thread waits computed on them by libc go wrong under faketime.
    env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["stderr"] = err
    return result


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
