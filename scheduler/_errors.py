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


class PermanentError(Exception):
    """Raised by a handler to abort its job at once, without retries.

    ``code`` is the stable error code stored with the job (never the message).
    """

    def __init__(self, code: str = "permanent_error", message: str | None = None) -> None:
        super().__init__(message or code)
        self.code = code


class UnknownHandlerWarning(UserWarning):
    """A job was enqueued for a handler that neither this process nor any worker registered."""
