"""Handler registration: what a job's ``handler`` name runs, and how safely it can rerun."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
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

    ``func`` may be an ``async def`` function (``is_async``): the worker runs it on its event
    loop, ``app.work()`` on a loop of its own.
    """

    name: str
    func: HandlerFunc
    retry_safe: bool = False
    max_attempts: int = 3
    abandoned: AbandonedHook | None = None
    queue: str = "default"
    is_async: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", is_async_callable(self.func))


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
    ) -> Callable[[F], F]:
        """Register the decorated callable as ``name`` (as ``Scheduler.handler`` does)."""

        def register(func: F) -> F:
            self.add(Handler(name, func, retry_safe, max_attempts, abandoned, queue))
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
