"""What the worker needs of the application: :class:`Host`, which the ``Scheduler`` is.

The worker, the background worker and the worker's telemetry are typed against this, not
against the facade, so the facade can import them without the worker importing it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from datetime import datetime

    from .._config import MetricsSettings, SchedulerSettings, WorkerSettings
    from .._model.handlers import Registry
    from .._model.job import RecordedHook
    from .._model.limits import LimitSet
    from .._model.report import TickReport
    from .._model.time import Clock
    from .._store import Store
    from .._store.handlers import Known
    from .runner import Runner


class Host(Protocol):
    """An application the worker runs for (``scheduler.Scheduler``)."""

    store: Store
    registry: Registry
    clock: Clock
    worker_id: str
    settings: SchedulerSettings
    worker_settings: WorkerSettings
    metrics_settings: MetricsSettings
    config_path: str | None
    recorded_hooks: list[RecordedHook]
    known_handlers: Known
    shard_index: int | None
    """This one's shard, when it is one shard of several (else None)."""

    @property
    def shards(self) -> tuple[Host, ...]:
        """The shards (``[database] shards``); just this one when there is one."""
        ...

    def clock_offset(self) -> float | None:
        """The database's clock minus this host's, in seconds (None when not measured)."""
        ...

    def check_schema(self) -> None:
        """Raise ``SchemaOutdated`` unless the schema is current."""
        ...

    def limit_set(self, *, check: bool = True) -> LimitSet:
        """The limits every worker shares, with the handlers registered naming them."""
        ...

    def runner(self, settings: WorkerSettings | None = None) -> Runner:
        """A runner of jobs with these ``[worker]`` settings."""
        ...

    def tick(self, now: datetime | None = None, *, record: bool = True) -> TickReport:
        """One tick (the worker records its ticks itself: ``record=False``)."""
        ...

    def purge(self) -> int:
        """Delete what is past retention; how many jobs."""
        ...

    def deliver_pending_alerts(self, older_than: float = 30.0) -> int:
        """Deliver the alerts a crash left undelivered; how many."""
        ...
