"""A recurring-task scheduler with rerun-in-place, on a durable SQL job queue."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from . import signals
from ._app import Scheduler, default_registry
from ._backfill import BackfillResult
from ._config import AppConfig, TaskSpec, load_config
from ._errors import (
    ConfigError,
    LeaseLost,
    PayloadError,
    PermanentError,
    SchedulerError,
    SchemaOutdated,
    UnknownRow,
)
from ._runner import RunningJob, current_job
from ._store.audit import AuditEntry
from ._store.jobs import Job, JobStateError
from ._store.rows import SyncPlan, TaskRow
from ._tick import TickReport

try:
    __version__ = version("scheduler")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

__all__ = [
    "AppConfig",
    "AuditEntry",
    "BackfillResult",
    "ConfigError",
    "Job",
    "JobStateError",
    "LeaseLost",
    "PayloadError",
    "PermanentError",
    "RunningJob",
    "Scheduler",
    "SchedulerError",
    "SchemaOutdated",
    "SyncPlan",
    "TaskRow",
    "TaskSpec",
    "TickReport",
    "UnknownRow",
    "__version__",
    "current_job",
    "default_registry",
    "load_config",
    "signals",
]
