"""Prometheus metrics, from the official ``prometheus-client`` (``rerun-scheduler[metrics]``).

Their names and labels: docs/reference/metrics.md. The worker serves them at ``/metrics`` on
``[metrics] port``; a host application or the dashboard mounts :func:`asgi_app`. Importing
this module needs the extra. The implementation is ``scheduler/_observe/metrics.py``.
"""

from __future__ import annotations

from ._observe.metrics import (
    DECISIONS,
    JOB_BUCKETS,
    LATENESS_BUCKETS,
    OUTCOMES,
    TICK_BUCKETS,
    WAIT_BUCKETS,
    WORKER_UP_SECONDS,
    DatabaseCollector,
    Metrics,
    MetricsHost,
    MetricsServer,
    RunTimes,
    TickHistogram,
    asgi_app,
    le,
    metrics_for,
    serve,
)

__all__ = [
    "DECISIONS",
    "JOB_BUCKETS",
    "LATENESS_BUCKETS",
    "OUTCOMES",
    "TICK_BUCKETS",
    "WAIT_BUCKETS",
    "WORKER_UP_SECONDS",
    "DatabaseCollector",
    "Metrics",
    "MetricsHost",
    "MetricsServer",
    "RunTimes",
    "TickHistogram",
    "asgi_app",
    "le",
    "metrics_for",
    "serve",
]
