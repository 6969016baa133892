"""``scheduler.contrib.django`` in a real Django project (``tests/helpers/djangoproject``), run as
users run theirs: ``manage.py`` in a subprocess, and ``runserver`` driven over HTTP.

- ``manage.py scheduler COMMAND`` runs the scheduler's commands with ``settings.SCHEDULER``;
- an enqueue (and enqueue_many, and a trigger) inside ``transaction.atomic()``, without
  ``connection=``, exists if and only if the atomic block commits, beside the order it is for;
- the worker started by ``manage.py scheduler worker`` runs the job with the project's models.

On SQLite, PostgreSQL and MariaDB (Django's MySQL backend, on PyMySQL).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import make_url
from helpers.redis_server import RedisServer
from helpers.redis_server import redis_server as redis_server  # the fixture
from sqlalchemy import create_engine, text

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store import wakeup as _wakeup

pytest.importorskip("django")

pytestmark = pytest.mark.slow
PROJECT = Path(__file__).resolve().parents[1] / "helpers" / "djangoproject"
DJANGO_TABLES = ("shop_order", "django_content_type", "django_migrations")


def manage(
    url: str, *args: str, ok: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {}), "SCHEDULER_TEST_DJANGO_URL": url}
    for name in ("SCHEDULER_CONFIG", "SCHEDULER_DATABASE_URL", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if ok:
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def sql(url: str, statement: str) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement))
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


_migrated: dict[str, str] = {}  # backend -> a SQLite file, or the server's URL, with both schemas


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def django_url(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    sqlite_template: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """The test's database with the project's own tables (Django's ``migrate``, once per
    backend and test process) beside the scheduler's (migrated and emptied by conftest)."""
    backend = request.param
    if backend == "sqlite":
        if backend not in _migrated:
            template = tmp_path_factory.mktemp("django") / "template.db"
            shutil.copy(sqlite_template, template)
            manage(f"sqlite:///{template}", "migrate", "--verbosity", "0")
            _migrated[backend] = str(template)
        path = tmp_path / "django.db"
        shutil.copy(_migrated[backend], path)
        return f"sqlite:///{path}"
    return with_django_tables(backend, make_url(backend, tmp_path, sqlite_template))


def with_django_tables(backend: str, url: str) -> str:
    """``url`` (a server's, emptied by conftest) with the project's tables, empty."""
    if backend not in _migrated:
        for table in DJANGO_TABLES:  # left by an earlier run in this schema
            sql(url, f"DROP TABLE IF EXISTS {table}")
        manage(url, "migrate", "--verbosity", "0")
        _migrated[backend] = url
    else:
        sql(url, "DELETE FROM shop_order")
    return url


@pytest.fixture
def sched(django_url: str) -> Iterator[Scheduler]:
    app = Scheduler(django_url, registry=Registry())
    yield app
    app.close()


# The command line and the server do not depend on the engine: SQLite and PostgreSQL.
TWO_ENGINES = pytest.mark.parametrize("django_url", ["sqlite", "postgresql"], indirect=True)


@TWO_ENGINES
def test_manage_py_scheduler_runs_the_scheduler_commands(django_url: str, sched: Scheduler) -> None:
    assert "schema at revision" in manage(django_url, "scheduler", "migrate").stdout
    synced = manage(django_url, "scheduler", "sync").stdout
    assert "insert:    tidy" in synced
    manage(django_url, "scheduler", "trigger", "tidy", "--reason", "test")
    manage(django_url, "scheduler", "worker", "--once")  # ticks: dispatches tidy, runs it
    status = json.loads(manage(django_url, "scheduler", "status", "--json").stdout)
    assert [(r["name"], r["last_job_state"]) for r in status["rows"]] == [("tidy", "succeeded")]
    failed = manage(django_url, "scheduler", "enable", "nosuch", ok=False)
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines() == [
        "error: no task named 'nosuch' (run `scheduler sync`?)"
    ]
    assert [e.action for e in sched.audit()] == ["trigger", "sync"]


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_writes_inside_atomic_exist_iff_the_block_commits(
    django_url: str, sched: Scheduler, commit: bool
) -> None:
    manage(django_url, "scheduler", "sync")
    args = ["shop_order", "book", "--many", "3", "--trigger", "tidy"]
    done = manage(django_url, *args, *([] if commit else ["--fail"]), ok=commit)
    written = json.loads(done.stdout.strip().splitlines()[0])
    ids = [written["job"], *written["many"]]
    orders = sql(django_url, "SELECT id, item FROM shop_order")
    found = [sched.get_job(job_id) for job_id in ids]
    triggers = [e for e in sched.audit("tidy") if e.action == "trigger"]
    if commit:
        assert orders == [(written["order"], "book")]
        assert all(job is not None and job.state == "queued" for job in found)
        assert found[0] is not None and found[0].payload == {"order_id": written["order"]}
        assert [e.reason for e in triggers] == ["shop_order"]
        # The receipt runs in the project's worker, with its models.
        manage(django_url, "scheduler", "worker", "--once")
        assert sql(django_url, "SELECT receipt_sent FROM shop_order")[0][0] in (True, 1)
        assert sched.get_job(written["job"]).state == "succeeded"  # type: ignore[union-attr]
    else:
        assert done.returncode != 0 and "failing on purpose" in done.stderr
        assert orders == [] and found == [None] * 4 and triggers == []


@TWO_ENGINES
def test_runserver_places_orders_over_http(django_url: str, sched: Scheduler) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SCHEDULER_TEST_DJANGO_URL": django_url}
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx2.get(f"{base}/orders/0", timeout=5)
                break
            except httpx2.TransportError:
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                assert time.monotonic() < deadline, "runserver did not answer"
                time.sleep(0.2)
        placed = httpx2.post(f"{base}/orders", json={"item": "book"}, timeout=10)
        assert placed.status_code == 201, placed.text
        job = sched.get_job(placed.json()["job_id"])
        assert job is not None and job.payload == {"order_id": placed.json()["order_id"]}
        failed = httpx2.post(f"{base}/orders", json={"item": "pen", "fail": True}, timeout=10)
        assert failed.status_code == 500
        assert [r[0] for r in sql(django_url, "SELECT item FROM shop_order")] == ["book"]
        assert [j.id for j in sched.jobs()] == [job.id]
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_a_broker_hears_of_jobs_at_djangos_commit_and_never_of_a_rollback(
    tmp_path: Path, sqlite_template: Path, redis_server: RedisServer
) -> None:
    """MariaDB, which cannot NOTIFY, wakes the workers through the broker: the jobs written in
    an atomic block are announced when Django commits it (not when SQLAlchemy, which commits
    nothing of Django's, closes its connection), and a block that rolls back announces none."""
    url = with_django_tables("mariadb", make_url("mariadb", tmp_path, sqlite_template))
    env = {"SCHEDULER_BROKER_URL": redis_server.url}
    client = redis_server.client()
    key = _wakeup.token_key("scheduler", "default")
    try:
        manage(url, "scheduler", "sync", env=env)
        manage(url, "shop_order", "pen", "--many", "2", "--fail", ok=False, env=env)
        time.sleep(0.5)
        assert client.llen(key) == 0
        manage(url, "shop_order", "book", "--many", "3", env=env)
        # One token per ready job: the receipt and the three more.
        deadline = time.monotonic() + 10
        while client.llen(key) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.llen(key) == 4
    finally:
        client.close()
