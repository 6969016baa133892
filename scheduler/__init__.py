"""A recurring-task scheduler with rerun-in-place, on a durable SQL job queue.

The public names are imported when first used (``from scheduler import Scheduler`` imports
SQLAlchemy then), so that ``import scheduler.cli`` and ``scheduler --help`` stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import signals
    from ._app import Scheduler, default_registry
    from ._config import AppConfig, load_config
    from ._errors import (
        Cancelled,
        ConfigError,
        JobStateError,
        LeaseLost,
        PayloadError,
        PermanentError,
        SchedulerError,
        SchemaOutdated,
        Snooze,
        UnknownHandlerWarning,
        UnknownRow,
    )
    from ._model.job import Job
    from ._model.limits import Limit
    from ._model.report import TickReport
    from ._model.rows import SyncPlan, TaskRow, TaskSpec
    from ._ops.backfill import BackfillResult
    from ._store.audit import AuditEntry
    from ._worker.runner import RunningJob, current_job

    __version__: str

#: Where each public name is defined (imported at its first use).
_WHERE = {
    "AppConfig": "._config",
    "AuditEntry": "._store.audit",
    "BackfillResult": "._ops.backfill",
    "Cancelled": "._errors",
    "ConfigError": "._errors",
    "Job": "._model.job",
    "JobStateError": "._errors",
    "LeaseLost": "._errors",
    "Limit": "._model.limits",
    "PayloadError": "._errors",
    "PermanentError": "._errors",
    "RunningJob": "._worker.runner",
    "Scheduler": "._app",
    "SchedulerError": "._errors",
    "SchemaOutdated": "._errors",
    "Snooze": "._errors",
    "SyncPlan": "._model.rows",
    "TaskRow": "._model.rows",
    "TaskSpec": "._model.rows",
    "TickReport": "._model.report",
    "UnknownHandlerWarning": "._errors",
    "UnknownRow": "._errors",
    "current_job": "._worker.runner",
    "default_registry": "._app",
    "load_config": "._config",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rerun-scheduler")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0.0.0"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name == "signals":
        value = importlib.import_module(".signals", __name__)
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AppConfig",
    "AuditEntry",
    "BackfillResult",
    "Cancelled",
    "ConfigError",
    "Job",
    "JobStateError",
    "LeaseLost",
    "Limit",
    "PayloadError",
    "PermanentError",
    "RunningJob",
    "Scheduler",
    "SchedulerError",
    "SchemaOutdated",
    "Snooze",
    "SyncPlan",
    "TaskRow",
    "TaskSpec",
    "TickReport",
    "UnknownHandlerWarning",
    "UnknownRow",
    "__version__",
    "current_job",
    "default_registry",
    "load_config",
    "signals",
]
