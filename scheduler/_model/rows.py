"""A task as declared, as stored, and as the tick reads it; what a sync changes.

- :class:`TaskSpec`: one recurring task as declared (``[[tasks]]`` in the file, or Python);
- :class:`TaskRow`: the read-only view of a scheduler row;
- :class:`DueRow`: a due row as the tick's one read returns it, with its last job's state;
- :class:`SyncPlan`: what a sync does, row names per action.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple


@dataclass(frozen=True)
class TaskSpec:
    """One recurring task as declared in ``[[tasks]]``, with the file's defaults.

    ``timezone`` None means the Scheduler's ``[scheduler] timezone`` (UTC unless set), as
    for a task in the file without one; ``Scheduler.sync`` fills it in.
    """

    name: str
    cron: str
    handler: str
    payload: dict[str, Any] = field(default_factory=dict)
    timezone: str | None = None
    concurrent: bool = False
    max_consecutive_failures: int | None = None  # None: use [scheduler]'s; 0 = unlimited
    enabled: bool = True
    overlap: str = "hold"
    """While the last job is in flight: "hold" (the default), "skip", "allow" or "replace".
    ``concurrent=True`` is its alias: it makes the default "allow" (and another value beside
    it is refused by ``sync``, as in the file); None is taken as the default."""
    catchup_window: int = 0
    """Seconds a slot may be late before it is missed instead of run; 0: unlimited."""
    jitter: int = 0
    """Each slot fires at a deterministic delay in [0, jitter) seconds; 0: none."""

    def __post_init__(self) -> None:
        if self.overlap is None or (self.concurrent and self.overlap == "hold"):
            object.__setattr__(self, "overlap", "allow" if self.concurrent else "hold")

    @property
    def policy(self) -> str:
        """The overlap policy in force (``overlap``; kept for older callers)."""
        return self.overlap

    tenant: str | None = None  # whose task: its jobs carry it (``job.tenant``)
    group: str | None = None
    """The group of a task created at runtime (``put_task``, ``put_tasks(group=...)``): at most
    200 characters; a task of the file has none."""
    recovery: str = "manual"
    """After the failure limit disables the row: "manual" (it stays off until ``enable``) or
    "probe" (a probe runs after each of ``probe_intervals``; the first success re-enables it)."""
    probe_intervals: tuple[float, ...] = (900.0, 3600.0, 14400.0)
    """Seconds before each probe (``recovery = "probe"``); the last one repeats."""
    timeout: float | None = None
    """Seconds one attempt of the task's jobs may run, over its handler's ``timeout``; None:
    the handler's; 0: no limit."""


@dataclass(frozen=True)
class TaskRow:
    """A read-only view of a scheduler row."""

    name: str
    handler: str
    payload: dict[str, Any]
    cron: str
    timezone: str
    concurrent: bool
    enabled: bool
    next_run_at: datetime | None
    last_job_id: int | None
    last_job_state: str | None
    consecutive_failures: int
    max_consecutive_failures: int | None
    disabled_reason: str | None
    disabled_at: datetime | None
    version: int
    last_error_code: str | None = None
    """The stable error code of the row's last job (None while it has not failed)."""
    overlap: str = "hold"
    """While the last job is in flight: hold, skip, allow or replace (``concurrent`` is allow)."""
    catchup_window: int = 0
    """Seconds a slot may be late before it is missed; 0: unlimited."""
    jitter: int = 0
    """Seconds of deterministic delay range per slot; 0: none."""
    disabled_note: str | None = None
    """The operator's words with a disable (``disable --reason``); cleared by ``enable``."""
    tenant: str | None = None
    """Whose task it is: its jobs carry it."""
    source: str = "file"
    """Who owns the row: ``file`` (the TOML file, ``sync``) or ``api`` (``put_task``)."""
    group: str | None = None
    """An ``api`` row's group (``put_tasks(group=...)``)."""
    recovery: str = "manual"
    """``manual`` or ``probe`` (probes after a disable by the failure limit)."""
    probe_at: datetime | None = None
    """While a disabled row is probing: when its next probe runs (None: not probing)."""
    probes: int = 0
    """The probes run since the failure limit disabled the row."""
    probe_intervals: tuple[float, ...] = (900.0, 3600.0, 14400.0)
    """Seconds before each probe (``recovery = "probe"``); the last one repeats."""
    timeout: float | None = None
    """Seconds one attempt of its jobs may run (over the handler's); None: the handler's."""


@dataclass
class SyncPlan:
    """What ``sync`` does (or, on a dry run, would do): row names per action."""

    insert: list[str] = field(default_factory=list)
    update: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    disable: list[str] = field(default_factory=list)
    paused: list[tuple[str, datetime, str]] = field(default_factory=list)
    """(row, slot, reason) of the slots that passed while a row the file re-enables was
    disabled: logged as ``paused``; ``Scheduler.sync`` sends ``slot_skipped`` for each."""
    remove: list[str] = field(default_factory=list)
    """The rows removed (``put_tasks(group=..., replace=True)``: the group's rows not given);
    a sync never removes a row, it disables it."""
    changes: list[TaskChange] = field(default_factory=list, repr=False, compare=False)
    """Each changed task's change, with its fires before and after (a dry run's preview)."""

    def as_dict(self) -> dict[str, list[str]]:
        found = {
            "insert": self.insert,
            "update": self.update,
            "unchanged": self.unchanged,
            "disable": self.disable,
        }
        if self.remove:
            found["remove"] = self.remove
        return found


CREATED, UPDATED, UNCHANGED = "created", "updated", "unchanged"


@dataclass(frozen=True)
class TaskChange:
    """What ``put_task`` did to one task (or, on a dry run, would do)."""

    action: str
    """``created``, ``updated`` or ``unchanged``."""
    row: TaskRow | None
    """The row after the change (as it would be, on a dry run; None for a removal)."""
    fires_before: tuple[datetime, ...] = ()
    """The next fires (aware UTC) of the schedule before the change; empty for a new row."""
    fires_after: tuple[datetime, ...] = ()
    """The next fires (aware UTC) of the schedule after it."""
    name: str = ""
    changed: tuple[str, ...] = ()
    """The keys that changed (``cron``, ``payload``, ``enabled`` ...), for an update."""


class DueRow(NamedTuple):
    """One due scheduler row as the due query read it, with its last job's state."""

    id: int
    name: str
    handler: str
    payload: str
    """The stored payload text, copied as it is into the job the row dispatches."""
    cron: str
    timezone: str
    concurrent: bool
    next_run_at: datetime
    """The slot being served (the row's ``next_run_at`` when read)."""
    last_job_id: int | None
    consecutive_failures: int
    max_consecutive_failures: int | None
    version: int
    """The compare-and-swap token: every write to the row bumps it."""
    job_state: str | None
    """The last job's state (a :class:`~scheduler._model.rules.JobState` value), None if none."""
    job_error: str | None
    """The last job's ``last_error_code``."""
    overlap: str = "hold"
    """The run policy for a slot while the last job is in flight: hold, skip, allow or replace."""
    catchup_window: int = 0
    """Seconds a due slot may be late before it is missed instead of run; 0: unlimited."""
    jitter: int = 0
    """Seconds of deterministic delay range added to each slot; 0: none."""
    held_slot: datetime | None = None
    """The slot whose ``held_back`` entry is already in the decision log."""
    tenant: str | None = None
    """The row's tenant, copied into the jobs it dispatches (and reruns)."""


Position = tuple[datetime, int]
"""Where a batch ended, in due order: (``next_run_at``, id)."""


UNFORMED = ("timeout", "recovery", "probe_intervals")
"""A task's settings that the editing forms (the dashboard's, Django's admin, ``tasks put``'s
options) have no field for."""


def unformed(row: TaskRow | None) -> dict[str, Any]:
    """``row``'s :data:`UNFORMED` settings, for an edit to keep them (none for a new task: the
    spec's defaults)."""
    return {} if row is None else {key: getattr(row, key) for key in UNFORMED}
