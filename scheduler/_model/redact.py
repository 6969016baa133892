"""The error message a run keeps when ``[worker] error_messages = "first-line"``: the first
line of the exception's message, with anything that looks like a secret replaced by ``***``
before it is written, cut to :data:`MESSAGE_LIMIT` characters. Pure: no I/O, no clock.

What is redacted:

- a password in a URL: ``scheme://user:PASSWORD@host``;
- a bearer or basic token: ``Bearer TOKEN``, ``Basic TOKEN``;
- the value of an ``Authorization:`` (or ``Proxy-Authorization:``) header;
- the value of a ``key=value``, ``key: value`` or ``"key": "value"`` pair whose key is a
  credential word or has one as a ``_``/``-``/camelCase part (``password``, ``db_password``,
  ``apiKey``, ``access_token``, ``secret``, ``session``, ``cookie``, ...);
- a long token: a run of 32 or more hexadecimal digits, or of 40 or more base64/base64url
  characters mixing upper case, lower case and digits (a UUID, with its dashes, stays).
"""

from __future__ import annotations

import itertools
import re

#: The most characters of a message a run keeps.
MESSAGE_LIMIT = 300
#: What a secret is replaced by.
MASK = "***"
#: The ``[worker] error_messages`` values.
ERROR_MESSAGES = ("none", "first-line")

# Whole words of a key that make it a credential (compared lower-cased, one part at a time).
_CREDENTIAL_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pass",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "auth",
        "authorization",
        "credential",
        "credentials",
        "cookie",
        "session",
        "sessionid",
        "signature",
        "private",
        "privatekey",
        "otp",
        "pin",
        "dsn",
        "jwt",
        "bearer",
    }
)
# Pairs of adjacent parts that make a credential together: api_key, private_key, access_key...
_CREDENTIAL_PAIRS = frozenset(
    {("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"), ("client", "secret")}
)

_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<secret>[^\s@/]+)@")
_AUTH_HEADER = re.compile(
    r"(?P<head>\b(?:proxy-)?authorization\s*[:=]\s*)(?P<secret>[^\r\n,;]+)", re.IGNORECASE
)
_SCHEME_TOKEN = re.compile(
    r"(?P<head>\b(?:bearer|basic|token)\s+)(?P<secret>[A-Za-z0-9\-._~+/]{8,}=*)", re.IGNORECASE
)
# key=value, key: value, "key": "value", 'key'='value'; the value ends at a space, a comma, a
# semicolon, an ampersand or a closing quote/bracket (a quoted value at its closing quote).
_KEY = re.compile(r"""(?<![A-Za-z0-9_\-])(?P<key>[A-Za-z][A-Za-z0-9_\-]*)["']?\s*[:=]\s*""")
_VALUE = re.compile(r""""[^"]*"|'[^']*'|[^\s,;&"')\]}]+""")
_HEX = re.compile(r"(?<![A-Za-z0-9])[0-9a-fA-F]{32,}(?![A-Za-z0-9])")
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{40,}={0,2}(?![A-Za-z0-9+/_\-])")
_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def is_credential_key(key: str) -> bool:
    """Whether ``key`` names a credential: a credential word is the key or one of its parts
    (split at ``_``, ``-``, ``.`` and camelCase), or two adjacent parts make one (``api_key``).
    ``max_tokens``, ``tokenizer``, ``secretary``, ``passenger`` and ``session_count``... are
    not all alike: ``session_count`` is (a ``session`` part), ``max_tokens`` is not."""
    parts = [p.lower() for p in _PARTS.findall(key)]
    if not parts:
        return False
    if "".join(parts) in _CREDENTIAL_WORDS:
        return True
    if any(p in _CREDENTIAL_WORDS for p in parts):
        return True
    return any(pair in _CREDENTIAL_PAIRS for pair in itertools.pairwise(parts))


def _mask_value(value: str) -> str:
    if value[:1] in "\"'" and value[-1:] == value[:1] and len(value) >= 2:
        return value[0] + MASK + value[0]
    return MASK


def _pairs(text: str) -> str:
    """Mask the value of each pair whose key is a credential (a key's separator is read
    before its value, so ``failed: password=x`` finds ``password``)."""
    out: list[str] = []
    pos = 0
    for key in _KEY.finditer(text):
        if key.start() < pos or not is_credential_key(key["key"]):
            continue
        value = _VALUE.match(text, key.end())
        if value is None:
            continue
        out += [text[pos : key.end()], _mask_value(value[0])]
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)


def _long_base64(match: re.Match[str]) -> str:
    text = match[0]
    # A token mixes cases and digits; a long word, a path or a dotted name does not.
    mixed = (
        any(c.isupper() for c in text)
        and any(c.islower() for c in text)
        and any(c.isdigit() for c in text)
    )
    return MASK if mixed else text


def redact(text: str) -> str:
    """``text`` with anything that looks like a secret replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK + "@", text)
    text = _AUTH_HEADER.sub(lambda m: m["head"] + MASK, text)
    text = _SCHEME_TOKEN.sub(lambda m: m["head"] + MASK, text)
    text = _pairs(text)
    text = _HEX.sub(MASK, text)
    return _BASE64.sub(_long_base64, text)


def first_line(message: str) -> str | None:
    """The first non-blank line of ``message``, redacted, cut to :data:`MESSAGE_LIMIT`
    characters (the last one an ellipsis when cut); None for an empty message."""
    for line in message.splitlines():
        line = line.strip()
        if line:
            kept = redact(line)
            if len(kept) > MESSAGE_LIMIT:
                kept = kept[: MESSAGE_LIMIT - 1] + "…"
            return kept
    return None


def error_message(exc: BaseException, mode: str) -> str | None:
    """What a run keeps of ``exc``'s message under ``[worker] error_messages = mode``:
    nothing for ``"none"``; the redacted first line for ``"first-line"``."""
    if mode != "first-line":
        return None
    try:
        text = str(exc)
    except Exception:  # a __str__ that raises: keep nothing rather than fail the recording
        return None
    return first_line(text)
