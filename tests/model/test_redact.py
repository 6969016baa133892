"""The error message a run keeps: the first line, at most 300 characters, secrets redacted."""

from __future__ import annotations

import pytest

from scheduler._model.redact import MESSAGE_LIMIT, error_message, first_line, is_credential_key

SECRET = "hunter2XYZ"

REDACTED = [
    f"could not connect to postgresql://app:{SECRET}@db.internal:5432/prod",
    f"redis://:{SECRET}@cache:6379/0 refused the connection",
    f"got 401 with Authorization: Bearer {SECRET}abcdefgh",
    f"request failed; authorization={SECRET}",
    f"401 Unauthorized (token {SECRET}abcdefgh)",
    f"upstream said: bearer {SECRET}.abc.def",
    f"login failed: password={SECRET} user=bob",
    f"bad config db_password: {SECRET}",
    f'payload {{"api_key": "{SECRET}", "max_tokens": 10}}',
    f"sessionToken={SECRET}",
    f"X-Api-Key={SECRET}",
    f"client_secret='{SECRET}'",
    f"cookie: {SECRET}",
    f"key {'ab12' * 10} rejected",
    f"signature Zm9vYmFyYmF6cXV4{SECRET}Zm9vYmFyYmF6cXV4QUJDREVGR0g1234 did not match",
]

KEPT = [
    "max_tokens=4096 exceeds the model's limit",
    "tokenizer=cl100k_base not found",
    "secretary=ann is away",
    "connection to postgresql://db.internal:5432/prod refused",
    "job 123e4567-e89b-12d3-a456-426614174000 not found",
    "no such file /usr/lib/python3/dist-packages/requests/adapters/very_long_module_name.py",
    "ValueError: expected 3 items, got 4",
    "passenger_count=3 is not allowed",
]


@pytest.mark.parametrize("message", REDACTED)
def test_a_secret_is_redacted(message: str) -> None:
    kept = first_line(message)
    assert kept is not None
    assert SECRET not in kept
    assert "***" in kept


@pytest.mark.parametrize("message", KEPT)
def test_what_is_no_secret_is_kept(message: str) -> None:
    assert first_line(message) == message


def test_only_the_first_non_blank_line_is_kept() -> None:
    assert first_line("\n  boom: it broke  \nTraceback line 2\npassword=x") == "boom: it broke"
    assert first_line("") is None
    assert first_line("\n \n") is None


def test_a_long_line_is_cut_to_the_limit_after_redaction() -> None:
    kept = first_line("x" * 1000 + f" password={SECRET}")
    assert kept is not None
    assert len(kept) == MESSAGE_LIMIT
    assert kept.endswith("…")
    assert SECRET not in kept


def test_the_default_keeps_nothing() -> None:
    exc = ValueError("password=hunter2")
    assert error_message(exc, "none") is None
    assert error_message(exc, "first-line") == "password=***"


@pytest.mark.parametrize(
    ("key", "credential"),
    [
        ("password", True),
        ("db_password", True),
        ("access_token", True),
        ("sessionToken", True),
        ("apiKey", True),
        ("X-Api-Key", True),
        ("client_secret", True),
        ("max_tokens", False),
        ("tokenizer", False),
        ("secretary", False),
        ("user", False),
        ("keyboard", False),
    ],
)
def test_credential_keys_are_whole_words(key: str, credential: bool) -> None:
    assert is_credential_key(key) is credential
