"""``scheduler migrate --reshard`` as an operator runs it: a database of one shard grown to 4
after ``[database] shards`` changed (every command refused until then, naming the command),
a second run that has nothing to do, a running worker refused, and SQLite refused. Real
subprocesses on a real PostgreSQL (directly and through PgBouncer)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from helpers.cli_project import COMMAND, clean_env, ok, one_error_line, run
from sqlalchemy import create_engine, text

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
    ok(run(tmp_path, "migrate"))
    ok(run(tmp_path, "sync"))
    for n in range(8):
        ok(run(tmp_path, "trigger", f"nightly-{n}"))
    ok(run(tmp_path, "worker", "--once"))
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
