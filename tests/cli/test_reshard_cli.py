"""``scheduler migrate --reshard`` as an operator runs it: a database of one shard grown to 4
after ``[database] shards`` changed (every command refused until then, naming the command),
a second run that has nothing to do, a running worker refused, and SQLite refused. The commands
as real subprocesses on a real PostgreSQL (directly and through PgBouncer); the rows they move
made through the library first (:func:`populate`: what ``migrate``, ``sync``, ``trigger`` and
``worker --once`` would write, without a Python start-up of a second or more for each)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from helpers.cli_project import COMMAND, clean_env, ok, one_error_line, run
from sqlalchemy import create_engine, text

from scheduler import Scheduler
from scheduler._model.handlers import Registry

JOBS = """
from scheduler import default_registry

@default_registry.handler("t.ok")
def ok(job):
    pass
"""

TASKS = "".join(
    f'[[tasks]]\nname = "nightly-{n}"\ncron = "0 3 * * *"\nhandler = "t.ok"\n'
    f'tenant = "tenant{n}"\n\n'
    for n in range(8)
)


def write(directory: Path, url: str, shards: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "first_jobs.py").write_text(JOBS)
    (directory / "app.toml").write_text(
        f'[database]\nurl = "{url}"\nshards = {shards}\n\n[worker]\nimports = ["first_jobs"]\n'
        f"\n{TASKS}"
    )


def populate(directory: Path, triggered: tuple[int, ...]) -> None:
    """Migrate the database of ``directory``'s config, sync its tasks, trigger those of
    `triggered` and run their jobs (one tick, one round of work)."""
    registry = Registry()
    registry.handler("t.ok")(lambda job: None)
    app = Scheduler.from_toml(directory / "app.toml", registry=registry)
    try:
        app.migrate()
        app.sync()
        for n in triggered:
            app.trigger(f"nightly-{n}")
        app.tick()
        assert app.work() == len(triggered)
    finally:
        app.close()


def present(url: str) -> int:
    """The workers with a presence row in shard 0 of 4."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM scheduler_shard_0.scheduler_workers"
                        " WHERE id NOT LIKE :tick"
                    ),
                    {"tick": "%:tick"},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def jobs(directory: Path) -> list[dict[str, object]]:
    found = json.loads(ok(run(directory, "jobs", "--json", "--limit", "100")))
    return list(found if isinstance(found, list) else found["jobs"])


def test_reshard_grows_a_database_and_a_second_run_has_nothing_to_do(
    tmp_path: Path, shards_url: str
) -> None:
    write(tmp_path, shards_url, 1)
    populate(tmp_path, tuple(range(8)))
    before = sorted((j["id"], j["state"]) for j in jobs(tmp_path))  # type: ignore[type-var]
    assert len(before) == 8 and {state for _, state in before} == {"succeeded"}

    write(tmp_path, shards_url, 4)
    for command in (["jobs"], ["migrate"]):
        line = one_error_line(run(tmp_path, *command))
        assert "scheduler migrate --reshard" in line, line
    out = ok(run(tmp_path, "migrate", "--reshard"))
    assert out.startswith("resharded from 1 shard (no shard schemas) to 4 shards:"), out
    assert "moved tasks 8 of 8, jobs 8 of 8, runs 8 of 8" in out, out
    assert "dropped the tables in public" in out, out
    assert sorted((j["id"], j["state"]) for j in jobs(tmp_path)) == before  # type: ignore[type-var]
    again = ok(run(tmp_path, "migrate", "--reshard"))
    assert "already has the layout of [database] shards = 4: nothing to move" in again

    # A worker running on the 4 shards: a reshard to 2 is refused, nothing moved.
    log = tmp_path / "worker.log"
    with log.open("w") as stderr:
        worker = subprocess.Popen(
            [*COMMAND, "worker"], cwd=tmp_path, env=clean_env(), stdout=stderr, stderr=stderr
        )
        try:
            deadline = time.monotonic() + 30
            while not present(shards_url) and time.monotonic() < deadline:
                time.sleep(0.3)
            assert present(shards_url), log.read_text()
            write(tmp_path, shards_url, 2)
            line = one_error_line(run(tmp_path, "migrate", "--reshard"))
            assert line.startswith("error: migrate --reshard: worker ") and "stop every" in line
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
    write(tmp_path, shards_url, 4)
    ok(run(tmp_path, "jobs"))  # nothing was moved: the 4 shards still fit
    write(tmp_path, shards_url, 2)
    assert "to 2 shards" in ok(run(tmp_path, "migrate", "--reshard"))
    assert sorted((j["id"], j["state"]) for j in jobs(tmp_path)) == before  # type: ignore[type-var]


def test_reshard_on_sqlite_is_one_error_line(tmp_path: Path) -> None:
    write(tmp_path, "sqlite:///app.db", 1)
    ok(run(tmp_path, "migrate"))
    line = one_error_line(run(tmp_path, "migrate", "--reshard"))
    assert "migrate --reshard: shards are schemas of one PostgreSQL database" in line


ROUTED = ("scheduler_rows", "scheduler_jobs", "scheduler_runs", "scheduler_decisions")


def every_row(url: str) -> Counter[tuple[str, int]]:
    """(table, id) of every row of the routed tables in every schema that holds them."""
    engine = create_engine(url)
    found: Counter[tuple[str, int]] = Counter()
    try:
        with engine.connect() as conn:
            schemas = conn.execute(
                text(
                    "SELECT DISTINCT schemaname FROM pg_tables"
                    " WHERE tablename = 'scheduler_alembic_version'"
                )
            ).scalars()
            for schema in list(schemas):
                for table in ROUTED:
                    ids = conn.execute(text(f"SELECT id FROM {schema}.{table}")).scalars()
                    found.update((table, int(i)) for i in ids)
    finally:
        engine.dispose()
    return found


def sleeping(url: str) -> int | None:
    """The backend sleeping in the trigger below, if any."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
            ).scalar()
    finally:
        engine.dispose()


def test_a_reshard_killed_halfway_loses_nothing_and_a_rerun_finishes(
    tmp_path: Path, shards_url: str
) -> None:
    """4 shards to 2: the command is killed (SIGKILL) while it moves shard 3's tasks (a
    trigger in the targets sleeps on their insert), after shards 0 to 2 were done; its
    transaction dies with it. Every row is there once; the database is refused until the
    rerun, which finishes."""
    write(tmp_path, shards_url, 4)
    populate(tmp_path, (1, 3, 4, 5))  # tenant1 and tenant3's tasks are in shard 3 of 4
    before = every_row(shards_url)
    assert before and max(before.values()) == 1
    engine = create_engine(shards_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE FUNCTION public.slow() RETURNS trigger LANGUAGE plpgsql AS $$"
                    " BEGIN IF (NEW.id - 1) % 4 = 3 THEN PERFORM pg_sleep(120); END IF;"
                    " RETURN NEW; END $$"
                )
            )
            for k in (0, 1):
                conn.execute(
                    text(
                        f"CREATE TRIGGER slow BEFORE INSERT ON scheduler_shard_{k}.scheduler_rows"
                        " FOR EACH ROW EXECUTE FUNCTION public.slow()"
                    )
                )
        write(tmp_path, shards_url, 2)
        killed = subprocess.Popen(
            [*COMMAND, "migrate", "--reshard"],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while (backend := sleeping(shards_url)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert backend is not None and killed.poll() is None
        killed.kill()
        killed.wait(timeout=10)
        with engine.begin() as conn:  # the server drops the dead client's transaction
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
        deadline = time.monotonic() + 10
        while sleeping(shards_url) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        halfway = every_row(shards_url)
        assert halfway == before  # each row once: in its old shard or its new one
        for shards in (2, 4):
            write(tmp_path, shards_url, shards)
            line = one_error_line(run(tmp_path, "jobs"))
            assert "did not finish: run it again" in line, line
        with engine.begin() as conn:
            for k in (0, 1):
                conn.execute(text(f"DROP TRIGGER slow ON scheduler_shard_{k}.scheduler_rows"))
    finally:
        engine.dispose()
    write(tmp_path, shards_url, 2)
    out = ok(run(tmp_path, "migrate", "--reshard"))
    assert "dropped scheduler_shard_3" in out and "scheduler_shard_2" not in out, out
    assert every_row(shards_url) == before
    assert len(jobs(tmp_path)) == 4
