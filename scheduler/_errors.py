"""Exceptions users may catch. Each docstring is the default message."""

from __future__ import annotations


class SchedulerError(Exception):
    """A scheduler error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(SchedulerError):
    """The configuration is invalid."""


class PayloadError(SchedulerError, ValueError):
    """The payload is not acceptable."""


class SchemaOutdated(SchedulerError):
    """The database schema is outdated: run `scheduler migrate`."""


class UnknownRow(SchedulerError, LookupError):
    """No task has that name."""


class JobStateError(SchedulerError):
    """The job is not in the state this operation needs."""


class LeaseLost(SchedulerError):
    """The job's lease expired or was taken over; this worker may no longer finish it."""


class Cancelled(SchedulerError):
    """The attempt was asked to stop (its timeout passed): stop the work and let this propagate.

    ``job.check()`` raises it once ``job.cancel_requested`` is true.
    """


class Snooze(Exception):
    """Raised by a handler to put its job back in the queue for ``seconds``, without using an
    attempt or counting a failure."""

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"Snooze(seconds): expected a number, got {type(seconds).__name__}")
        if not 0 <= seconds <= 366 * 86400:
            raise ValueError(f"Snooze(seconds): must be from 0 to one year, got {seconds!r}")
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = float(seconds)


class PermanentError(Exception):
    """Raised by a handler to abort its job at once, without retries.

    ``code`` is the stable error code stored with the job (never the message).
    """

    def __init__(self, code: str = "permanent_error", message: str | None = None) -> None:
        super().__init__(message or code)
        self.code = code


class UnknownHandlerWarning(UserWarning):
    """A job was enqueued for a handler that neither this process nor any worker registered."""
