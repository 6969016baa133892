"""The one clock. Code that decides what is due takes ``now``; only entry points read this."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
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


def in_zone(value: datetime, zone: tzinfo) -> datetime:
    """The aware instant `value` as wall-clock time in `zone`, ``fold=1`` on the second
    occurrence of a repeated (fall-back) time.

    Every UTC-to-local conversion goes through here, never ``value.astimezone(zone)``:
    freezegun's ``FakeDatetime`` (what ``datetime.now()`` and friends return under frozen time)
    rebuilds the result of ``astimezone`` without its ``fold`` (spulec/freezegun#422), so the
    repeated hour would read as its first occurrence, with the wrong offset. ``zone.fromutc``
    sets ``fold`` itself, whatever the datetime class.
    """
    offset = value.utcoffset()
    if offset is None:
        raise ValueError(f"naive datetime {value!r}: pass an aware datetime")
    return zone.fromutc((value.replace(tzinfo=None) - offset).replace(tzinfo=zone))


def offset_in(zone: tzinfo, value: datetime) -> timedelta:
    """`zone`'s UTC offset at the aware instant `value` (see :func:`in_zone`)."""
    offset = in_zone(value, zone).utcoffset()
    assert offset is not None
    return offset
