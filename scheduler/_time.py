"""The one clock. Code that decides what is due takes ``now``; only entry points read this."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import overload

Clock = Callable[[], datetime]


@overload
def iso(value: datetime) -> str: ...
@overload
def iso(value: None) -> None: ...
@overload
def iso(value: datetime | None) -> str | None: ...
def iso(value: datetime | None) -> str | None:
    """ISO-8601 as the scheduler prints instants (``status --json``, ``explain``, the audit, the
    dashboard): a UTC instant ends in ``Z``; None stays None."""
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def utcnow() -> datetime:
    """The current time, aware UTC."""
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """Return ``value`` as aware UTC; naive values are refused."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r}: pass an aware datetime (UTC)")
    return value.astimezone(UTC)
