"""``isolation = "process"``: one attempt of a handler in a child process that can be killed.

The child is started with multiprocessing's ``forkserver`` method: a single-threaded server
process (started at the first such attempt, importing the worker's main module once) forks
each child, which imports the handler's module by name and calls the module-level function.
Not ``fork`` of the worker itself: the worker has threads (the heartbeat, the tick, the job
threads) and pooled database connections, and a child forked from it would inherit their
locks and sockets mid-use. Not ``spawn``: a fresh interpreter per attempt re-imports the main
module each time (measured about 1.5x slower in ``benchmarks/isolation.py``). The server
imports the scheduler and the process-isolated handlers' modules before it forks anything
(:func:`preload`, before the first child), so a child starts with them imported: a module's
import-time work (a connection pool made at import, say) is done once in the server and
inherited, as with any pre-forking server. The child never
touches the database (the worker renews the job's lease while it runs, and writes its
outcome), so it works alike on SQLite, PostgreSQL and MariaDB. Starting a child costs
about 10 ms per attempt (more when the worker's main module imports much that is not the
scheduler's or the handlers'): process isolation is for jobs that run for a second or more.

Inside, the handler gets a :class:`ChildJob` with the job API of a thread's handler:
``payload``, ``slot``, ``attempt``, ``heartbeat()``, ``cancel_requested`` and ``check()``.
When the worker stops the attempt (its timeout, an operator's cancel) the child is sent
SIGTERM: its handler raises :class:`~scheduler.Cancelled` where the code is (a pure-Python
loop stops at once; ``job.cancel_requested`` is then true). A child still alive
``cancel_grace`` seconds later (it ignores SIGTERM, or is blocked in C code that does not
return) is killed with SIGKILL. The handler's exception, if any, is sent back and raised in the
worker, so an attempt's outcome (retry, abort, snooze, permanent error) is decided as for a
thread.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import Cancelled
from . import _server_path

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from .._model.handlers import Handler


class Stopped(Protocol):
    """What :func:`call` reads of the attempt's stop (``runner.Stop``)."""

    requested: bool


POLL_SECONDS = 0.02  # how often the worker's thread looks at the child and the stop
EXIT_WAIT_SECONDS = 5.0  # a child that answered: how long to wait for it to exit


class ChildJob:
    """The job a process-isolated handler receives (the API of a thread's job)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.id: int = fields["id"]
        self.handler: str = fields["handler"]
        self.payload: dict[str, Any] = fields["payload"]
        self.attempt: int = fields["attempt"]
        self.max_attempts: int = fields["max_attempts"]
        self.task_name: str | None = fields["task_name"]
        self.queue: str = fields["queue"]
        self.tenant: str | None = fields["tenant"]
        self.slot: datetime | None = fields["slot"]
        self._stopping = False

    @property
    def cancel_requested(self) -> bool:
        """True once the worker asked this attempt to stop (SIGTERM)."""
        return self._stopping

    def check(self) -> None:
        """Raise :class:`~scheduler.Cancelled` if this attempt was asked to stop."""
        if self._stopping:
            raise Cancelled()

    def heartbeat(self) -> None:
        """Nothing to do: the worker renews the lease while the child runs."""

    async def heartbeat_async(self) -> None:
        """Nothing to do, as :meth:`heartbeat`."""

    def __repr__(self) -> str:
        return f"<job {self.id} {self.handler} attempt {self.attempt}/{self.max_attempts}>"


def where(handler: Handler) -> tuple[str, str]:
    """The module and name a child imports the handler from; ``ValueError`` for a function
    that no module holds (defined inside another function, a lambda)."""
    module = getattr(handler.func, "__module__", None)
    name = getattr(handler.func, "__qualname__", "")
    if not module or not name or "<" in name:
        raise ValueError(
            f"handler {handler.name[:40]!r}: isolation 'process' needs a function defined at"
            f" the top level of an importable module, got {name or handler.func!r}"
        )
    return module, name


def call(handler: Handler, running: Any, stop: Stopped | None, grace: float) -> None:
    """Run ``handler`` on ``running``'s job (a ``RunningJob``) in a child process; return
    when it returned, raise what it raised. Stopped: SIGTERM, then SIGKILL after ``grace``
    seconds, and :class:`~scheduler.Cancelled` here."""
    module, name = where(handler)
    fields = {
        key: getattr(running, key)
        for key in (
            "id",
            "handler",
            "payload",
            "attempt",
            "max_attempts",
            "task_name",
            "queue",
            "tenant",
            "slot",
        )
    }
    context = multiprocessing.get_context("forkserver")  # told what to import: preload()
    receiving, sending = context.Pipe(duplex=False)
    child = context.Process(
        target=_child,
        args=(module, name, fields, sending),
        name=f"scheduler-job-{running.id}",
        daemon=True,
    )
    child.start()
    sending.close()  # the child's end: the parent sees EOF when the child dies
    termed_at: float | None = None
    try:
        while True:
            if receiving.poll(POLL_SECONDS):
                try:
                    kind, value = receiving.recv()
                except EOFError:  # it died without an answer (killed, or os._exit)
                    child.join()
                    break
                child.join(EXIT_WAIT_SECONDS)
                if kind == "ok":
                    return
                raise value
            if stop is not None and stop.requested and termed_at is None:
                termed_at = time.monotonic()
                _signal(child.pid, signal.SIGTERM)
            if termed_at is not None and time.monotonic() >= termed_at + grace:
                child.kill()
                child.join()
                raise Cancelled()
            if not child.is_alive() and not receiving.poll(0):
                child.join()
                break
    finally:
        receiving.close()
        if child.is_alive():  # an exception on our side: leave no child behind
            child.kill()
            child.join()
    if stop is not None and stop.requested:
        raise Cancelled()
    raise ChildProcessError(
        f"the process of handler {handler.name!r} exited with code {child.exitcode}"
        " without an outcome"
    )


_PRELOAD_LOCK = threading.Lock()
_preloaded: list[str] = []


def preload(modules: Iterable[str]) -> None:
    """Have the fork server import ``modules`` (the process-isolated handlers' own) and the
    scheduler's modules this process has imported, when it starts: every child is then forked
    with them imported instead of importing them itself at each attempt. A child still runs
    the worker's main module (multiprocessing's rule, for targets defined there); for
    ``scheduler worker`` that module only imports ``scheduler.cli``, found imported. Measured:
    a child's start from about 300 ms to about 7 ms (docs/performance.md). Only a server not
    yet started takes the list; a module that fails to import there is imported by the
    child, as before."""
    with _PRELOAD_LOCK:
        for module in modules:
            if module not in _preloaded:
                _preloaded.append(module)
        ours = sorted(name for name in sys.modules if name.split(".")[0] == "scheduler")
        os.environ[_server_path.VARIABLE] = json.dumps(sys.path)  # the server's environment
        multiprocessing.get_context("forkserver").set_forkserver_preload(
            [_server_path.__name__, "__main__", *ours, *_preloaded]
        )


def start_server() -> None:
    """Start the fork server now and wait until it has imported what :func:`preload` listed
    (one child that does nothing: the server forks only once its imports are done), rather
    than at the first attempt: a worker's start-up calls it, so no attempt's time, and no
    timeout, includes those imports."""
    child = multiprocessing.get_context("forkserver").Process(target=_nothing, daemon=True)
    child.start()
    child.join()


def _nothing() -> None:
    """The child :func:`start_server` waits for."""


def _signal(pid: int | None, signum: int) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # it just ended
        pass


def _child(module: str, name: str, fields: dict[str, Any], sending: Connection) -> None:
    """The child's main: import the handler, run it, send ("ok", None) or ("error", exc)."""
    job = ChildJob(fields)

    def on_term(signum: int, frame: Any) -> None:
        job._stopping = True
        raise Cancelled()

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when a child stops
    signal.signal(signal.SIGTERM, on_term)
    try:
        func: Any = importlib.import_module(module)
        for part in name.split("."):
            func = getattr(func, part)
        func(job)
    except BaseException as exc:
        _send(sending, ("error", exc))
    else:
        _send(sending, ("ok", None))
    finally:
        sending.close()


def _send(sending: Connection, message: tuple[str, Any]) -> None:
    try:
        pickled = pickle.dumps(message)
    except Exception:  # an exception that does not pickle: its type and text, as a failure
        exc = message[1]
        pickled = pickle.dumps(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
    try:
        sending.send_bytes(pickled)
    except (BrokenPipeError, OSError):  # the worker is gone: nobody to tell
        pass
