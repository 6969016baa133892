"""Credential-like payload keys are matched on whole words (issue 37, item 3).

A key is split on "_", "-", ".", spaces and camelCase; it is refused when one of its words is a
credential word (or two adjacent words are, as in ``api_key``), never because a longer word
contains one: ``max_tokens``, ``tokenizer`` and ``secretary`` are everyday payload keys.
"""

from __future__ import annotations

import pytest

from scheduler import PayloadError
from scheduler._model.payload import encode_payload, is_credential_key, key_words

REFUSED = [
    # the word on its own, any case
    "password", "Password", "PASSWORD", "passwd", "passphrase", "secret", "token", "session",
    "cookie", "cookies", "credentials", "authorization", "Authorization", "apikey",
    # snake, kebab and dotted parts
    "access_token", "refresh_token", "id_token", "auth_token", "bearer_token", "csrf_token",
    "db_password", "smtp_password", "client_secret", "webhook_secret", "secret_key",
    "SECRET_KEY", "api_key", "API_KEY", "private_key", "aws_access_key_id",
    "aws_secret_access_key", "x-api-key", "X-Api-Key", "auth.token", "session_id",
    "session_count", "token_count", "user password", "slack.bot.token", "api_keys",
    # camelCase and PascalCase
    "accessToken", "sessionToken", "apiKey", "APIKey", "XApiKey", "privateKey", "clientSecret",
    "dbPassword", "refreshToken", "OAuthToken", "sessionId", "totalTokenCount",
    # compounds written as one word
    "accesstoken", "clientsecret", "dbpassword", "userpasswd", "authcookie", "privatekey",
    "nextpagetoken_secret",
]  # fmt: skip

ACCEPTED = [
    # LLM request and response keys
    "max_tokens", "max_completion_tokens", "maxOutputTokens", "top_p", "top_k", "temperature",
    "tokenizer", "tokenizer_name", "tokens", "num_tokens", "prompt_tokens", "completion_tokens",
    "tokens_used", "stop_sequences", "logprobs", "model", "system_prompt", "presence_penalty",
    # SaaS and business payloads
    "secretary", "secretary_email", "sessions", "max_sessions", "user_id", "customer_id",
    "account", "email", "report_date", "region", "queue", "key", "keyId", "key_id",
    "idempotency_key", "cache_key", "sort_key", "partition_key", "public_key", "monkey",
    "author", "auth_type", "passenger", "passage", "compass", "tokyo_office", "cookbook",
    # cursors of a listing are not credentials
    "page_token", "pageToken", "nextPageToken", "next_page_token", "continuation_token",
    "pagetoken", "nextpagetoken", "idempotency_token",
]  # fmt: skip


def test_the_lists_are_long_enough_and_disjoint() -> None:
    assert len(set(REFUSED)) >= 40 and len(set(ACCEPTED)) >= 40
    assert not set(REFUSED) & set(ACCEPTED)


@pytest.mark.parametrize("key", REFUSED)
def test_a_credential_word_in_the_key_is_refused(key: str) -> None:
    assert is_credential_key(key)
    with pytest.raises(PayloadError, match=f"payload key '{key}' looks like a credential"):
        encode_payload({key: "x"})


@pytest.mark.parametrize("key", ACCEPTED)
def test_a_key_that_only_contains_a_credential_word_is_accepted(key: str) -> None:
    assert not is_credential_key(key)
    assert encode_payload({key: 1}) == f'{{"{key}":1}}'


def test_nested_keys_are_judged_the_same_way() -> None:
    payload = {"request": {"max_tokens": 10, "messages": [{"tokenizer": "cl100k"}]}}
    assert encode_payload(payload)
    with pytest.raises(PayloadError, match=r"'request\.headers\.x-api-key'"):
        encode_payload({"request": {"headers": {"x-api-key": "k"}}})


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("x-api-key", ["x", "api", "key"]),
        ("APIKey", ["api", "key"]),
        ("sessionToken", ["session", "token"]),
        ("DB_PASSWORD", ["db", "password"]),
        ("max_tokens", ["max", "tokens"]),
        ("auth.token", ["auth", "token"]),
        ("db2Password", ["db", "2", "password"]),
    ],
)
def test_how_a_key_is_split_into_words(key: str, words: list[str]) -> None:
    assert key_words(key) == words
