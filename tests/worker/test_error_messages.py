"""``[worker] error_messages = "first-line"``: a failed run keeps the exception's first line,
redacted before it is written; the default keeps the error code only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler import Scheduler
from scheduler._model.handlers import Registry

COMMAND = [sys.executable, "-m", "scheduler.cli"]

# One secret of each kind the redaction knows, each distinct, so that each is looked for alone.
SECRETS = {
    "url": "postgresql://app:urlpassWORD1@db.internal:5432/prod",
    "bearer": "Bearer bearerTOKEN2abcdefgh",
    "header": "Authorization: headerVALUE3",
    "pair": "db_password=pairSECRET4",
    "json": '"api_key": "jsonKEY5secret"',
    "hex": "0123456789abcdef0123456789abcdef6",
}
NEEDLES = [
    "urlpassWORD1",
    "bearerTOKEN2abcdefgh",
    "headerVALUE3",
    "pairSECRET4",
    "jsonKEY5secret",
    "0123456789abcdef0123456789abcdef6",
]


def _config(tmp_path: Path, url: str, mode: str | None) -> Path:
    line = f'error_messages = "{mode}"\n' if mode else ""
    path = tmp_path / "app.toml"
    path.write_text(f'[database]\nurl = "{url}"\n\n[worker]\nlease_seconds = 5\n{line}')
    return path


def _failing_app(config: Path) -> Scheduler:
    registry = Registry()
    app = Scheduler.from_toml(config, registry=registry)

    @app.handler("t.leaky", max_attempts=1, retry_safe=True)
    def leaky(job: object) -> None:
        kind = job.payload["kind"]  # type: ignore[attr-defined]
        raise RuntimeError(f"upstream refused ({kind}) {SECRETS[kind]} and more\nsecond line")

    return app


def _database_bytes(tmp_path: Path) -> bytes:
    """The SQLite database's bytes, its write-ahead log's included."""
    return b"".join(p.read_bytes() for p in sorted(tmp_path.glob("jobs.db*")))


@pytest.mark.parametrize("mode", ["first-line", None])
def test_no_secret_reaches_the_database_file(tmp_path: Path, mode: str | None) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    config = _config(tmp_path, url, mode)
    app = _failing_app(config)
    app.migrate()
    ids = [app.enqueue("t.leaky", {"kind": kind}) for kind in SECRETS]
    assert app.work() == len(ids)
    messages = [r["error_message"] for i in ids for r in app.history(i)]
    app.close()
    if mode is None:  # the default: the error code only, as before
        assert messages == [None] * len(ids)
    else:
        for kind, message in zip(SECRETS, messages, strict=True):
            assert message is not None
            assert message.startswith(f"upstream refused ({kind}) ")
            assert "second line" not in message  # the first line only
            assert "***" in message
    raw = _database_bytes(tmp_path)
    assert b"upstream refused" in raw if mode else b"upstream refused" not in raw
    for needle in NEEDLES:
        assert needle.encode() not in raw, needle

    # `scheduler job ID` shows the message under the attempts.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    shown = subprocess.run(
        [*COMMAND, "--config", str(config), "job", str(ids[0])],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    if mode:
        assert "run 1 attempt 1: upstream refused (url) postgresql://app:***@db.internal" in shown
    else:
        assert "upstream refused" not in shown


def test_the_message_is_stored_on_every_engine(db_url: str, tmp_path: Path) -> None:
    app = _failing_app(_config(tmp_path, db_url, "first-line"))
    app.migrate()
    job_id = app.enqueue("t.leaky", {"kind": "pair"})
    app.work()
    [run] = app.history(job_id)
    app.close()
    assert run["error_message"] == "upstream refused (pair) db_password=*** and more"
    assert run["error_code"] == "RuntimeError"


def test_a_bad_value_is_one_line_naming_the_key(tmp_path: Path) -> None:
    from scheduler._errors import ConfigError

    config = _config(tmp_path, f"sqlite:///{tmp_path / 'jobs.db'}", "everything")
    with pytest.raises(ConfigError) as info:
        Scheduler.from_toml(config)
    assert str(info.value).count("\n") == 0
    assert "app.toml" in str(info.value)
    assert "[worker]" in str(info.value) and "error_messages" in str(info.value)
    assert not (tmp_path / "jobs.db").exists()


def test_an_async_handler_keeps_its_message_too(tmp_path: Path) -> None:
    """An ``async def`` handler runs on the event loop (``work_async``): its failure is
    written the same way."""
    import asyncio

    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    app = Scheduler.from_toml(_config(tmp_path, url, "first-line"), registry=Registry())

    @app.handler("t.async", max_attempts=1, retry_safe=True)
    async def leaky(job: object) -> None:
        raise ConnectionError("redis://:asyncSECRET7@cache:6379/0 refused")

    app.migrate()
    job_id = app.enqueue("t.async")
    assert asyncio.run(app.work_async()) == 1
    [run] = app.history(job_id)
    app.close()
    assert run["error_message"] == "redis://:***@cache:6379/0 refused"
    assert b"asyncSECRET7" not in _database_bytes(tmp_path)
