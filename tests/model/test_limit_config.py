"""Limits every worker shares: the ``[[limits]]`` tables and ``Limit`` checked, one clear line
per mistake naming the file, the limit and the key; the rules the claim counts by."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import Limit, Scheduler
from scheduler._config import load_config
from scheduler._errors import ConfigError
from scheduler._model.handlers import Registry
from scheduler._model.limits import (
    LimitSet,
    parse_rate,
    partition_of,
    waiting_sentence,
)

GOOD = """
[[limits]]
name = "crm-api"
handlers = ["crm.sync", "crm.push"]
concurrency = 10
rate = "100/60s"
per = "tenant"
fair = true

[[limits]]
name = "mail"
queues = ["mail"]
rate = "5/1m"
"""


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
    assert "\n" not in message, message
    assert message.startswith(f"{path}: "), message
    return message


def test_limits_table_parses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    crm, mail = config.limits
    assert crm == Limit(
        "crm-api",
        handlers=("crm.sync", "crm.push"),
        concurrency=10,
        rate="100/60s",
        per="tenant",
        fair=True,
    )
    assert (crm.rate_count, crm.rate_seconds) == (100, 60)
    assert (mail.queues, mail.concurrency, mail.rate_seconds) == (("mail",), None, 60)


def test_no_limits_is_no_limits(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")).limits == ()


LIMIT = '[[limits]]\nname = "crm-api"\nhandlers = ["crm.sync"]\n'


@pytest.mark.parametrize(
    ("body", "key", "says"),
    [
        ('rate = "100 per minute"', "rate", "expected N/Ns, N/Nm or N/Nh"),
        ('rate = "100/60d"', "rate", "expected N/Ns, N/Nm or N/Nh"),
        ('rate = "0/60s"', "rate", "both numbers must be positive"),
        ('rate = "10/0s"', "rate", "both numbers must be positive"),
        ('rate = "-1/60s"', "rate", "expected N/Ns"),
        ("rate = 100", "rate", "expected a string"),
        ("concurrency = 0", "concurrency", "must be a positive integer, got 0"),
        ("concurrency = -3", "concurrency", "must be a positive integer, got -3"),
        ("concurrency = 2.5", "concurrency", "expected an integer"),
        ("concurrency = 2\nper = 'customer'", "per", "expected 'tenant', 'handler', 'queue'"),
        ("concurrency = 2\nper = 'payload.'", "per", "or 'payload.KEY'"),
        ("concurrency = 2\nfair = true", "fair", "fair needs a per"),
        ("concurrency = 2\nfair = 'yes'", "fair", "expected a boolean"),
        ("concurrency = 2\nburst = 3", "burst", "unknown key"),
        ("", "concurrency", "a limit needs a concurrency, a rate, or both"),
    ],
)
def test_bad_limit_is_one_line_naming_file_limit_and_key(
    tmp_path: Path, body: str, key: str, says: str
) -> None:
    path = write(tmp_path, LIMIT + body + "\n")
    message = config_error(path)
    assert message.startswith(f"{path}: limit 'crm-api': key '{key}': "), message
    assert says in message


def test_a_limit_naming_nothing_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[[limits]]\nname = "crm-api"\nconcurrency = 3\n')
    message = config_error(path)
    assert message == (
        f"{path}: limit 'crm-api': key 'handlers': the limit names no handler and no queue"
    )


def test_two_limits_with_one_name_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, LIMIT + "concurrency = 2\n" + LIMIT + "concurrency = 3\n")
    assert config_error(path) == (
        f"{path}: limit 'crm-api': key 'name': duplicate limit name (also limits[0])"
    )


def test_a_limit_without_a_name_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[[limits]]\nconcurrency = 3\nhandlers = ["x"]\n')
    assert config_error(path) == f"{path}: limits[0]: key 'name': missing"


def test_limits_must_be_an_array_of_tables(tmp_path: Path) -> None:
    path = write(tmp_path, 'limits = "crm"\n')
    assert "key 'limits': expected an array of tables" in config_error(path)


def test_limit_in_python_is_checked_alike() -> None:
    with pytest.raises(ConfigError, match=r"^limit 'crm': key 'rate': expected N/Ns"):
        Limit("crm", handlers=["a"], rate="fast")
    with pytest.raises(ConfigError, match=r"^limit 'crm': key 'concurrency': must be a positive"):
        Limit("crm", handlers=["a"], concurrency=-1)
    with pytest.raises(ConfigError, match=r"^limit 'crm': key 'per': expected"):
        Limit("crm", handlers=["a"], concurrency=1, per="tenant.id")


def test_handler_naming_an_unknown_limit_is_refused(tmp_path: Path) -> None:
    app = Scheduler(
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        registry=Registry(),
        limits=[Limit("crm-api", concurrency=2)],
    )

    @app.handler("crm.sync", limits=["crm-ap"])
    def sync(job: object) -> None:
        pass

    with pytest.raises(ConfigError) as info:
        app.limit_set()
    assert str(info.value) == (
        "handler 'crm.sync': key 'limits': no limit named 'crm-ap' (limits: crm-api)"
    )
    app.close()


def test_python_limit_named_by_no_handler_is_refused_when_the_worker_starts(
    tmp_path: Path,
) -> None:
    app = Scheduler(
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        registry=Registry(),
        limits=[Limit("crm-api", concurrency=2)],
    )
    with pytest.raises(ConfigError, match="limit 'crm-api': key 'handlers': the limit names no"):
        app.runner()

    @app.handler("crm.sync", limits=["crm-api"])
    def sync(job: object) -> None:
        pass

    limits = app.limit_set()
    assert limits.handlers == {"crm.sync"}
    assert [limit.name for limit in limits.of("crm.sync", "default")] == ["crm-api"]
    assert limits.of("other", "default") == ()
    app.close()


def test_two_python_limits_with_one_name_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="limit 'a': key 'name': duplicate limit name"):
        Scheduler(
            f"sqlite:///{tmp_path / 'db.sqlite'}",
            registry=Registry(),
            limits=[Limit("a", queues=["q"], concurrency=1), Limit("a", queues=["r"], rate="1/1s")],
        )


def test_handler_limits_must_be_a_list_of_names() -> None:
    registry = Registry()
    with pytest.raises(TypeError, match="handler 'x': limits must be a list of limit names"):
        registry.handler("x", limits="crm-api")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("100/60s", (100, 60)), ("10/1m", (10, 60)), ("1000/2h", (1000, 7200)), (" 5 / 1s", (5, 1))],
)
def test_parse_rate(text: str, expected: tuple[int, int]) -> None:
    assert parse_rate(text) == expected


def test_partition_of_each_per() -> None:
    job = {"tenant": "acme", "handler": "crm.sync", "queue": "crm", "payload": {"account": 7}}
    assert partition_of(Limit("l", queues=["q"], concurrency=1), **job) == ""
    assert partition_of(Limit("l", queues=["q"], concurrency=1, per="tenant"), **job) == "acme"
    assert partition_of(Limit("l", queues=["q"], concurrency=1, per="handler"), **job) == "crm.sync"
    assert partition_of(Limit("l", queues=["q"], concurrency=1, per="queue"), **job) == "crm"
    by_account = Limit("l", queues=["q"], concurrency=1, per="payload.account")
    assert partition_of(by_account, **job) == "7"
    assert partition_of(by_account, **{**job, "payload": {}}) == ""
    assert (
        partition_of(
            Limit("l", queues=["q"], concurrency=1, per="tenant"), **{**job, "tenant": None}
        )
        == ""
    )


def test_waiting_sentence() -> None:
    limit = Limit("crm-api", handlers=["a"], concurrency=10, rate="100/60s")
    assert waiting_sentence(limit, 10, 0) == "limit crm-api: 10 of 10 running"
    assert waiting_sentence(limit, 3, 100) == "limit crm-api: 100 of 100 started in 60s"
    assert waiting_sentence(limit, 9, 99) is None


def test_limit_set_covers_by_handler_queue_and_registration() -> None:
    by_queue = Limit("mail", queues=["mail"], rate="5/1m")
    by_handler = Limit("crm", handlers=["crm.sync"], concurrency=2)
    named = Limit("api", concurrency=4)
    limits = LimitSet((by_queue, by_handler, named), {"crm.push": ("api",)})
    assert limits.of("crm.sync", "mail") == (by_queue, by_handler)
    assert limits.of("crm.push", "default") == (named,)
    assert limits.handlers == {"crm.sync", "crm.push"}
    assert limits.queues == {"mail"}
    assert not LimitSet()
