"""Password hashes for the dashboard's sign-in, with the standard library only.

Hashes are scrypt in the PHC string format (``$scrypt$ln=14,r=8,p=1$SALT$HASH``, salt and hash
in unpadded base64), the form passlib and others read. Kept apart from ``dashboard/_auth.py``
(sessions and CSRF) so that the configuration can check ``[dashboard] password_hash`` without
importing the dashboard (which imports the configuration).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets

SCRYPT_LN, SCRYPT_R, SCRYPT_P = 14, 8, 1  # 2**14 * 8 * 128 bytes = 16 MiB, ~50 ms here
_PHC = re.compile(
    r"^\$scrypt\$ln=(\d{1,2}),r=(\d{1,2}),p=(\d{1,2})\$([A-Za-z0-9+/]+)\$([A-Za-z0-9+/]+)$"
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, ln: int = SCRYPT_LN) -> str:
    """A new salted scrypt hash of ``password`` in PHC format."""
    if not password:
        raise ValueError("the password must not be empty")
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, ln, SCRYPT_R, SCRYPT_P)
    return f"$scrypt$ln={ln},r={SCRYPT_R},p={SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def _scrypt(password: str, salt: bytes, ln: int, r: int, p: int) -> bytes:
    n = 2**ln
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=2 * 128 * n * r * p + 2**20, dklen=32
    )


def check_hash_format(encoded: str) -> None:
    """Raise ValueError unless ``encoded`` is a hash :func:`hash_password` could have made."""
    found = _PHC.match(encoded)
    if found is None:
        raise ValueError(
            "not a scrypt hash in PHC format ($scrypt$ln=..,r=..,p=..$salt$hash):"
            " make one with `scheduler dashboard --hash-password`"
        )
    ln, r, p = (int(v) for v in found.group(1, 2, 3))
    if not (10 <= ln <= 20 and 1 <= r <= 32 and 1 <= p <= 16):
        raise ValueError(f"scrypt parameters out of range (ln={ln}, r={r}, p={p})")
    try:
        _unb64(found.group(4)), _unb64(found.group(5))
    except (binascii.Error, ValueError):
        raise ValueError("the salt or the hash is not valid base64") from None


def verify_password(password: str, encoded: str) -> bool:
    """True if ``password`` matches ``encoded`` (compared in constant time)."""
    found = _PHC.match(encoded)
    if found is None:
        return False
    ln, r, p = (int(v) for v in found.group(1, 2, 3))
    expected = _unb64(found.group(5))
    digest = _scrypt(password, _unb64(found.group(4)), ln, r, p)
    return hmac.compare_digest(digest, expected)
