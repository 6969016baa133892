"""What the worker tells the outside world: Prometheus metrics, when ``[metrics] port`` is set,
and OpenTelemetry spans, when the application configured OpenTelemetry (see _tracing.py).

The worker makes one :class:`Telemetry` and calls it where things happen (a tick, a handler
run); with metrics off, ``prometheus_client`` is never imported, and the calls do nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from .._observe import tracing as _tracing

if TYPE_CHECKING:
    from .._model.job import Job
    from .._model.report import TickReport
    from .._observe.metrics import Metrics
    from .host import Host

log = logging.getLogger(__name__)


class Telemetry:
    """The worker's hooks; :meth:`open` starts serving, :meth:`close` stops."""

    def __init__(self, app: Host) -> None:
        self.app = app
        self.metrics: Metrics | None = None
        self._server: Any = None

    def open(self) -> None:
        settings = self.app.metrics_settings
        if not settings.port:
            return
        where = f"{self.app.config_path or '<config>'}: [metrics]: key 'port'"
        try:
            from .._observe import metrics
        except ImportError as exc:
            raise ConfigError(
                f"{where}: metrics need prometheus-client ({exc}):"
                " pip install 'rerun-scheduler[metrics]'"
            ) from None
        self.metrics = metrics.metrics_for(self.app)
        self.metrics.known_handlers()  # the worker imported its handlers by now
        try:
            self._server = metrics.serve(self.app)
        except OSError as exc:
            raise ConfigError(
                f"{where}: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
            ) from None

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None

    def ticked(self, seconds: float, report: TickReport) -> None:
        if self.metrics is not None:
            self.metrics.ticked(seconds, report)

    def quiet(self) -> bool:
        """Nothing observes a handler's run (no metrics, no OpenTelemetry tracer): the worker
        skips :meth:`running` (two context managers per job)."""
        return self.metrics is None and not _tracing.configured()

    @contextlib.contextmanager
    def running(self, job: Job) -> Iterator[_tracing.Running]:
        """Around one attempt's handler call: its span (tell it how the attempt ended with
        ``ended``) and its run time and queue wait."""
        with _tracing.run_span(job) as span:
            if self.metrics is None:
                yield span
                return
            started, began = self.app.clock(), time.monotonic()
            try:
                yield span
            finally:
                self.metrics.ran(job, started, time.monotonic() - began)
