"""Helpers for testing your own tasks, handlers and signal receivers.

``capture_signals`` records what the scheduler announced; ``drive`` runs ticks and jobs through
a range of simulated time, without sleeping, so a test can watch a week of a cron schedule (a
daylight-saving change included) in a fraction of a second::

    from datetime import UTC, datetime, timedelta
    from scheduler import Scheduler, signals
    from scheduler.testing import capture_signals, drive

    app = Scheduler("sqlite:///test.db")
    ...  # migrate, register handlers, sync
    with capture_signals(signals.row_disabled) as records:
        result = drive(app, datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 2, tzinfo=UTC))
    assert result.times("nightly-report") == [datetime(2030, 1, 1, 3, tzinfo=UTC)]
    assert records == []
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from blinker import NamedSignal

from . import signals as _signals
from ._model.report import Outcome, TickReport
from ._model.time import as_utc
from ._store.due import next_event

if TYPE_CHECKING:
    from ._app import Scheduler

__all__ = ["DriveReport", "ManualClock", "SignalRecord", "Step", "capture_signals", "drive"]

ALL_SIGNALS: tuple[NamedSignal, ...] = (
    _signals.row_disabled,
    _signals.job_dispatched,
    _signals.job_rerun,
    _signals.job_succeeded,
    _signals.job_failed,
    _signals.job_aborted,
    _signals.job_abandoned,
)


class SignalRecord(NamedTuple):
    """One signal as a receiver saw it: its name (``"row-disabled"``), sender and keywords."""

    signal: str
    sender: Any
    kwargs: dict[str, Any]


@contextmanager
def capture_signals(*signals: NamedSignal) -> Iterator[list[SignalRecord]]:
    """Record every send of ``signals`` (default: all of ours) while the block runs.

    Yields a list that fills up as signals are sent, in order. The receivers are held by strong
    references (blinker's ``connected_to``) and disconnected when the block exits.
    """
    records: list[SignalRecord] = []

    def recorder(signal: NamedSignal) -> Any:
        def receive(sender: Any, **kwargs: Any) -> None:
            records.append(SignalRecord(signal.name, sender, kwargs))

        return receive

    with ExitStack() as stack:
        for signal in signals or ALL_SIGNALS:
            stack.enter_context(signal.connected_to(recorder(signal)))
        yield records


class ManualClock:
    """A clock that only moves when told to: pass it as ``Scheduler(clock=...)``."""

    def __init__(self, now: datetime) -> None:
        self.now = as_utc(now)

    def __call__(self) -> datetime:
        return self.now

    def set(self, now: datetime) -> datetime:
        """Jump to ``now`` (aware); returns it as UTC."""
        self.now = as_utc(now)
        return self.now

    def advance(self, delta: timedelta | None = None, **units: float) -> datetime:
        """Move forward by ``delta`` or ``timedelta(**units)``; returns the new time."""
        self.now = self.now + (delta if delta is not None else timedelta(**units))
        return self.now


class Step(NamedTuple):
    """One round of ``drive``: the simulated instant, the tick's report, jobs handled."""

    now: datetime
    report: TickReport
    jobs_run: int


@dataclass
class DriveReport:
    """What ``drive`` did: every round, and their tick reports combined."""

    steps: list[Step] = field(default_factory=list)
    report: TickReport = field(default_factory=TickReport)
    jobs_run: int = 0

    def add(self, step: Step) -> None:
        self.steps.append(step)
        for outcome, names in step.report.as_dict().items():
            getattr(self.report, outcome).extend(names)
        self.jobs_run += step.jobs_run

    def times(self, name: str, *outcomes: str) -> list[datetime]:
        """The instants at which row ``name`` had one of ``outcomes`` (default: it started a
        run, i.e. ``dispatched`` or ``rerun``)."""
        wanted = outcomes or (Outcome.DISPATCHED, Outcome.RERUN)
        return [
            step.now
            for step in self.steps
            for outcome in wanted
            if name in getattr(step.report, outcome)
        ]


def _next_event(app: Scheduler, after: datetime) -> datetime | None:
    """The earliest instant after ``after`` at which a tick or a worker has something to do."""
    found: list[datetime] = []
    for shard in app.shards:  # (one shard: the database's own tables)
        with shard.store.read() as conn:
            event = next_event(conn, after)
        if event is not None:
            found.append(event)
    return min(found, default=None)


def drive(
    app: Scheduler,
    start: datetime,
    stop: datetime,
    step: timedelta | None = None,
    *,
    work: bool = True,
    max_rounds: int = 20,
) -> DriveReport:
    """Tick (and run the ready jobs) at simulated instants from ``start`` to ``stop`` inclusive.

    With ``step`` the instants are ``start``, ``start + step`` ...; without it ``drive`` jumps
    straight to the next instant something is due (a row's ``next_run_at``, a retry's
    ``run_at``, a lease's expiry). At each instant it ticks with ``now=`` and then, unless
    ``work=False``, runs the ready jobs with ``app.clock`` reading that instant. When rows were
    held back and jobs ran, it ticks and works again at the same instant (at most
    ``max_rounds`` rounds): like a worker that ticks often, a row held back behind a job that
    just ended fires at once. ``app.clock`` is restored afterwards. Nothing sleeps.
    """
    now, stop = as_utc(start), as_utc(stop)
    if step is not None and step <= timedelta(0):
        raise ValueError("step must be positive")
    result = DriveReport()
    saved = app.clock
    app.clock = lambda: now
    try:
        while now <= stop:
            for _ in range(max_rounds):
                report = app.tick(now=now)
                ran = app.work() if work else 0
                result.add(Step(now, report, ran))
                if not (ran and report.held_back):  # only a held-back row can fire again
                    break
            if step is not None:
                now = now + step
                continue
            following = _next_event(app, now)
            if following is None:
                break
            now = following
    finally:
        app.clock = saved
    return result
