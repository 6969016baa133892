"""The database a command is pointed at, as a new user meets it: a relative SQLite path is
the config folder's, read-only commands never create the file, and a database that cannot
be used (no schema, no such database, a bad URL) is one line naming where it came from.

Real subprocesses on real SQLite files, and the PostgreSQL server where it matters.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.cli_project import COMMAND, clean_env, ok, one_error_line, project, run
from helpers.cli_project import migrated as migrated  # the fixture

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store import migrate as _migrate


def test_relative_sqlite_path_is_the_config_folders(tmp_path: Path) -> None:
    """`scheduler -c tutorial/app.toml ...` from the parent folder uses tutorial/tutorial.db,
    and imports the handler modules that sit next to the file."""
    project(tmp_path / "tutorial", "sqlite:///tutorial.db")
    ok(run(tmp_path, "-c", "tutorial/app.toml", "migrate"))
    assert (tmp_path / "tutorial" / "tutorial.db").is_file()
    assert not (tmp_path / "tutorial.db").exists()
    ok(run(tmp_path, "-c", "tutorial/app.toml", "sync"))
    ok(run(tmp_path, "-c", "tutorial/app.toml", "trigger", "every-second"))
    worker = run(tmp_path, "-c", "tutorial/app.toml", "worker", "--once")
    assert worker.returncode == 0, worker.stderr  # first_jobs.py sits next to app.toml
    assert "(t.ok) succeeded" in worker.stderr


def test_config_relative_url_in_load_config_and_env_url_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler import load_config

    path = project(tmp_path / "proj", "sqlite:///data/app.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    config = load_config("proj/app.toml")
    assert config.database_url == f"sqlite:///{tmp_path / 'proj' / 'data' / 'app.db'}"
    assert config.database_source == "[database] url in proj/app.toml"
    for same in ("sqlite:////abs/x.db", "sqlite://", "sqlite:///:memory:"):
        path.write_text(f'[database]\nurl = "{same}"\n')
        assert load_config(path).database_url == same
    # The environment's URL is the shell's: relative to the working directory, as given.
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", "sqlite:///here.db")
    config = load_config(path)
    assert (config.database_url, config.database_source) == (
        "sqlite:///here.db",
        "SCHEDULER_DATABASE_URL",
    )


def test_read_only_commands_never_create_the_database(tmp_path: Path) -> None:
    project(tmp_path / "proj", "sqlite:///missing.db")
    db = tmp_path / "proj" / "missing.db"
    commands = [
        ["status"],
        ["status", "--json"],
        ["sync", "--dry-run"],
        ["sync"],
        ["tick"],
        ["enable", "every-second"],
        ["disable", "every-second"],
        ["trigger", "every-second"],
        ["worker", "--once"],
    ]
    procs = [
        subprocess.Popen(
            [*COMMAND, "-c", "proj/app.toml", *args],
            cwd=tmp_path,
            env=clean_env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for args in commands
    ]
    for args, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        line = one_error_line(subprocess.CompletedProcess(args, proc.returncode, out, err))
        assert line == (
            f"error: database {db} ([database] url in {tmp_path / 'proj' / 'app.toml'})"
            " does not exist: create it with `scheduler --config proj/app.toml migrate`"
        ), args
    assert not db.exists() and sorted(p.name for p in (tmp_path / "proj").iterdir()) == [
        "app.toml",
        "first_jobs.py",
    ]
    assert not (tmp_path / "missing.db").exists()


def test_schema_errors_name_the_database(tmp_path: Path) -> None:
    project(tmp_path, "sqlite:///empty.db")
    (tmp_path / "empty.db").touch()  # exists, but no tables
    line = one_error_line(run(tmp_path, "status"))  # ./app.toml: `scheduler migrate` is right
    assert line == (
        f"error: database {tmp_path / 'empty.db'} ([database] url in {tmp_path / 'app.toml'}):"
        f" schema is at revision none, this version needs {_migrate.head_revision()}:"
        " run `scheduler migrate`"
    )


def test_postgres_urls_without_a_driver_use_psycopg(pg_url: str, tmp_path: Path) -> None:
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    short = pg_url.replace("postgresql+psycopg://", "postgres://")
    for url in (plain, short):
        app = Scheduler(url, registry=Registry())  # "Can't load plugin" before
        try:
            assert app.status()["jobs"] == {"queued": 0, "claimed": 0, "succeeded": 0, "aborted": 0}
        finally:
            app.close()
    from scheduler._store.settings import normalize_database_url

    assert normalize_database_url(plain, "x") == normalize_database_url(short, "x") == pg_url
    assert normalize_database_url("mysql://root@h/db", "x") == "mysql+pymysql://root@h/db"
    assert normalize_database_url("mariadb://root@h/db", "x") == "mariadb+pymysql://root@h/db"
    # The CLI, from the file and from the environment.
    project(tmp_path, plain)
    assert json.loads(ok(run(tmp_path, "status", "--json")))["rows"] == []
    env = clean_env(SCHEDULER_DATABASE_URL=short)
    project(tmp_path, "sqlite:///unused.db")
    assert json.loads(ok(run(tmp_path, "status", "--json", env=env)))["rows"] == []
    assert not (tmp_path / "unused.db").exists()


def test_a_database_that_does_not_exist_says_so_and_how_to_create_it(
    direct_pg_url: str, tmp_path: Path
) -> None:
    pg_url = direct_pg_url  # the server's own answer (PgBouncer answers "no such database")
    server = pg_url.split("?")[0].rsplit("/", 1)[0]  # postgresql+psycopg://postgres@host:port
    missing = f"{server}/sched_no_such_database_11".replace("+psycopg", "")
    project(tmp_path, missing)
    env = clean_env(SCHEDULER_DATABASE_URL=missing.replace("postgresql:", "postgres:"))
    from_file, from_env = (run(tmp_path, "status"), run(tmp_path, "sync", env=env))
    shown = missing.replace("postgresql:", "postgresql+psycopg:")
    how = "create it with `createdb -h 127.0.0.1 -p 5432 -U postgres sched_no_such_database_11`"
    assert one_error_line(from_file) == (
        f"error: database {shown} ([database] url in {tmp_path / 'app.toml'}) does not exist"
        f" on the server: {how}, then run `scheduler migrate`"
    )
    assert one_error_line(from_env) == (
        f"error: database {shown} (SCHEDULER_DATABASE_URL) does not exist on the server:"
        f" {how}, then run `scheduler migrate`"
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgress://u@h/db", "unknown database kind 'postgress': expected sqlite:///FILE.db,"),
        ("not a url", "not a database URL: expected sqlite:///FILE.db,"),
        (
            "postgresql+pg8000://u@h/db",
            "the database driver is not installed (No module named 'pg8000'): install it, or"
            " write postgresql://… for psycopg (pip install 'rerun-scheduler[postgres]')",
        ),
    ],
)
def test_a_bad_database_url_is_one_line_naming_its_source(
    tmp_path: Path, url: str, says: str
) -> None:
    project(tmp_path, "sqlite:///unused.db")
    line = one_error_line(run(tmp_path, "status", env=clean_env(SCHEDULER_DATABASE_URL=url)))
    assert line.startswith(f"error: SCHEDULER_DATABASE_URL: {says}"), line
