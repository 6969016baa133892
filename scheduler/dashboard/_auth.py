"""Signed session cookies and CSRF tokens, with the standard library only; the password hashes
are ``scheduler/_model/passwords.py``'s (re-exported here). Sessions are a small JSON object
signed with HMAC-SHA256; the CSRF token is an HMAC of the session's random id, so a token from
another (or an earlier) session never matches.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import time
from typing import Any

from .._config import DASHBOARD_PASSWORD_ENV, DashboardSettings
from .._errors import ConfigError
from .._model.passwords import check_hash_format as check_hash_format  # re-exported
from .._model.passwords import hash_password as hash_password  # re-exported
from .._model.passwords import verify_password as verify_password  # re-exported, also used


def _url64(data: bytes) -> str:
    """URL-safe, unpadded: a cookie value that needs no quoting."""
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unurl64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs and reads session cookies; makes and checks CSRF tokens."""

    def __init__(self, secret: bytes, max_age: float = 12 * 3600) -> None:
        self.secret = secret
        self.max_age = max_age

    def _mac(self, purpose: str, data: bytes) -> str:
        return _url64(
            hmac.new(self.secret, purpose.encode() + b"\0" + data, hashlib.sha256).digest()
        )

    def dumps(self, session: dict[str, Any]) -> str:
        body = _url64(json.dumps({**session, "t": int(time.time())}).encode())
        return f"{body}.{self._mac('session', body.encode())}"

    def loads(self, cookie: str | None) -> dict[str, Any] | None:
        """The session in a cookie, or None if it is missing, forged or expired."""
        if not cookie or "." not in cookie:
            return None
        body, mac = cookie.rsplit(".", 1)
        if not hmac.compare_digest(mac, self._mac("session", body.encode())):
            return None
        try:
            data = json.loads(_unurl64(body))
        except (ValueError, binascii.Error):
            return None
        if not isinstance(data, dict) or time.time() - float(data.get("t", 0)) > self.max_age:
            return None
        return data

    def csrf_token(self, sid: str) -> str:
        return self._mac("csrf", sid.encode())

    def check_csrf(self, sid: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(str(token), self.csrf_token(sid))


# -- who may bind where ------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def credentials(settings: DashboardSettings, where: str = "[dashboard]") -> tuple[str, str] | None:
    """(username, password hash) from ``[dashboard]``, the hash overridden by the env.

    Only the dashboard reads them: a file with a ``username`` whose hash is in the environment
    loads in every process, and the dashboard alone refuses to start without the hash."""
    password_hash = os.environ.get(DASHBOARD_PASSWORD_ENV) or settings.password_hash
    if not password_hash:
        if settings.username:
            raise ConfigError(
                f"{where}: key 'password_hash': missing (username is set): set it in the file"
                f" or in ${DASHBOARD_PASSWORD_ENV} (`scheduler dashboard --hash-password`)"
            )
        return None
    if not settings.username:
        source = (
            "$" + DASHBOARD_PASSWORD_ENV if os.environ.get(DASHBOARD_PASSWORD_ENV) else "the file"
        )
        raise ConfigError(f"{where}: key 'username': missing (a password hash is set in {source})")
    return settings.username, password_hash


def credentials_match(found: tuple[str, str] | None, user: str, password: str) -> bool:
    """True if ``user`` and ``password`` are the configured ones (``found``, from
    :func:`credentials`). The password is verified even when the name is wrong, so that the
    answer takes as long either way."""
    if found is None:
        return False
    name_ok = secrets.compare_digest(user.encode(), found[0].encode())
    return verify_password(password, found[1]) and name_ok


def check_bind(host: str, settings: DashboardSettings, where: str = "[dashboard]") -> None:
    """Refuse a non-loopback address when no credentials are configured."""
    if credentials(settings, where) is None and not is_loopback(host):
        raise ConfigError(
            f"{where}: refusing to serve the dashboard on {host} without credentials: set"
            f" [dashboard] username and password_hash (`scheduler dashboard --hash-password`)"
        )
