"""A failover and a switchover under load, for real: a primary and a synchronous streaming standby
of the test's own (``reliability/_replication.py``), workers on a multi-host URL with
``target_session_attrs=read-write``; the short versions of ``reliability/failover.py``.

And, on the shared server: a connection whose server answers "read-only" is a lost one (the
connection and its pool are replaced), whatever path the statement took.

The clusters need PostgreSQL's own binaries (``initdb``, ``pg_ctl``, ``pg_basebackup``): without
them the tests skip with the reason; with ``CI=true`` they fail.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import IN_CI
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry
from scheduler._store.driver import read_only_server

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reliability"))

import _replication  # noqa: E402
import failover  # noqa: E402


def _pair() -> _replication.Pair:
    try:
        pair = _replication.Pair()
    except FileNotFoundError as exc:
        if IN_CI:
            pytest.fail(f"{exc}; CI requires them", pytrace=False)
        pytest.skip(str(exc))
    try:
        return pair.start()
    except BaseException:
        pair.stop()
        raise


@pytest.fixture
def pair() -> Iterator[_replication.Pair]:
    made = _pair()
    try:
        yield made
    finally:
        made.stop()


def must_be_zero(figures: list[Any], notes: list[str]) -> dict[str, Any]:
    failed = {f.name: f.value for f in figures if f.failed}
    assert failed == {}, (failed, notes)
    return {f.name: f.value for f in figures}


def _python_api_resumes(pair: _replication.Pair, switch: Any) -> float:
    """An application's Scheduler (one pooled connection busy at a time, the case that stayed
    stuck) enqueues again after the switch; seconds from the promotion to its first success."""
    app = Scheduler(pair.url(), registry=Registry())
    try:
        for _ in range(3):  # the pool holds connections to the old primary
            app.enqueue("h")
        promoted_at = switch()
        deadline = time.monotonic() + 15
        while True:
            try:
                app.enqueue("h")
                return time.time() - promoted_at
            except DBAPIError as exc:
                assert exc.connection_invalidated, exc  # a lost connection, not a job error
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        app.close()


@pytest.mark.slow
def test_a_switchover_under_load_the_workers_resume_on_the_new_primary(
    pair: _replication.Pair, tmp_path: Path
) -> None:
    figures, notes = failover.run(
        "switchover", before=4, after=10, rate=5, tasks=10, seed=25, out=tmp_path, pair=pair
    )
    values = must_be_zero(figures, notes)
    assert values["workers resumed, worst (s after promotion)"] < failover.RESUME_LIMIT
    assert values["jobs succeeded"] > 20 and values["task dispatches announced"] > 100


@pytest.mark.slow
def test_a_failover_under_load_the_workers_resume_on_the_new_primary(
    pair: _replication.Pair, tmp_path: Path
) -> None:
    figures, notes = failover.run(
        "failover", before=4, after=10, rate=5, tasks=10, seed=25, out=tmp_path, pair=pair
    )
    values = must_be_zero(figures, notes)
    assert values["workers resumed, worst (s after promotion)"] < failover.RESUME_LIMIT
    assert values["jobs succeeded"] > 20 and values["task dispatches announced"] > 100


@pytest.mark.slow
def test_after_a_switchover_the_python_api_goes_to_the_new_primary(
    pair: _replication.Pair,
) -> None:
    """The issue's stuck case: every pooled connection on a primary that turned read-only.
    Before the fix each call failed with SQLSTATE 25006 for as long as the process lived."""
    engine = create_engine(pair.url())  # the set-up: a new connection goes to the primary
    try:
        with engine.connect() as conn:
            port = conn.execute(text("SELECT inet_server_port()")).scalar_one()
    finally:
        engine.dispose()
    assert port == pair.primary.port and not pair.standby.is_primary()
    assert pair.primary.sql("SELECT sync_state FROM pg_stat_replication", "postgres") == "sync"
    app = Scheduler(pair.url(), registry=Registry())
    app.migrate()
    app.close()
    assert _python_api_resumes(pair, pair.switchover) < failover.RESUME_LIMIT
    assert pair.standby.is_primary() and pair.primary.is_primary()  # the old one: up, read-only
    assert pair.primary.sql("SHOW default_transaction_read_only", "postgres") == "on"


# -- on the shared server: "read-only" is a lost connection -------------------------------------
def _read_only_sessions(app: Scheduler, how_many: int) -> None:
    """Make `how_many` of the app's pooled connections read-only sessions (as a demoted primary
    answers), then return them to the pool."""
    statement = (
        "SET SESSION default_transaction_read_only = on"
        if app.store.caps.dialect == "postgresql"
        else "SET SESSION TRANSACTION READ ONLY"
    )
    conns = [app.store.engine.connect() for _ in range(how_many)]
    for conn in conns:
        conn.exec_driver_sql(statement)
        conn.commit()
    for conn in conns:
        conn.close()


@pytest.fixture(params=["postgresql", "mariadb"])
def direct_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """Not through PgBouncer: a session setting of ours must stay on our connection."""
    from conftest import make_url

    return make_url(request.param, tmp_path, sqlite_template)


def test_a_read_only_answer_replaces_the_connection_and_its_pool(direct_url: str) -> None:
    app = Scheduler(direct_url, registry=Registry())
    try:
        _read_only_sessions(app, 3)
        with pytest.raises(DBAPIError) as refused:
            app.enqueue("h")
        assert read_only_server(refused.value.orig)
        assert refused.value.connection_invalidated  # what the worker retries after a back-off
        # The whole pool was replaced: the next operations get fresh, writable connections
        # (not the two other read-only ones still pooled).
        assert [app.enqueue("h") for _ in range(5)]
    finally:
        app.close()


def test_the_ticks_own_statements_replace_a_read_only_pool_too(direct_url: str) -> None:
    """The tick's hot path runs on the driver's cursor (PostgreSQL: several connections at
    once), outside Connection.execute: a read-only answer there replaces the pool as well."""
    app = Scheduler(direct_url, registry=Registry())

    @app.handler("h", retry_safe=True)
    def h(job: Any) -> None:
        pass

    try:
        app.sync([TaskSpec(f"t{n:02}", "* * * * * *", "h", {}, "UTC") for n in range(20)])
        time.sleep(1.1)
        _read_only_sessions(app, 5)
        with pytest.raises(DBAPIError) as refused:
            app.tick()
        assert refused.value.connection_invalidated
        time.sleep(1.0)
        assert len(app.tick().dispatched) == 20  # every row: no read-only connection left
    finally:
        app.close()


def test_an_outcome_refused_read_only_is_written_again_on_a_new_connection(
    direct_url: str,
) -> None:
    """A job whose run ends just after a switchover: its outcome's write meets a server that
    answers read-only. The handler's work is done, so the write is made again on a fresh
    connection while the lease holds (as after a cut connection), rather than leaving the job
    claimed until its lease expires and a takeover runs it again or aborts it."""
    app = Scheduler(direct_url, registry=Registry())
    ran: list[int] = []

    @app.handler("h")
    def h(job: Any) -> None:
        ran.append(job.id)
        _read_only_sessions(app, 5)  # the pooled connections now talk to a "demoted primary"

    try:
        job_id = app.enqueue("h")
        assert app.work() == 1
        job = app.get_job(job_id)
        assert job is not None and job.state == "succeeded"
        assert ran == [job_id]
    finally:
        app.close()


def test_read_only_and_recovery_errors_are_recognised() -> None:
    import psycopg
    from psycopg import errors

    assert read_only_server(errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only"))
    assert read_only_server(errors.ObjectNotInPrerequisiteState("recovery is in progress"))
    assert read_only_server(
        errors.SerializationFailure("canceling statement due to conflict with recovery")
    )
    assert not read_only_server(errors.SerializationFailure("could not serialize access"))
    assert not read_only_server(errors.UniqueViolation("duplicate key"))
    assert not read_only_server(psycopg.OperationalError("server closed the connection"))

    import pymysql

    assert read_only_server(pymysql.err.OperationalError(1290, "running with --read-only"))
    assert read_only_server(pymysql.err.InternalError(1792, "read-only transaction"))
    assert not read_only_server(pymysql.err.OperationalError(1205, "lock wait timeout"))
