"""Writing in the caller's transaction (``connection=``) on SQLite, PostgreSQL and MariaDB.

For each way in (a SQLAlchemy ``Connection``, an ORM ``Session``) and each write (enqueue,
enqueue_many, trigger, enable, disable, retry_job, cancel_job): a rollback leaves nothing (no
job, no row of the caller's own, no audit entry) and a commit leaves everything. A connection
that is not in a transaction, in autocommit, or on another database is refused before anything
is written. Dedupe keys are raced from two real connections whose transactions are open at
once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import MYSQL_SERVER, PG_SERVER, SERVERS
from helpers.orders import app_metadata, orders
from sqlalchemy import (
    Engine,
    create_engine,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.orm import Session

from scheduler import PayloadError, PermanentError, Scheduler, SchedulerError, TaskSpec, signals
from scheduler._model.handlers import Registry
from scheduler._store import bulk
from scheduler._store.tables import audit, jobs
from scheduler.testing import ManualClock

T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)
DAILY = TaskSpec("nightly", "0 3 * * *", "works", {"v": 1}, "UTC")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def sched(db_url: str, clock: ManualClock) -> Iterator[Scheduler]:
    app = Scheduler(db_url, registry=Registry(), clock=clock)

    @app.handler("works")
    def works(job: object) -> None:
        return None

    @app.handler("fails", max_attempts=1)
    def fails(job: object) -> None:
        raise PermanentError("bad_input")

    yield app
    app.close()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """The application's own engine on the scheduler's database: a plain ``create_engine``."""
    made = create_engine(db_url)
    app_metadata.create_all(made)
    with made.begin() as conn:
        conn.execute(delete(orders))
    yield made
    made.dispose()


def count(app: Scheduler, table: Any) -> int:
    with app.store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


# The two ways in: each yields something to pass as connection=, in an open transaction,
# and a function that ends that transaction (commit or rollback).
Way = Callable[[Engine], Any]


_opened: list[Any] = []


@pytest.fixture(autouse=True)
def _close_what_a_test_left_open() -> Iterator[None]:
    """A failed test must not leave a transaction holding locks for the next one."""
    yield
    while _opened:
        _opened.pop().close()


def _connection(made: Engine) -> Any:
    conn = made.connect()
    _opened.append(conn)
    conn.begin()
    return conn, conn


def _session(made: Engine) -> Any:
    session = Session(made)
    _opened.append(session)
    session.begin()
    return session, session.connection()


WAYS = {"connection": _connection, "session": _session}


def end(given: Any, commit: bool) -> None:
    if commit:
        given.commit()
    else:
        given.rollback()
    given.close()


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_the_job_and_the_callers_row_exist_iff_the_caller_commits(
    sched: Scheduler, engine: Engine, way: str, commit: bool
) -> None:
    given, conn = WAYS[way](engine)
    conn.execute(insert(orders).values(item="book"))
    job_id = sched.enqueue("works", {"order": 1}, connection=given)
    many = sched.enqueue_many([{"handler": "works"}, {"handler": "works"}], connection=given)
    with sched.store.read() as ours:  # another connection sees nothing before the commit
        assert ours.execute(select(func.count()).select_from(jobs)).scalar_one() == 0
    end(given, commit)
    assert count(sched, orders) == (1 if commit else 0)
    assert count(sched, jobs) == (3 if commit else 0)
    found = sched.get_job(job_id)
    assert (found is not None) is commit
    if commit:
        assert found is not None and found.state == "queued" and found.payload == {"order": 1}
        assert [j.id for j in sched.jobs(limit=10)] == sorted([job_id, *many], reverse=True)
        assert sched.work() == 3


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_row_writes_and_their_audit_entries_follow_the_callers_transaction(
    sched: Scheduler, engine: Engine, way: str, commit: bool
) -> None:
    sched.sync([DAILY])
    sched.disable("nightly")  # one audit entry of our own, committed
    before = count(sched, audit)
    given, _conn = WAYS[way](engine)
    assert sched.enable("nightly", reason="back", connection=given) is True
    sched.trigger("nightly", connection=given)
    sched.disable("nightly", reason="again", connection=given)
    end(given, commit)
    row = sched.get_row("nightly")
    assert row is not None
    assert row.enabled is False
    assert row.disabled_note == ("again" if commit else None)
    actions = [e.action for e in sched.audit("nightly")][: count(sched, audit) - before]
    assert actions == (["disable", "trigger", "enable"] if commit else [])


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_retry_and_cancel_follow_the_callers_transaction(
    sched: Scheduler, engine: Engine, way: str, commit: bool
) -> None:
    dead = sched.enqueue("fails")
    sched.work()
    waiting = sched.enqueue("works", run_at=T0 + timedelta(hours=1))
    given, _conn = WAYS[way](engine)
    assert sched.retry_job(dead, connection=given).state == "queued"
    assert sched.cancel_job(waiting, reason="no", connection=given).state == "aborted"
    end(given, commit)
    states = [sched.get_job(dead).state, sched.get_job(waiting).state]  # type: ignore[union-attr]
    assert states == (["queued", "aborted"] if commit else ["aborted", "queued"])
    assert [e.action for e in sched.audit()] == (["cancel", "retry"] if commit else [])


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_enables_slot_skipped_signals_wait_for_the_callers_commit(
    sched: Scheduler, engine: Engine, clock: ManualClock, way: str, commit: bool
) -> None:
    sched.sync([DAILY])
    sched.disable("nightly")
    clock.advance(timedelta(days=2))  # two 03:00 slots pass while disabled
    sent: list[Any] = []

    def receiver(sender: str, **kw: Any) -> None:
        sent.append((sender, kw["decision"]))

    signals.slot_skipped.connect(receiver, weak=False)
    try:
        given, _conn = WAYS[way](engine)
        sched.enable("nightly", connection=given)
        assert sent == []  # not before the commit
        end(given, commit)
    finally:
        signals.slot_skipped.disconnect(receiver)
    assert sent == ([("nightly", "paused")] * 2 if commit else [])


# -- refusals ----------------------------------------------------------------------------
def test_a_connection_not_in_a_transaction_is_refused(sched: Scheduler, engine: Engine) -> None:
    with engine.connect() as conn:
        with pytest.raises(SchedulerError, match="not in a transaction"):
            sched.enqueue("works", connection=conn)
        with pytest.raises(SchedulerError, match="not in a transaction"):
            sched.enqueue_many([{"handler": "works"}], connection=conn)
    with Session(engine) as session, pytest.raises(SchedulerError, match="not in a transaction"):
        sched.trigger("nightly", connection=session)
    assert count(sched, jobs) == 0


def test_an_autocommit_connection_is_refused(sched: Scheduler, db_url: str) -> None:
    auto = create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with auto.connect() as conn:
            conn.begin()
            with pytest.raises(SchedulerError, match="autocommit"):
                sched.enqueue("works", connection=conn)
            with pytest.raises(SchedulerError, match="autocommit"):
                sched.enqueue_many([{"handler": "works"}], connection=conn)
    finally:
        auto.dispose()
    assert count(sched, jobs) == 0


def test_something_else_than_a_connection_is_refused(sched: Scheduler, engine: Engine) -> None:
    with pytest.raises(SchedulerError, match="expected a SQLAlchemy Connection or Session"):
        sched.enqueue("works", connection=engine)
    raw = engine.raw_connection()
    try:
        with pytest.raises(SchedulerError, match="got "):
            sched.enqueue("works", connection=raw)
    finally:
        raw.close()


def _elsewhere(db_url: str, tmp_path: Path) -> list[str]:
    """URLs of other databases (or the same server showing other tables): refused, all."""
    if db_url.startswith("sqlite"):
        other = tmp_path / "other.db"
        Scheduler(f"sqlite:///{other}", registry=Registry()).migrate()  # the same tables
        return [f"sqlite:///{other}"]
    if db_url.startswith("postgresql"):
        base = PG_SERVER.rsplit("/", 1)[0]
        # the server's maintenance database; the same database, scheduler tables out of sight
        return [f"{base}/postgres", f"{PG_SERVER}?options=-csearch_path%3Dpg_catalog"]
    return [MYSQL_SERVER]  # the server's `test` database, not this session's


def test_a_connection_to_another_database_is_refused(
    sched: Scheduler, db_url: str, tmp_path: Path
) -> None:
    for url in _elsewhere(db_url, tmp_path):
        other = create_engine(url)
        try:
            with other.connect() as conn:
                conn.begin()
                with pytest.raises(SchedulerError, match="on another database"):
                    sched.enqueue("works", connection=conn)
                with pytest.raises(SchedulerError, match="on another database"):
                    sched.enqueue_many([{"handler": "works"}], connection=conn)
                with pytest.raises(SchedulerError, match="on another database"):
                    sched.trigger("nightly", connection=conn)
                conn.rollback()
        finally:
            other.dispose()
    assert count(sched, jobs) == 0


@pytest.mark.parametrize("db_url", SERVERS, indirect=True)
def test_another_dialect_is_refused(sched: Scheduler, db_url: str, tmp_path: Path) -> None:
    """(SQLite's own case, another file, is the test above.)"""
    other = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with other.connect() as conn:
            conn.begin()
            with pytest.raises(SchedulerError, match="sqlite connection"):
                sched.enqueue("works", connection=conn)
    finally:
        other.dispose()


def test_the_schedulers_own_engine_is_accepted(sched: Scheduler) -> None:
    with sched.store.begin() as conn:
        job = sched.enqueue("works", connection=conn)
    assert sched.get_job(job) is not None


# -- dedupe keys in open transactions -----------------------------------------------------
@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_a_dedupe_key_inserted_by_an_open_transaction_makes_the_second_wait(
    sched: Scheduler, engine: Engine, db_url: str, first_commits: bool
) -> None:
    """Two callers' transactions insert the same key: the second waits on the unique index (on
    SQLite: for the write lock) until the first ends; then it gets the first's job if that
    committed, else its own."""
    first = engine.connect()
    first.begin()
    first_id = sched.enqueue("works", {"who": 1}, dedupe_key="k", connection=first)
    if db_url.startswith("sqlite"):  # a second writer waits for the first's write lock
        first.execute(insert(orders).values(item="lock"))
    out: dict[str, Any] = {}

    def second() -> None:
        with engine.connect() as conn:
            conn.begin()
            out["started"] = time.monotonic()
            out["id"] = sched.enqueue("works", {"who": 2}, dedupe_key="k", connection=conn)
            out["returned"] = time.monotonic()
            conn.commit()

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.5)
    assert "returned" not in out  # waiting for the first transaction
    ended = time.monotonic()
    end(first, first_commits)
    thread.join(30)
    assert not thread.is_alive()
    assert out["returned"] >= ended
    if first_commits:
        assert out["id"] == first_id
        assert count(sched, jobs) == 1
    else:  # (SQLite may give it the rolled-back job's id again)
        found = sched.get_job(out["id"])
        assert found is not None and found.payload == {"who": 2}


def test_enqueue_many_in_open_transactions_shares_keys(sched: Scheduler, engine: Engine) -> None:
    with engine.begin() as conn:
        held = sched.enqueue("works", dedupe_key="a", connection=conn)
        ids = sched.enqueue_many(
            [
                {"handler": "works", "dedupe_key": "a"},
                {"handler": "works", "dedupe_key": "b"},
                {"handler": "works"},
                {"handler": "works", "dedupe_key": "b", "payload": {"second": True}},
            ],
            connection=conn,
        )
    assert ids[0] == held and ids[1] == ids[3] and len(set(ids)) == 3
    assert sched.get_job(ids[1]).payload == {}  # type: ignore[union-attr]


# -- enqueue_many ---------------------------------------------------------------------------
def test_enqueue_many_returns_ids_in_the_items_order_with_their_options(sched: Scheduler) -> None:
    later = T0 + timedelta(minutes=5)
    items: list[dict[str, Any]] = [
        {"handler": "works", "payload": {"n": n}, "priority": n % 3, "queue": f"q{n % 2}"}
        for n in range(50)
    ]
    items[7].update(run_at=later, max_attempts=9, tenant="acme", dedupe_key="seven")
    ids = sched.enqueue_many(items)
    assert len(ids) == 50 and len(set(ids)) == 50
    for n, job_id in enumerate(ids):
        job = sched.get_job(job_id)
        assert job is not None
        assert (job.payload, job.priority, job.queue) == ({"n": n}, n % 3, f"q{n % 2}")
    seven = sched.get_job(ids[7])
    assert seven is not None
    assert (seven.run_at, seven.max_attempts, seven.tenant, seven.dedupe_key) == (
        later,
        9,
        "acme",
        "seven",
    )
    assert sched.enqueue_many([]) == []


def test_enqueue_many_in_several_chunks(sched: Scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "PG_CHUNK", 7)
    monkeypatch.setattr(bulk, "VALUES_CHUNK", 7)
    items = [{"handler": "works", "payload": {"n": n}} for n in range(30)]
    items += [{"handler": "works", "dedupe_key": f"k{n % 12}"} for n in range(24)]
    ids = sched.enqueue_many(items)
    payloads = [sched.get_job(i).payload for i in ids[:30]]  # type: ignore[union-attr]
    assert payloads == [{"n": n} for n in range(30)]
    assert ids[30:42] == ids[42:54] and len(set(ids)) == 42
    assert count(sched, jobs) == 42


def test_enqueue_many_gives_an_active_jobs_id_for_its_key_and_a_finished_one_none(
    sched: Scheduler,
) -> None:
    active = sched.enqueue("works", dedupe_key="k")
    assert sched.enqueue_many([{"handler": "works", "dedupe_key": "k"}]) == [active]
    sched.work()  # done: the key is free again
    (fresh,) = sched.enqueue_many([{"handler": "works", "dedupe_key": "k"}])
    assert fresh != active


@pytest.mark.parametrize(
    ("bad", "error", "words"),
    [
        ({"payload": {"n": 1}}, TypeError, "'handler' is required"),
        ({"handler": "works", "colour": "red"}, TypeError, "unknown key(s) colour"),
        ({"handler": "works", "payload": {"password": "x"}}, PayloadError, "password"),
        ({"handler": "works", "max_attempts": 0}, ValueError, "max_attempts must be at least 1"),
        ({"handler": "works", "priority": 2**40}, ValueError, "priority"),
        ({"handler": "works", "tenant": "no spaces"}, ValueError, "tenant"),
        ({"handler": "works", "run_at": "tomorrow"}, TypeError, "run_at"),
        ({"handler": "works", "run_at": datetime(2030, 1, 1)}, ValueError, "naive"),
        ({"handler": "works", "queue": "q" * 101}, ValueError, "queue is 101 characters"),
        ({"handler": 7}, TypeError, "handler"),
        ("works", TypeError, "expected a mapping"),
    ],
)
def test_a_bad_item_is_named_and_nothing_is_written(
    sched: Scheduler, bad: Any, error: type[Exception], words: str
) -> None:
    items = [{"handler": "works"}, {"handler": "works"}, bad, {"handler": "works"}]
    with pytest.raises(error) as caught:
        sched.enqueue_many(items)
    assert str(caught.value).startswith("enqueue_many: item 2: ")
    assert words in str(caught.value)
    assert count(sched, jobs) == 0


def test_enqueue_many_is_all_or_nothing_when_the_database_refuses_a_later_chunk(
    sched: Scheduler, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row of the third chunk is refused by the server (a trigger of the test's): the chunks
    already inserted are rolled back with it."""
    monkeypatch.setattr(bulk, "PG_CHUNK", 3)
    monkeypatch.setattr(bulk, "VALUES_CHUNK", 3)
    with sched.store.begin() as conn:
        if db_url.startswith("sqlite"):
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON scheduler_jobs"
                " WHEN NEW.handler = 'refused' BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        elif db_url.startswith("postgresql"):
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " IF NEW.handler = 'refused' THEN RAISE EXCEPTION 'refused'; END IF;"
                " RETURN NEW; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON scheduler_jobs"
                " FOR EACH ROW EXECUTE FUNCTION refuse()"
            )
        else:
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON scheduler_jobs FOR EACH ROW"
                " IF NEW.handler = 'refused' THEN"
                " SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused'; END IF"
            )
    try:
        items = [{"handler": "works"} for _ in range(7)] + [{"handler": "refused"}]
        with pytest.raises(Exception, match="refused"):
            sched.enqueue_many(items)
        assert count(sched, jobs) == 0
    finally:
        with sched.store.begin() as conn:
            if db_url.startswith("postgresql"):
                conn.exec_driver_sql("DROP TRIGGER refuse ON scheduler_jobs")
                conn.exec_driver_sql("DROP FUNCTION refuse()")
            else:
                conn.exec_driver_sql("DROP TRIGGER refuse")


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)
def test_mysqls_path_without_returning(sched: Scheduler, db_url: str) -> None:
    """MySQL has no INSERT ... RETURNING: the ids of a multi-row INSERT from LAST_INSERT_ID()
    (consecutive under innodb_autoinc_lock_mode 0 and 1), keys one by one. Run on MariaDB with
    its RETURNING turned off for this connection's dialect."""
    made = create_engine(db_url)
    try:
        with made.begin() as conn:
            held = sched.enqueue("works", dedupe_key="held", connection=conn)
            conn.dialect.insert_returning = False
            items = [{"handler": "works", "payload": {"n": n}} for n in range(20)]
            items += [{"handler": "works", "dedupe_key": key} for key in ("held", "x", "x")]
            ids = sched.enqueue_many(items, connection=conn)
    finally:
        made.dispose()
    payloads = [sched.get_job(i).payload for i in ids[:20]]  # type: ignore[union-attr]
    assert payloads == [{"n": n} for n in range(20)]
    assert ids[20] == held and ids[21] == ids[22] and ids[21] not in ids[:21]


# -- a crash between the caller's write and its commit ---------------------------------------
CRASH_SCRIPT = """
import sys, time
from sqlalchemy import create_engine, insert, text
from scheduler import Scheduler
from scheduler._model.handlers import Registry
sys.path.insert(0, {tests!r})
from helpers.orders import orders
url = sys.argv[1]
app = Scheduler(url, registry=Registry())
with create_engine(url).connect() as conn:
    conn.begin()
    conn.execute(insert(orders).values(item="lost"))
    job = app.enqueue("works", {{"order": "lost"}}, connection=conn)
    many = app.enqueue_many([{{"handler": "works"}}] * 3, connection=conn)
    print("written", job, *many, flush=True)
    time.sleep(120)  # killed here, before the commit
    conn.commit()
"""


@pytest.mark.slow
def test_a_caller_killed_before_its_commit_leaves_no_job_and_no_row(
    sched: Scheduler, engine: Engine, db_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "caller.py"
    script.write_text(CRASH_SCRIPT.format(tests=str(Path(__file__).resolve().parents[1])))
    proc = subprocess.Popen(
        [sys.executable, str(script), db_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("written"), proc.stderr.read() if proc.stderr else line
        ids = [int(word) for word in line.split()[1:]]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)  # and closes the pipes
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while True:  # the server notices the closed socket and rolls the transaction back
        try:
            job = sched.enqueue("works", {"after": "crash"})  # the write lock is free again
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert count(sched, orders) == 0
    assert [j.id for j in sched.jobs()] == [job]
    assert all(sched.get_job(i) is None or i == job for i in ids)
