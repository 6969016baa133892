"""TOML configuration: the example file, defaults, and one clear line per mistake."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from scheduler import Scheduler
from scheduler._config import (
    AppConfig,
    DatabaseSettings,
    SchedulerSettings,
    WorkerSettings,
    load_config,
    parse_config,
)
from scheduler._errors import ConfigError
from scheduler._model.rows import TaskSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "app.example.toml"
TASK = '[[tasks]]\nname = "x"\ncron = "0 3 * * *"\nhandler = "h"\n'


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "app.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def config_error(path: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message, message
    assert message.startswith(f"{path}: "), message
    return message


def test_example_file_parses() -> None:
    config = load_config(EXAMPLE)
    assert config.path == str(EXAMPLE)
    assert config.database_url == f"sqlite:///{EXAMPLE.parent / 'scheduler.db'}"  # its folder's
    assert config.scheduler == SchedulerSettings(max_consecutive_failures=5, tick_interval=1.0)
    assert config.worker == WorkerSettings(imports=("scheduler.examples.jobs",), concurrency=2)
    assert [t.name for t in config.tasks] == ["heartbeat", "flaky-sync", "nightly-report"]
    heartbeat, flaky, nightly = config.tasks
    assert heartbeat == TaskSpec("heartbeat", "* * * * * */5", "examples.succeed", {}, "UTC")
    assert (flaky.handler, flaky.payload, flaky.max_consecutive_failures) == (
        "examples.fail",
        {"target": "demo"},
        3,
    )
    assert nightly == TaskSpec(
        name="nightly-report",
        cron="0 3 * * *",
        handler="examples.report",
        payload={"region": "eu"},
        timezone="Europe/Berlin",
        concurrent=False,
        max_consecutive_failures=3,
        enabled=True,
        overlap="hold",
        catchup_window=0,
        jitter=0,
        tenant="acme",
        timeout=1800.0,
    )
    # "Every key spelled out": each field of TaskSpec is a key of that task in the file.
    spelled = re.search(
        r'(?ms)^name = "nightly-report"\n(.*?)(?:\n\n|\Z)', text := EXAMPLE.read_text()
    )
    assert spelled is not None and text
    keys = {line.split(" = ")[0] for line in ("name = x\n" + spelled[1]).splitlines()}
    # ``group`` is the application's (put_tasks(group=...)); a task of the file has none.
    assert keys == {f.name for f in dataclasses.fields(TaskSpec)} - {"group"}


def test_example_commented_out_keys_show_the_defaults(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    uncommented = re.sub(r"(?m)^# ([a-z_]+ = )", r"\1", text)
    assert uncommented.count("\n") == text.count("\n") and uncommented != text
    path = write(tmp_path, uncommented)
    assert load_config(path) == dataclasses.replace(
        load_config(EXAMPLE),
        path=path,
        database_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
        database_source=f"[database] url in {path}",
    )


def test_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, TASK))
    assert config.database_url == f"sqlite:///{tmp_path / 'scheduler.db'}"  # the file's folder
    assert config.scheduler == SchedulerSettings()
    assert config.worker == WorkerSettings()
    assert WorkerSettings().queues == ("default",) and WorkerSettings().imports == ()
    assert config.tasks == (TaskSpec("x", "0 3 * * *", "h", {}, "UTC"),)
    task = config.tasks[0]
    assert (task.concurrent, task.max_consecutive_failures, task.enabled) == (False, None, True)


def test_task_timezone_defaults_to_scheduler_timezone(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[scheduler]\ntimezone = "Asia/Tokyo"\n' + TASK))
    assert config.tasks[0].timezone == "Asia/Tokyo"


def test_ints_accepted_as_floats_and_zero_means_unlimited(tmp_path: Path) -> None:
    text = "[scheduler]\ntick_interval = 2\nmax_consecutive_failures = 0\n"
    config = load_config(write(tmp_path, text + TASK + "max_consecutive_failures = 0\n"))
    assert config.scheduler.tick_interval == 2.0 and isinstance(
        config.scheduler.tick_interval, float
    )
    assert config.scheduler.max_consecutive_failures == 0
    assert config.tasks[0].max_consecutive_failures == 0


def test_empty_file_and_no_tasks(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""))
    assert config.tasks == () and config.scheduler == SchedulerSettings()


def test_env_overrides_database_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, '[database]\nurl = "sqlite:///from-file.db"\n')
    assert load_config(path).database_url == f"sqlite:///{tmp_path / 'from-file.db'}"
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/test")
    assert load_config(path).database_url == "postgresql+psycopg://postgres@127.0.0.1/test"
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", "")
    assert load_config(path).database_url == f"sqlite:///{tmp_path / 'from-file.db'}"


def test_parse_config_from_a_mapping() -> None:
    config = parse_config({"tasks": [{"name": "x", "cron": "@daily", "handler": "h"}]})
    assert isinstance(config, AppConfig) and config.path is None
    assert config.tasks[0].cron == "@daily"
    with pytest.raises(ConfigError, match=r"^<config>: task 'x': key 'cron': missing$"):
        parse_config({"tasks": [{"name": "x", "handler": "h"}]})


def test_specs_are_frozen() -> None:
    spec = TaskSpec("x", "0 3 * * *", "h", {}, "UTC")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "y"  # type: ignore[misc]


# (file text, the task or table named, the key named, another expected fragment)
INVALID = {
    "bad cron": (TASK.replace("0 3 * * *", "61 * * * *"), "task 'x'", "cron", "'61 * * * *'"),
    "cron not a string": (TASK.replace('"0 3 * * *"', "5"), "task 'x'", "cron", "integer"),
    "task timezone": (TASK + 'timezone = "Mars/Olympus"\n', "task 'x'", "timezone", "Mars"),
    "global timezone": (
        '[scheduler]\ntimezone = "Nowhere/City"\n',
        "[scheduler]",
        "timezone",
        "Nowhere",
    ),
    "unknown top-level key": ("colour = 1\n", "app.toml", "colour", "unknown key"),
    "unknown database key": ('[database]\nuri = "x"\n', "[database]", "uri", "'url'"),
    "unknown scheduler key": ("[scheduler]\ntick = 1\n", "[scheduler]", "tick", "unknown"),
    "unknown worker key": ("[worker]\nthreads = 2\n", "[worker]", "threads", "unknown"),
    "unknown task key": (TASK + 'crn = "x"\n', "task 'x'", "crn", "did you mean 'cron'"),
    "duplicate name": (TASK + TASK, "task 'x'", "name", "duplicate task name (also tasks[0])"),
    "number as string": (
        '[scheduler]\ntick_interval = "1"\n',
        "[scheduler]",
        "tick_interval",
        "expected a number, got string",
    ),
    "bool for int": (
        "[worker]\nconcurrency = true\n",
        "[worker]",
        "concurrency",
        "expected an integer, got boolean",
    ),
    "bool for task int": (
        TASK + "max_consecutive_failures = false\n",
        "task 'x'",
        "max_consecutive_failures",
        "got boolean",
    ),
    "float for int": ("[scheduler]\nbatch_size = 1.5\n", "[scheduler]", "batch_size", "float"),
    "string for bool": (TASK + 'concurrent = "no"\n', "task 'x'", "concurrent", "a boolean"),
    "payload not a table": (TASK + 'payload = "x"\n', "task 'x'", "payload", "a table"),
    "imports not a list": ('[worker]\nimports = "a.b"\n', "[worker]", "imports", "array"),
    "empty queue name": ('[worker]\nqueues = [""]\n', "[worker]", "queues[0]", "empty"),
    "no queues": ("[worker]\nqueues = []\n", "[worker]", "queues", "at least one"),
    "negative audit retention": (
        "[worker]\npurge_audit_after_days = -1\n",
        "[worker]",
        "purge_audit_after_days",
        "must be at least 0, got -1",
    ),
    "database not a table": ('database = "x"\n', "app.toml", "database", "expected a table"),
    "tasks not an array": ('tasks = "x"\n', "app.toml", "tasks", "array of tables"),
    "task not a table": ("tasks = [1]\n", "tasks[0]", "", "expected a table, got integer"),
    "credential nested": (
        TASK + 'payload = { auth = { password = "hunter2" } }\n',
        "task 'x'",
        "payload.auth.password",
        "credential",
    ),
    "credential in array": (
        TASK + 'payload = { items = [{ api_key = "k" }] }\n',
        "task 'x'",
        "payload.items[0].api_key",
        "credential",
    ),
    "missing name": (TASK.replace('name = "x"\n', ""), "tasks[0]", "name", "missing"),
    "missing cron": (TASK.replace('cron = "0 3 * * *"\n', ""), "task 'x'", "cron", "missing"),
    "missing handler": (TASK.replace('handler = "h"\n', ""), "task 'x'", "handler", "missing"),
    "empty handler": (TASK.replace('"h"', '"  "'), "task 'x'", "handler", "empty"),
    "name too long": (TASK.replace('"x"', f'"{"n" * 201}"'), "tasks[0]", "name", "200"),
    "name whitespace": (TASK.replace('"x"', '" x"'), "tasks[0]", "name", "whitespace"),
    "name control char": (TASK.replace('"x"', r'"a\u0007b"'), "tasks[0]", "name", "control"),
    "negative task limit": (
        TASK + "max_consecutive_failures = -1\n",
        "task 'x'",
        "max_consecutive_failures",
        "at least 0",
    ),
    "negative global limit": (
        "[scheduler]\nmax_consecutive_failures = -2\n",
        "[scheduler]",
        "max_consecutive_failures",
        "at least 0",
    ),
    "huge int": ("[scheduler]\nbatch_size = 9999999999\n", "[scheduler]", "batch_size", "most"),
    "negative tick connections": (
        "[scheduler]\ntick_connections = -1\n",
        "[scheduler]",
        "tick_connections",
        "at least 0",
    ),
    "oversized payload": (
        "[scheduler]\npayload_limit_bytes = 10\n" + TASK + 'payload = { region = "europe-west" }\n',
        "task 'x'",
        "payload",
        "over the 10-byte limit",
    ),
    "tick interval zero": (
        "[scheduler]\ntick_interval = 0\n",
        "[scheduler]",
        "tick_interval",
        "greater than 0",
    ),
    "tick interval nan": (
        "[scheduler]\ntick_interval = nan\n",
        "[scheduler]",
        "tick_interval",
        "finite",
    ),
    "short lease": ("[worker]\nlease_seconds = 4.5\n", "[worker]", "lease_seconds", "at least 5"),
    "negative concurrency": ("[worker]\nconcurrency = -1\n", "[worker]", "concurrency", "least"),
    "backoff base above max": (
        "[scheduler]\nbackoff_base_seconds = 7200\n",
        "[scheduler]",
        "backoff_base_seconds",
        "backoff_max_seconds",
    ),
    "bad TOML": ("[scheduler\n", "app.toml", "", "invalid TOML: "),
}


@pytest.mark.parametrize(("text", "where", "key", "fragment"), INVALID.values(), ids=INVALID)
def test_invalid_config_is_one_clear_line(
    tmp_path: Path, text: str, where: str, key: str, fragment: str
) -> None:
    message = config_error(write(tmp_path, text))
    assert where in message
    if key:
        assert f"key {key!r}: " in message
    assert fragment in message


def test_credential_value_is_never_printed(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, TASK + 'payload = { a = { token = "hunter2" } }\n'))
    assert "key 'payload.a.token'" in message and "hunter2" not in message


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "app.toml"
    path.write_bytes(b'[database]\nurl = "\xff"\n')
    assert "invalid TOML" in config_error(str(path))


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "app.toml")
    assert config_error(path) == f"{path}: cannot read file: No such file or directory"


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    (tmp_path / "app.toml").mkdir()
    assert "cannot read file" in config_error(str(tmp_path / "app.toml"))


def test_relative_path_is_named_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, TASK.replace("0 3 * * *", "61 * * * *"))
    message = config_error("app.toml")
    assert message.startswith(
        "app.toml: task 'x': key 'cron': invalid cron expression '61 * * * *'"
    )


def test_misspelt_name_key_is_reported_as_unknown(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, TASK.replace("name =", "nmae =")))
    assert message.endswith("tasks[0]: key 'nmae': unknown key (did you mean 'name'?)")


def test_database_settings_defaults_and_file(tmp_path: Path) -> None:
    assert parse_config({}).database == DatabaseSettings()
    config = parse_config(
        {
            "database": {
                "url": "postgresql://u@h/db",
                "pool_size": 2,
                "max_overflow": 0,
                "connect_timeout": 3,
                "statement_timeout": 1.5,
                "pooler": "transaction",
                "listen_url": "postgresql://u@direct/db",
            }
        }
    )
    assert config.database == DatabaseSettings(
        pool_size=2,
        max_overflow=0,
        connect_timeout=3.0,
        statement_timeout=1.5,
        pooler="transaction",
        listen_url="postgresql+psycopg://u@direct/db",
    )


def test_database_settings_from_the_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_DATABASE_POOL_SIZE", "7")
    monkeypatch.setenv("SCHEDULER_DATABASE_POOLER", "transaction")
    monkeypatch.setenv("SCHEDULER_DATABASE_STATEMENT_TIMEOUT", "2.5")
    config = parse_config({"database": {"pool_size": 3}}, "app.toml")
    assert config.database.pool_size == 7
    assert config.database.pooler == "transaction"
    assert config.database.statement_timeout == 2.5


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        ("POOL_SIZE", "x", "SCHEDULER_DATABASE_POOL_SIZE: expected an integer, got 'x'"),
        ("POOL_SIZE", "0", "SCHEDULER_DATABASE_POOL_SIZE: key 'pool_size': must be at least 1"),
        ("CONNECT_TIMEOUT", "soon", "SCHEDULER_DATABASE_CONNECT_TIMEOUT: expected a number"),
        ("POOLER", "session", "SCHEDULER_DATABASE_POOLER: key 'pooler': expected 'none' or"),
    ],
)
def test_bad_database_setting_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, message: str
) -> None:
    monkeypatch.setenv(f"SCHEDULER_DATABASE_{env}", value)
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        parse_config({}, "app.toml")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"pool_size": 0}, "key 'pool_size': must be at least 1, got 0"),
        ({"max_overflow": -1}, "key 'max_overflow': must be at least 0, got -1"),
        ({"connect_timeout": 0}, "key 'connect_timeout': must be greater than 0, got 0"),
        ({"statement_timeout": -1}, "key 'statement_timeout': must be at least 0, got -1"),
        ({"pooler": "session"}, "key 'pooler': expected 'none' or 'transaction', got 'session'"),
        (
            {"listen_url": "sqlite:///x.db"},
            "key 'listen_url': must be a PostgreSQL URL (only PostgreSQL can LISTEN)",
        ),
        ({"pool": 3}, "key 'pool': unknown key (did you mean 'pooler'?)"),
    ],
)
def test_bad_database_setting_in_the_file(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"database": table}, "app.toml")
    assert str(caught.value) == f"app.toml: [database]: {message}"


def test_database_settings_as_scheduler_arguments(tmp_path: Path) -> None:
    app = Scheduler(f"sqlite:///{tmp_path / 'x.db'}", pool_size=2, statement_timeout=4)
    assert app.database_settings.pool_size == 2
    assert app.store.database.statement_timeout == 4.0
    with pytest.raises(ConfigError, match="Scheduler\\(\\): key 'pooler'"):
        Scheduler(f"sqlite:///{tmp_path / 'x.db'}", pooler="session")
