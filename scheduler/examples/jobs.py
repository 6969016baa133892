"""Example handlers for ``app.example.toml``, and a ``row_disabled`` alert receiver.

The worker imports this module because the file lists it in ``[worker] imports``. Handlers are
registered in ``scheduler.default_registry``, the registry ``Scheduler.from_toml`` uses, so the
worker finds them by name. (A module may instead build its own ``app = Scheduler.from_toml(...)``
and decorate with ``@app.handler``: without a ``registry`` argument that lands in the same
default registry.)

* ``examples.succeed`` logs a line and succeeds.
* ``examples.fail`` always raises :class:`UpstreamUnavailable` (code ``upstream_unavailable``).
  It is retry-safe with ``max_attempts=1``, so a failure aborts the job at once with that code;
  the tick then reruns the same job in place on the next slot, and after the row's
  ``max_consecutive_failures`` disables the row, which sends ``row_disabled``.
  (Were it not retry-safe, a raise would also abort at once, but the job's stored code would be
  ``abandoned`` and the real code only in the run history.)
* ``examples.report`` logs a line with its payload's ``region``.
* :func:`alert` receives ``row_disabled`` and logs an ``ALERT:`` line. It is a module-level
  function: blinker holds receivers by weak reference, so a lambda or a closure connected
  inside a function would be collected and never called.
"""

from __future__ import annotations

import logging
from typing import Any

from scheduler import default_registry, signals

log = logging.getLogger(__name__)


class UpstreamUnavailable(RuntimeError):
    """The upstream service did not answer."""

    code = "upstream_unavailable"  # stored as the job's error code (the message is only logged)


@default_registry.handler("examples.succeed", retry_safe=True)
def succeed(job: Any) -> None:
    log.info("%s: job %s ran, attempt %s", job.task_name or job.handler, job.id, job.attempt)


@default_registry.handler("examples.fail", retry_safe=True, max_attempts=1)
def fail(job: Any) -> None:
    target = job.payload.get("target", "upstream")
    raise UpstreamUnavailable(f"{target} did not answer (job {job.id})")


@default_registry.handler("examples.report", retry_safe=True, max_attempts=3)
def report(job: Any) -> None:
    log.info("report for region %s: job %s", job.payload.get("region", "-"), job.id)


@signals.row_disabled.connect
def alert(sender: str, **kw: Any) -> None:
    log.error(
        "ALERT: task %r disabled after %s consecutive failures (last error %s)",
        sender,
        kw.get("consecutive_failures"),
        kw.get("last_error_code"),
    )
