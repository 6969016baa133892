"""The rules every way in checks alike: the TOML file, a ``TaskSpec`` built in Python, the
arguments of ``enqueue`` and of the operators' calls, the command line's options.

A name, a text's length, a tenant id, a run policy, an integer that a column holds, a job's state
(the defaults the command line shows in its help are ``defaults.py``'s). Only the standard library
is imported here, so that ``scheduler --help`` imports neither SQLAlchemy nor Alembic nor croniter;
the rules that need croniter (a cron expression, a zone) live in ``cron.py`` and are imported where
a task is checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from .._errors import ConfigError
from .defaults import JOB_STATES


# -- a job's states ------------------------------------------------------------------------
class JobState(StrEnum):
    """A job's state (``scheduler_jobs.state``); the values are what the column holds, so a
    member compares equal to the plain string read back."""

    QUEUED = "queued"
    """Waiting for its ``run_at`` and a worker."""
    CLAIMED = "claimed"
    """A worker holds its lease and runs it (a retry waiting for its back-off is ``queued``)."""
    SUCCEEDED = "succeeded"
    """Finished: the handler returned."""
    ABORTED = "aborted"
    """Finished without success: out of attempts, or an error that is not retried."""


QUEUED, CLAIMED = JobState.QUEUED, JobState.CLAIMED
SUCCEEDED, ABORTED = JobState.SUCCEEDED, JobState.ABORTED
assert JOB_STATES == tuple(state.value for state in JobState)  # the help's list is the enum's
STATES = (QUEUED, CLAIMED, SUCCEEDED, ABORTED)
#: The states of a job still in flight (what holds a task back).
IN_FLIGHT = frozenset({QUEUED, CLAIMED})


# -- numbers and texts the columns hold ----------------------------------------------------
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
"""An INTEGER column's range on every engine."""
MAX_NAME = 200
"""A task's name, its handler's and its cron's longest form (their columns' length)."""
#: The texts a caller of ``enqueue`` chooses, and their columns' length in characters
#: (``scheduler_jobs``; the store's tables are declared with these lengths).
TEXT_LIMITS = {"handler": MAX_NAME, "queue": 100, "dedupe_key": 200}
MAX_NOTE = 500
"""An operator's note with a disable (``disabled_note``)."""


def check_text(**values: str | None) -> None:
    """Raise ``ValueError`` naming the first value longer than its column (``TEXT_LIMITS``).

    Checked before any SQL, so every engine refuses alike: PostgreSQL and MariaDB would raise a
    ``DataError``, and SQLite would store the whole value.
    """
    for name, value in values.items():
        limit = TEXT_LIMITS[name]
        if value is not None and len(value) > limit:
            raise ValueError(f"{name} is {len(value)} characters, over the {limit}-character limit")


def check_integer(name: str, number: object) -> None:
    """Raise ``TypeError`` unless ``number`` is an int (not a bool), ``ValueError`` unless an
    INTEGER column holds it."""
    if not isinstance(number, int) or isinstance(number, bool):
        raise TypeError(f"{name}: expected an integer, got {number!r}")
    if not INT_MIN <= number <= INT_MAX:
        raise ValueError(f"{name} {number} is outside {INT_MIN}..{INT_MAX}")


def check_job(
    handler: object,
    run_at: object,
    priority: object,
    max_attempts: object,
    tenant: object,
) -> None:
    """A new job's arguments (``enqueue``, each item of ``enqueue_many``), checked before
    anything is written: ``TypeError`` or ``ValueError`` naming the argument."""
    if not isinstance(handler, str) or not handler:
        raise TypeError(f"handler: expected a non-empty string, got {handler!r}")
    if run_at is not None and not isinstance(run_at, datetime):
        raise TypeError(f"run_at: expected an aware datetime, got {type(run_at).__name__}")
    for name, number in (("priority", priority), ("max_attempts", max_attempts)):
        if number is not None:
            check_integer(name, number)
    if isinstance(max_attempts, int) and max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if tenant is not None:
        check_tenant(tenant)


# Unicode category Cc: exactly C0, DEL and C1 (one regex search, not a lookup per character).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# A name that passes every rule of name_problem, in one match: no control character anywhere,
# and neither end a whitespace character.
_GOOD_NAME = re.compile(
    r"[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?"
)


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be a task's name or a handler's, or None."""
    if type(value) is str and len(value) <= MAX_NAME and _GOOD_NAME.fullmatch(value):
        return None  # the common case, in one regular-expression match
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty string"
    if len(value) > MAX_NAME:
        return f"longer than {MAX_NAME} characters"
    if value != value.strip() or _CONTROL.search(value):
        return "must not have leading or trailing whitespace or control characters"
    return None


def queue_problem(value: object) -> str | None:
    """Why ``value`` cannot name a queue (``pause``, ``resume``), or None."""
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty string"
    if len(value) > TEXT_LIMITS["queue"]:
        return f"longer than {TEXT_LIMITS['queue']} characters"
    if value != value.strip() or _CONTROL.search(value):
        return "must not have leading or trailing whitespace or control characters"
    return None


# -- tenants -------------------------------------------------------------------------------
#: A tenant id: 1-63 ASCII letters, digits, ``_`` and ``-``, starting with a letter or digit
#: (63: PostgreSQL's identifier length, so a tenant can name its schema).
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")


def tenant_problem(value: object) -> str | None:
    """Why ``value`` is not a tenant id, or None if it is one."""
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if TENANT_PATTERN.fullmatch(value) is None:
        shown = value if len(value) <= 70 else value[:67] + "..."
        return (
            f"{shown!r} is not a tenant id: 1 to 63 ASCII letters, digits, '_' and '-',"
            " starting with a letter or a digit"
        )
    return None


def check_tenant(value: object) -> None:
    """Raise ``ValueError`` unless ``value`` is a tenant id (``TENANT_PATTERN``)."""
    problem = tenant_problem(value)
    if problem is not None:
        raise ValueError(f"tenant: {problem}")


# -- run policies --------------------------------------------------------------------------
HOLD, SKIP, ALLOW, REPLACE = "hold", "skip", "allow", "replace"
OVERLAPS = (HOLD, SKIP, ALLOW, REPLACE)
"""What a slot does while the task's last job is in flight (``overlap``)."""
POLICY_SECONDS = ("catchup_window", "jitter")
"""The run policies given in whole seconds, 0 meaning off."""


def overlap_problem(overlap: Any, concurrent: Any) -> tuple[str, str] | None:
    """(key, why) when `overlap` is not a policy or contradicts `concurrent`; else None."""
    if overlap is None:
        return None
    if not isinstance(overlap, str) or overlap not in OVERLAPS:
        shown = repr(overlap) if isinstance(overlap, str) else kind_of(overlap)
        return "overlap", f"expected one of {', '.join(map(repr, OVERLAPS))}, got {shown}"
    if concurrent and overlap != ALLOW:
        return "concurrent", f"concurrent = true is overlap = 'allow', contradicting {overlap!r}"
    return None


def seconds_problem(value: Any) -> str | None:
    """Why ``value`` is not a policy's number of seconds (``POLICY_SECONDS``), or None."""
    if not isinstance(value, int) or isinstance(value, bool):
        return f"expected an integer number of seconds, got {value!r}"
    if not 0 <= value <= INT_MAX:
        return f"must be from 0 to {INT_MAX} seconds, got {value}"
    return None


MANUAL, PROBE = "manual", "probe"
RECOVERIES = (MANUAL, PROBE)
"""What follows a disable by the failure limit (``recovery``): a person's ``enable``, or
probes that re-enable the row at their first success."""
PROBE_INTERVALS = (900.0, 3600.0, 14400.0)
"""The default ``probe_intervals``: seconds before each probe, the last repeating."""
MAX_PROBE_INTERVALS = 10


def recovery_problem(value: Any) -> str | None:
    """Why ``value`` is not a ``recovery``, or None."""
    if isinstance(value, str) and value in RECOVERIES:
        return None
    shown = repr(value) if isinstance(value, str) else kind_of(value)
    return f"expected one of {', '.join(map(repr, RECOVERIES))}, got {shown}"


def probe_intervals_problem(value: Any) -> str | None:
    """Why ``value`` is not a non-empty list of positive numbers of seconds, or None."""
    if not isinstance(value, list | tuple) or not value:
        return f"expected a non-empty list of positive numbers of seconds, got {kind_of(value)}"
    if len(value) > MAX_PROBE_INTERVALS:
        return f"at most {MAX_PROBE_INTERVALS} intervals, got {len(value)}"
    for index, item in enumerate(value):
        if not is_number(item) or not math.isfinite(item) or not 0 < item <= INT_MAX:
            shown = repr(item) if is_number(item) else kind_of(item)
            return f"item {index}: expected a positive number of seconds, got {shown}"
    return None


def timeout_problem(value: Any) -> str | None:
    """Why ``value`` is not a task's ``timeout`` (None, 0 or a positive number of seconds)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number of seconds (0 for no limit), got {value!r}"
    if not math.isfinite(value) or value < 0:
        return f"must be a positive number of seconds (0 for no limit), got {value!r}"
    return None


def check_policies(task: Any) -> None:
    """The run policies of a task built in Python, checked as the TOML loader checks them:
    a ``ConfigError`` naming the task and the key."""
    problem = timeout_problem(getattr(task, "timeout", None))
    if problem is not None:
        raise ConfigError(f"task {task.name!r}: key 'timeout': {problem}")
    contradiction = overlap_problem(getattr(task, "overlap", None), task.concurrent)
    if contradiction is not None:
        raise ConfigError(f"task {task.name!r}: key {contradiction[0]!r}: {contradiction[1]}")
    for key in POLICY_SECONDS:
        problem = seconds_problem(getattr(task, key, 0))
        if problem is not None:
            raise ConfigError(f"task {task.name!r}: key {key!r}: {problem}")
    problem = recovery_problem(getattr(task, "recovery", MANUAL))
    if problem is not None:
        raise ConfigError(f"task {task.name!r}: key 'recovery': {problem}")
    problem = probe_intervals_problem(getattr(task, "probe_intervals", PROBE_INTERVALS))
    if problem is not None:
        raise ConfigError(f"task {task.name!r}: key 'probe_intervals': {problem}")


# -- health ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Thresholds:
    """How long before something counts as unhealthy, in seconds."""

    job_overdue: float = 300.0  # a ready job not claimed for this long
    row_overdue: float = 300.0  # an enabled row due this long ago and not dispatched
    row_held_back: float = 3600.0  # a row waiting this long on its in-flight job
    stalled: float = 600.0  # jobs waiting this long and nothing finished meanwhile
    tick: float = 120.0  # no scheduler tick for this long
    worker_gone: float = 30.0  # a worker not seen for this long is not running (kill -9)
    clock_offset: float = 2.0  # a host's clock this far off the database's (CLOCK_WARN_SECONDS)
    horizon: float = 300.0  # a transaction holding the MVCC horizon this long (PostgreSQL)


# -- a table of keys, as the TOML file and keyword arguments give them ----------------------
MISSING: Any = object()
"""A default that marks a key as required (:class:`Keys`)."""
_KINDS = dict(bool="boolean", int="integer", str="string", dict="table", list="array")


def kind_of(value: Any) -> str:
    """What ``value`` is, in TOML's words (``integer``, ``table`` ...)."""
    return _KINDS.get(type(value).__name__, type(value).__name__)


def one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to a mistyped `word` (compared without
    regard to case), or an empty string when none is close."""
    import difflib  # only for a mistake: `scheduler --help` need not load it

    by_folded = {choice.casefold(): choice for choice in choices}
    close = difflib.get_close_matches(word.casefold(), list(by_folded), n=1)
    return f" (did you mean {by_folded[close[0]]!r}?)" if close else ""


class Keys:
    """One table of keys being read (a TOML table, or keyword arguments): ``defaults`` lists
    its keys (:data:`MISSING`: required), and every error is one line naming ``where`` (the
    file, and the table or task) and the key."""

    def __init__(self, data: Any, where: str, defaults: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a table, got {kind_of(data)}")
        self.data: Mapping[str, Any] = data
        self.where = where
        self.defaults = defaults

    def check_keys(self) -> Keys:
        for key in self.data:
            if key not in self.defaults:
                raise self.error(str(key), f"unknown key{did_you_mean(str(key), self.defaults)}")
        return self

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(one_line(f"{self.where}: key {key!r}: {message}"))

    def get(self, key: str, expected: str, ok: Callable[[Any], bool]) -> Any:
        if key not in self.data:
            if self.defaults[key] is MISSING:
                raise self.error(key, "missing")
            return self.defaults[key]
        value = self.data[key]
        if not ok(value):
            raise self.error(key, f"expected {expected}, got {kind_of(value)}")
        return value

    def text(self, key: str) -> str:
        value: str = self.get(key, "a string", lambda v: isinstance(v, str))
        if not value.strip():
            raise self.error(key, "must not be empty")
        return value

    def flag(self, key: str) -> bool:
        value: bool = self.get(key, "a boolean", lambda v: isinstance(v, bool))
        return value

    def integer(self, key: str, minimum: int) -> int:
        value: int = self.get(key, "an integer", lambda v: is_number(v) and isinstance(v, int))
        if value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        if value > INT_MAX:
            raise self.error(key, f"must be at most {INT_MAX}")
        return value

    def number(self, key: str, minimum: float = 0, *, positive: bool = False) -> float:
        """A float at least ``minimum``, or greater than it when ``positive``."""
        value = self.get(key, "a number", is_number)
        if abs(value) > INT_MAX or not math.isfinite(value):
            raise self.error(key, f"must be a finite number, at most {INT_MAX}")
        if value < minimum or (positive and value == minimum):
            bound = "greater than" if positive else "at least"
            raise self.error(key, f"must be {bound} {minimum:g}, got {value:g}")
        return float(value)

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.text(key)
        if value not in choices:
            expected = " or ".join(repr(choice) for choice in choices)
            raise self.error(key, f"expected {expected}, got {value!r}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        values = self.get(key, "an array of strings", lambda v: isinstance(v, list | tuple))
        for index, value in enumerate(values):
            if not isinstance(value, str):
                raise self.error(f"{key}[{index}]", f"expected a string, got {kind_of(value)}")
            if not value.strip():
                raise self.error(f"{key}[{index}]", "must not be empty")
        return tuple(values)

    def name(self, key: str) -> str:
        """A name stored in a 200-character column: a task's name, or its handler's."""
        value = self.text(key)
        problem = name_problem(value)
        if problem is not None:
            raise self.error(key, problem)
        return value
