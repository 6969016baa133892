"""Payload rules: small JSON objects, no credential-like keys at any depth."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import PayloadError

DEFAULT_PAYLOAD_LIMIT = 64 * 1024

# A key is split into words on "_", "-", ".", spaces and camelCase ("x-api-key", "apiKey",
# "sessionToken", "DB_PASSWORD", "APIKey"), and is credential-like when one of its words is a
# credential word, or two adjacent words make one ("api key"); a word that merely contains
# one ("tokenizer", "secretary", "max_tokens") is not. docs/reference/toml.md lists both ways.
_CREDENTIAL_WORDS = frozenset(
    {
        "password", "passwords", "passwd", "passphrase", "secret", "secrets", "token",
        "apikey", "apikeys", "authorization", "credential", "credentials", "privatekey",
        "accesskey", "secretkey", "session", "cookie", "cookies",
    }
)  # fmt: skip
# Written as one word, a compound ending in one of these is credential-like too
# ("accesstoken", "clientsecret", "dbpassword"); "session" and "authorization" only whole.
_CREDENTIAL_ENDINGS = (
    "token", "password", "passwd", "passphrase", "secret", "cookie", "credential",
    "credentials", "apikey", "privatekey", "accesskey", "secretkey",
)  # fmt: skip
_CREDENTIAL_PAIRS = frozenset(
    {("api", "key"), ("api", "keys"), ("private", "key"), ("private", "keys")}
    | {("access", "key"), ("access", "keys")}
)
# A token that names a place in a listing, not a credential ("pageToken", "next_page_token").
_CURSOR_WORDS = frozenset({"page", "continuation", "pagination", "cursor", "idempotency"})
_SEPARATORS = re.compile(r"[\s_\-.]+")
_CAMEL_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[^A-Z0-9]+|[0-9]+")


def key_words(key: str) -> list[str]:
    """The lower-cased words of ``key``, split on "_", "-", ".", spaces and camelCase."""
    return [word.lower() for part in _SEPARATORS.split(key) for word in _CAMEL_WORDS.findall(part)]


def _is_cursor_compound(word: str) -> bool:
    """A cursor written as one word: "pagetoken", "continuationtoken"."""
    return word.endswith("token") and word[: -len("token")].endswith(tuple(_CURSOR_WORDS))


@functools.lru_cache(maxsize=4096)  # payloads of many tasks (or jobs) share their keys
def is_credential_key(key: str) -> bool:
    """Whether ``key`` looks like it names a credential: one of its words is a credential word
    (``access_token``, ``sessionToken``, ``db_password``), or two adjacent words are
    (``api_key``, ``x-api-key``, ``privateKey``); ``max_tokens`` or ``tokenizer`` are not."""
    words = key_words(key)
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        if word == "token" and before in _CURSOR_WORDS:
            continue
        if word in _CREDENTIAL_WORDS or (before, word) in _CREDENTIAL_PAIRS:
            return True
        if word.endswith(_CREDENTIAL_ENDINGS) and not _is_cursor_compound(word):
            return True
    return False


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False)
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _flat_and_clean(payload: Mapping[Any, Any]) -> bool:
    """True for the common payload (one level of string keys, none credential-like, scalar
    values): no walk can find anything in it."""
    return all(
        type(key) is str and type(value) in _SCALARS and not is_credential_key(key)
        for key, value in payload.items()
    )


def _first_key(value: Any, wanted: Callable[[Any], bool], path: str = "") -> str | None:
    """The dotted path of the first key, at any depth, for which ``wanted(key)`` holds."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if wanted(key):
                return here
            found = _first_key(item, wanted, here)
            if found:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first_key(item, wanted, f"{path}[{index}]")
            if found:
                return found
    return None


def find_credential_key(value: Any, path: str = "") -> str | None:
    """Return the dotted path of the first credential-like key in ``value``, or None."""
    if isinstance(value, Mapping) and _flat_and_clean(value):
        return None
    return _first_key(value, lambda key: is_credential_key(str(key)), path)


def find_non_string_key(value: Any, path: str = "") -> str | None:
    """Return the path of the first key that is not a string (JSON would change it), or None."""
    if isinstance(value, Mapping) and _flat_and_clean(value):
        return None
    return _first_key(value, lambda key: not isinstance(key, str), path)


def encode_payload(payload: Any, limit: int = DEFAULT_PAYLOAD_LIMIT) -> str:
    """Validate ``payload`` and return its compact JSON text.

    Raises :class:`PayloadError` for a non-object, non-JSON values, a key that is not a string,
    an oversized or too deeply nested payload, or a credential-like key (the key's path is
    named, its value never).
    """
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise PayloadError(f"payload must be a JSON object (a dict), not {type(payload).__name__}")
    if _flat_and_clean(payload):
        found = odd_key = None  # what the two walks below find for such a payload
    else:
        try:
            found = find_credential_key(payload)
            odd_key = find_non_string_key(payload)
        except RecursionError:
            raise PayloadError("payload is nested too deeply") from None
    if found:
        raise PayloadError(
            f"payload key {found!r} looks like a credential; pass a reference"
            " (for example a secret's name), never the secret itself"
        )
    if odd_key:
        raise PayloadError(f"payload key {odd_key!r} is not a string (JSON keys are strings)")
    try:
        text = _ENCODER.encode(payload)
    except RecursionError:
        raise PayloadError("payload is nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    if len(text) * 4 <= limit:  # a UTF-8 character is at most 4 bytes: surely under the limit
        return text
    size = len(text.encode())
    if size > limit:
        raise PayloadError(f"payload is {size} bytes, over the {limit}-byte limit")
    return text


def decode_payload(text: str | None) -> dict[str, Any]:
    """Parse stored payload text back into a dict."""
    if not text:
        return {}
    value = json.loads(text)
    assert isinstance(value, dict)
    return value
