"""Handler registration: what a job's ``handler`` name runs, and how safely it can rerun."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .rules import check_text

HandlerFunc = Callable[[Any], Any]
AbandonedHook = Callable[[Any], Any]
#: ``(tenant) -> context manager`` (sync or async), entered around every run of a tenant's job.
TenantContext = Callable[[str], Any]
F = TypeVar("F", bound=Callable[..., Any])


def is_async_callable(func: Any) -> bool:
    """An ``async def`` function, a partial of one, or an object whose ``__call__`` is one."""
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


@dataclass(frozen=True)
class Handler:
    """A registered handler.

    ``retry_safe``: may this handler run again after a crash, or after it raised partway? If
    not, a job taken over from a stopped worker, or whose attempt raised, is not rerun: the
    ``abandoned`` hook runs and the job ends ``aborted`` with code ``abandoned``.

    ``timeout``: seconds one attempt may run (None: no limit). At the limit the attempt is
    asked to stop; after the worker's ``cancel_grace`` it is over anyway (code ``timeout``).

    ``func`` may be an ``async def`` function (``is_async``): the worker runs it on its event
    loop, ``app.work()`` on a loop of its own.

    ``isolation``: ``"thread"`` (the default) or ``"process"``: each attempt in a child process
    that is sent SIGTERM when the attempt is stopped and killed after ``cancel_grace``
    (``scheduler/_worker/isolation.py``); a sync function defined at a module's top level.
    """

    name: str
    func: HandlerFunc
    retry_safe: bool = False
    max_attempts: int = 3
    abandoned: AbandonedHook | None = None
    queue: str = "default"
    is_async: bool = field(default=False, compare=False)
    timeout: float | None = None
    limits: tuple[str, ...] = ()  # the names of the limits its jobs are under ([[limits]])
    isolation: str = "thread"

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", is_async_callable(self.func))
        object.__setattr__(self, "timeout", check_timeout(self.timeout, self.name))
        check_isolation(self.isolation, self.name)
        if self.isolation == "process":
            qualname = getattr(self.func, "__qualname__", "")
            if self.is_async:
                raise ValueError(
                    f"handler {self.name[:40]!r}: isolation 'process' is for sync functions,"
                    " not async def ones (cancel those with a timeout)"
                )
            if "<" in qualname or not getattr(self.func, "__module__", None):
                raise ValueError(
                    f"handler {self.name[:40]!r}: isolation 'process' needs a function defined"
                    f" at the top level of an importable module, got {qualname or self.func!r}"
                )


ISOLATIONS = ("thread", "process")


def check_isolation(value: object, handler: str) -> None:
    """A handler's ``isolation``: ``"thread"`` or ``"process"``; else ``ValueError`` naming
    the handler and the key."""
    if value not in ISOLATIONS:
        raise ValueError(
            f"handler {handler[:40]!r}: isolation must be 'thread' or 'process', got {value!r}"
        )


def check_limit_names(value: object, handler: str) -> tuple[str, ...]:
    """A handler's ``limits``: the names of limits, as a list of strings; a bad one raises
    TypeError naming the handler and the key."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(f"handler {handler[:40]!r}: limits must be a list of limit names")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise TypeError(f"handler {handler[:40]!r}: limits must be a list of limit names")
    return names


def check_timeout(value: object, handler: str) -> float | None:
    """A handler's ``timeout``: None or 0 (no limit), else a positive finite number of seconds;
    a bad one raises TypeError or ValueError naming the handler and the key."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"handler {handler[:40]!r}: timeout must be a number of seconds,"
            f" got {type(value).__name__}"
        )
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"handler {handler[:40]!r}: timeout must be a positive number of seconds"
            f" (0 for none), got {value!r}"
        )
    return float(value) or None


class Registry:
    """Handlers by name, and the tenant context factory (``@app.tenant_context``)."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self.tenant_context: TenantContext | None = None

    def add(self, handler: Handler) -> None:
        if handler.max_attempts < 1:
            raise ValueError(f"handler {handler.name!r}: max_attempts must be at least 1")
        try:  # every job it makes carries both: refuse at registration, not at the first job
            check_text(handler=handler.name, queue=handler.queue)
        except ValueError as exc:
            raise ValueError(f"handler {handler.name[:40]!r}: {exc}") from None
        self._handlers[handler.name] = handler

    def handler(
        self,
        name: str,
        *,
        retry_safe: bool = False,
        max_attempts: int = 3,
        abandoned: AbandonedHook | None = None,
        queue: str = "default",
        timeout: float | None = None,
        limits: Iterable[str] = (),
        isolation: str = "thread",
    ) -> Callable[[F], F]:
        """Register the decorated callable as ``name`` (as ``Scheduler.handler`` does)."""
        check_timeout(timeout, name)  # at the decorator's call, before any function is seen
        names = check_limit_names(limits, name)
        check_isolation(isolation, name)

        def register(func: F) -> F:
            handler = Handler(name, func, retry_safe, max_attempts, abandoned, queue)
            self.add(
                dataclasses.replace(handler, timeout=timeout, limits=names, isolation=isolation)
            )
            return func

        return register

    def set_tenant_context(self, factory: TenantContext) -> TenantContext:
        """Register ``factory`` (``(tenant) -> context manager``); returns it (a decorator)."""
        if not callable(factory):
            raise TypeError("tenant_context needs a callable: (tenant) -> context manager")
        self.tenant_context = factory
        return factory

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def settings(self) -> list[tuple[str, str, int, bool]]:
        """``(name, queue, max_attempts, retry_safe)`` of every handler, by name: what a
        worker records for the other processes."""
        return [
            (h.name, h.queue, h.max_attempts, h.retry_safe)
            for _, h in sorted(self._handlers.items())
        ]

    def process_isolated(self) -> list[Handler]:
        """The handlers registered with ``isolation = "process"``, by name."""
        return [h for _, h in sorted(self._handlers.items()) if h.isolation == "process"]

    def async_names(self) -> frozenset[str]:
        """The names of the ``async def`` handlers."""
        return frozenset(name for name, h in self._handlers.items() if h.is_async)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers


def error_code(exc: BaseException) -> str:
    """The stable code stored for a failure: ``exc.code`` if a string, else the class name."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        return code[:200]
    return type(exc).__name__
