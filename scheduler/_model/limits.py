"""Limits every worker shares: what a ``[[limits]]`` table or a :class:`Limit` says, checked.

A limit caps the jobs it covers (those of its ``handlers``, of its ``queues``, and of the
handlers registered with ``limits=[name]``) by ``concurrency`` (attempts running at once) and
by ``rate`` (attempts started in any window of the period), for each partition of ``per``.
The database enforces it at claim time (``scheduler/_store/limits.py``); this module only
reads and checks the values, and words what a held job waits for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError
from .rules import INT_MAX, MISSING, Keys, kind_of, name_problem, one_line

PER_COLUMNS = ("tenant", "handler", "queue")
"""The partitions a job's own column gives; ``payload.KEY`` is the other kind."""

PART_LENGTH = 200
"""A partition's value is kept to this many characters."""

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*([smh])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
_PAYLOAD_KEY = re.compile(r"^[A-Za-z0-9_\-]{1,100}$")


def parse_rate(value: str) -> tuple[int, int]:
    """``"100/60s"`` -> (100, 60): starts allowed, and the period in seconds. Raises
    ValueError with the reason when it does not parse or a number is not positive."""
    found = _RATE.match(value)
    if found is None:
        raise ValueError(f"expected N/Ns, N/Nm or N/Nh (such as '100/60s'), got {value!r}")
    count, span, unit = int(found[1]), int(found[2]), found[3]
    if count <= 0 or span <= 0:
        raise ValueError(f"both numbers must be positive, got {value!r}")
    if count > INT_MAX or span * _UNIT_SECONDS[unit] > 366 * 86400:
        raise ValueError(f"too large: {value!r} (at most a year's period)")
    return count, span * _UNIT_SECONDS[unit]


def per_problem(value: object) -> str | None:
    """Why ``per`` is not ``"tenant"``, ``"handler"``, ``"queue"`` or ``"payload.KEY"``."""
    if not isinstance(value, str):
        return f"expected a string, got {kind_of(value)}"
    if value in PER_COLUMNS:
        return None
    if value.startswith("payload.") and _PAYLOAD_KEY.match(value.removeprefix("payload.")):
        return None
    return f"expected 'tenant', 'handler', 'queue' or 'payload.KEY', got {value!r}"


@dataclass(frozen=True)
class Limit:
    """A limit shared by every worker (``[[limits]]`` in the TOML file).

    ``concurrency``: attempts running at once, across every worker and host; ``rate``:
    attempts started per period (``"100/60s"``, ``"10/1m"``, ``"1000/1h"``); ``per``: one
    limit per ``"tenant"``, ``"handler"``, ``"queue"`` or ``"payload.KEY"`` (None: one for
    all); ``fair``: claims rotate round-robin across the partitions. A bad value raises
    :class:`~scheduler.ConfigError` naming the limit and the key.
    """

    name: str
    handlers: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    concurrency: int | None = None
    rate: str | None = None
    per: str | None = None
    fair: bool = False
    where: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "handlers", tuple(self.handlers))
        object.__setattr__(self, "queues", tuple(self.queues))
        data = {k: getattr(self, k) for k in _DEFAULTS if getattr(self, k) != _DEFAULTS[k]}
        data["name"] = self.name
        check_limit(data, self.where)

    @property
    def rate_count(self) -> int | None:
        return None if self.rate is None else parse_rate(self.rate)[0]

    @property
    def rate_seconds(self) -> int | None:
        return None if self.rate is None else parse_rate(self.rate)[1]

    @property
    def payload_key(self) -> str | None:
        """``KEY`` of ``per = "payload.KEY"``."""
        if self.per is None or not self.per.startswith("payload."):
            return None
        return self.per.removeprefix("payload.")

    def covers(self, handler: str, queue: str, named_by: Iterable[str] = ()) -> bool:
        """Whether a job of ``handler`` in ``queue`` is under this limit (``named_by``: the
        limits its handler was registered with)."""
        return handler in self.handlers or queue in self.queues or self.name in named_by


_DEFAULTS: dict[str, Any] = {
    "name": MISSING,
    "handlers": (),
    "queues": (),
    "concurrency": None,
    "rate": None,
    "per": None,
    "fair": False,
}


def check_limit(data: object, where: str = "", *, names_something: bool = False) -> str:
    """Check one limit's keys (a TOML table, or a :class:`Limit`'s fields) and return its
    name; raise ConfigError naming ``where`` (the file and the entry), the limit and the key.
    ``names_something``: the limit must name a handler or a queue (a file's limit: no handler
    can name it there)."""
    prefix = f"{where}: " if where else ""
    table = Keys(data, where or "limit", _DEFAULTS)
    name = table.text("name")
    problem = name_problem(name)
    if problem is not None:
        raise table.error("name", problem)
    table.where = f"{prefix}limit {name!r}"
    table.check_keys()
    for key in ("handlers", "queues"):
        for index, value in enumerate(table.strings(key)):
            problem = name_problem(value)
            if problem is not None:
                raise table.error(f"{key}[{index}]", problem)
    if names_something and not table.strings("handlers") and not table.strings("queues"):
        raise table.error("handlers", "the limit names no handler and no queue")
    concurrency = table.data.get("concurrency")
    if concurrency is not None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise table.error("concurrency", f"expected an integer, got {kind_of(concurrency)}")
        if concurrency <= 0 or concurrency > INT_MAX:
            raise table.error("concurrency", f"must be a positive integer, got {concurrency}")
    rate = table.data.get("rate")
    if rate is not None:
        if not isinstance(rate, str):
            raise table.error("rate", f"expected a string such as '100/60s', got {kind_of(rate)}")
        try:
            parse_rate(rate)
        except ValueError as exc:
            raise table.error("rate", str(exc)) from None
    if concurrency is None and rate is None:
        raise table.error("concurrency", "a limit needs a concurrency, a rate, or both")
    per = table.data.get("per")
    if per is not None:
        problem = per_problem(per)
        if problem is not None:
            raise table.error("per", problem)
    if table.flag("fair") and per is None:
        raise table.error("fair", "fair needs a per: it rotates across the partitions")
    return name


def parse_limits(items: object, path: str) -> tuple[Limit, ...]:
    """The ``[[limits]]`` array of the file at ``path``, checked whole: a bad entry raises
    ConfigError naming the file, the limit and the key."""
    if not isinstance(items, list):
        raise ConfigError(
            f"{path}: key 'limits': expected an array of tables, got {kind_of(items)}"
        )
    found: list[Limit] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, Mapping) or "name" not in item:
            check_limit(item, f"{path}: limits[{index}]")  # raises: not a table, or no name
        name = check_limit(item, path, names_something=True)
        if name in seen:
            raise ConfigError(
                f"{path}: limit {name!r}: key 'name': duplicate limit name"
                f" (also limits[{seen[name]}])"
            )
        seen[name] = index
        found.append(
            Limit(
                name=name,
                handlers=tuple(item.get("handlers", ())),
                queues=tuple(item.get("queues", ())),
                concurrency=item.get("concurrency"),
                rate=item.get("rate"),
                per=item.get("per"),
                fair=bool(item.get("fair", False)),
                where=path,
            )
        )
    return tuple(found)


def check_limits(
    limits: Sequence[Limit],
    named: Mapping[str, Sequence[str]],
    where: str = "",
    *,
    complete: bool = True,
) -> None:
    """The limits of one application together: no two with one name, every limit a handler
    names (``named``: handler -> its ``limits``) exists, and (``complete``: every handler is
    registered) every limit covers something."""
    prefix = f"{where}: " if where else ""
    seen: set[str] = set()
    for limit in limits:
        if limit.name in seen:
            raise ConfigError(f"{prefix}limit {limit.name!r}: key 'name': duplicate limit name")
        seen.add(limit.name)
    for handler, names in sorted(named.items()):
        for name in names:
            if name not in seen:
                raise ConfigError(
                    one_line(
                        f"{prefix}handler {handler!r}: key 'limits': no limit named {name!r}"
                        + (f" (limits: {', '.join(sorted(seen))})" if seen else "")
                    )
                )
    covered = {name for names in named.values() for name in names}
    for limit in limits if complete else ():
        if not limit.handlers and not limit.queues and limit.name not in covered:
            raise ConfigError(
                f"{prefix}limit {limit.name!r}: key 'handlers': the limit names no handler"
                " and no queue, and no handler names it"
            )


def waiting_sentence(limit: Limit, running: int, started: int) -> str | None:
    """What a ready job under ``limit`` waits for, given its partition's ``running`` attempts
    and its ``started`` ones in the current window; None when the limit leaves room."""
    if limit.concurrency is not None and running >= limit.concurrency:
        return f"limit {limit.name}: {running} of {limit.concurrency} running"
    count, seconds = (limit.rate_count, limit.rate_seconds)
    if count is not None and started >= count:
        return f"limit {limit.name}: {started} of {count} started in {seconds}s"
    return None


def partition_of(
    limit: Limit, *, tenant: str | None, handler: str, queue: str, payload: Mapping[str, Any]
) -> str:
    """The partition of ``limit`` a job is in, as the store computes it (``""``: the one
    partition of a limit without ``per``, or a job without the value)."""
    if limit.per is None:
        return ""
    if limit.per == "tenant":
        return tenant or ""
    if limit.per == "handler":
        return handler[:PART_LENGTH]
    if limit.per == "queue":
        return queue[:PART_LENGTH]
    value = payload.get(limit.payload_key or "")
    if value is None:
        return ""
    if isinstance(value, str):
        return value[:PART_LENGTH]
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)[:PART_LENGTH]


Places = tuple[tuple[str, str], ...]
"""The places one running job holds: (limit name, partition) for each limit over it."""


def handed_on(
    limits: Sequence[Limit], *, tenant: str | None, handler: str, queue: str
) -> Places | None:
    """The places a job under ``limits`` (those over its handler and queue) can hand to a
    ready job when it ends, or None when they must go back to the claim that counts.

    A place passes from an ending attempt to the next one in the transaction that writes the
    ending, so the running count of each partition stays what it was and no lock is needed.
    That holds for a ``concurrency`` only: a ``rate`` counts each start (a successor is one
    more), ``fair`` decides by its rotation who is next, and a partition by a payload value is
    left to the counting claim (its text in SQL and here may differ for some JSON values)."""
    if not limits:
        return None
    for limit in limits:
        if limit.rate is not None or limit.fair or limit.payload_key is not None:
            return None
    return tuple(
        (limit.name, partition_of(limit, tenant=tenant, handler=handler, queue=queue, payload={}))
        for limit in limits
    )


@dataclass(frozen=True)
class LimitSet:
    """An application's limits, with the handlers that name them (``limits=[...]`` at
    registration): which jobs each covers."""

    limits: tuple[Limit, ...] = ()
    named: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.limits)

    def handlers_of(self, limit: Limit) -> tuple[str, ...]:
        """The handlers ``limit`` covers: its own, and those registered naming it."""
        extra = [h for h, names in self.named.items() if limit.name in names]
        return tuple(sorted({*limit.handlers, *extra}))

    @property
    def handlers(self) -> frozenset[str]:
        """Every handler some limit covers."""
        return frozenset(h for limit in self.limits for h in self.handlers_of(limit))

    @property
    def queues(self) -> frozenset[str]:
        """Every queue some limit covers."""
        return frozenset(q for limit in self.limits for q in limit.queues)

    def of(self, handler: str, queue: str) -> tuple[Limit, ...]:
        """The limits a job of ``handler`` in ``queue`` is under."""
        named = self.named.get(handler, ())
        return tuple(limit for limit in self.limits if limit.covers(handler, queue, named))

    def get(self, name: str) -> Limit | None:
        return next((limit for limit in self.limits if limit.name == name), None)
