"""This process's workers: each one's :class:`Waiter`, and the wake-ups that reach them
directly, after this process's own commits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime

from ._common import Wake

COOLDOWN_SECONDS = 0.01  # announcements wake one worker at most once per this (then coalesce)


class Waiter:
    """One worker's side: the event its claim loop waits on, set when a job of one of its
    queues is ready (or, for a later ``run_at`` it heard of, when that instant comes).

    Announcements wake the worker at once, then at most once per :data:`COOLDOWN_SECONDS`:
    those that arrive meanwhile are one wake-up at the end of it (a burst of enqueues is a
    claim per cooldown, not one per enqueue). A finished job still wakes it at once (the
    worker sets its event itself)."""

    def __init__(
        self,
        event: threading.Event,
        queues: Iterable[str],
        clock: Callable[[], datetime],
        has_free: Callable[[], bool] = lambda: True,
    ) -> None:
        self.event = event
        self.queues = frozenset(queues)
        self.clock = clock
        self.has_free = has_free
        self.freed = threading.Event()  # set by the worker when a slot frees
        self.wakes = 0  # wake-ups delivered to the worker (tests, benchmarks)
        self.heard = 0  # announcements heard (several may make one wake-up)
        self._woken = float("-inf")  # time.monotonic() of the last wake-up
        self._trailing: float | None = None  # a wake-up held back by the cooldown, due then
        self._deadline: float | None = None  # time.monotonic() of the earliest later run_at
        self._timer = threading.Condition()
        self._timing: threading.Thread | None = None
        self._closed = False

    def notice(self, queue: str, at: float | None) -> bool:
        """A job of ``queue`` is ready (``at`` None) or will be at epoch ``at``; True if this
        worker takes ``queue`` (woken, or its timer set)."""
        if queue not in self.queues and queue != "*":
            return False
        delay = 0.0 if at is None else at - self.clock().timestamp()
        if delay <= 0:
            self.wake()
            return True
        due = time.monotonic() + delay + 0.002  # the claim compares run_at <= now
        with self._timer:
            if self._deadline is None or due < self._deadline:
                self._deadline = due
                self._arm()
        return True

    def wake(self) -> None:
        """A job is ready: wake the worker now, or at the end of the cooldown."""
        with self._timer:
            self.heard += 1
            now = time.monotonic()
            if now - self._woken >= COOLDOWN_SECONDS:
                self._wake(now)
            elif self._trailing is None:
                self._trailing = self._woken + COOLDOWN_SECONDS
                self._arm()

    def _wake(self, now: float) -> None:
        self._woken = now
        self._trailing = None
        self.wakes += 1
        self.event.set()

    def _arm(self) -> None:
        """(Under ``_timer``.) Start the timer thread, or tell it of an earlier instant."""
        if self._closed:
            return
        if self._timing is None:
            self._timing = threading.Thread(
                target=self._time, name="scheduler-wake-timer", daemon=True
            )
            self._timing.start()
        self._timer.notify()

    def _time(self) -> None:
        """The timer: the wake-ups held back by the cooldown, and the earliest later
        ``run_at`` heard of."""
        with self._timer:
            while not self._closed:
                due = [t for t in (self._trailing, self._deadline) if t is not None]
                if not due:
                    self._timer.wait()
                    continue
                now = time.monotonic()
                if min(due) > now:
                    self._timer.wait(min(due) - now)
                    continue
                if self._deadline is not None and self._deadline <= now:
                    self._deadline = None
                self._wake(now)

    def close(self) -> None:
        with self._timer:
            self._closed = True
            self._timer.notify()


local_waiters: dict[str, list[Waiter]] = {}
local_lock = threading.Lock()


def wake_local(key: str, wake: Wake) -> None:
    """Wake this process's workers on database ``key``: for jobs ready now, up to one per job
    (those with a free slot first); for later ones, every worker of the queue sets its timer."""
    waiters = local_waiters.get(key)
    if not waiters:
        return
    for queue, count in wake.now.items():
        takers = [w for w in waiters if queue in w.queues]
        takers.sort(key=lambda w: not w.has_free())
        for waiter in takers[:count]:
            waiter.wake()
    for queue, at in wake.later.items():
        for waiter in waiters:
            waiter.notice(queue, at)
