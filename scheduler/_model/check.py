"""A task built in Python (``TaskSpec``), checked as the TOML loader checks the file's tasks:
one ``ConfigError`` naming the task and the key, before anything is written."""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError
from . import cron as _cron
from .payload import encode_payload
from .rules import MAX_NAME, check_policies, name_problem, tenant_problem


def check_task(
    task: Any, payload_limit: int, schedule_kept: bool = False
) -> tuple[str, str | None]:
    """Validate `task`; return its payload as stored (compact JSON) and its cron's H-free form
    (:func:`~scheduler._model.cron.hash_free`).

    ``schedule_kept``: the task has a row whose handler, cron and timezone equal the task's.
    They passed these same checks when the row was written (a cron's validity is a function of
    the expression and the name alone), so only the payload is checked and the H-free form is
    None: nothing needs the next slot of a schedule that did not change. The payload is always
    checked: the limit may have changed.
    """
    check_policies(task)  # checked on both paths: they may have changed
    tenant = getattr(task, "tenant", None)  # checked on both paths: it may have changed
    if tenant is not None and (problem := tenant_problem(tenant)) is not None:
        raise ConfigError(f"task {task.name!r}: key 'tenant': {problem}")
    if schedule_kept:
        try:
            return encode_payload(task.payload, payload_limit), None
        except ValueError as exc:
            raise ConfigError(f"task {task.name!r}: key 'payload': {exc}") from None
    for key in ("name", "handler"):
        problem = name_problem(getattr(task, key))
        if problem:
            raise ConfigError(f"task {task.name!r}: key {key!r}: {problem}")
    key = "cron"
    try:
        if not isinstance(task.cron, str) or len(task.cron) > MAX_NAME:
            raise ValueError(f"must be a string of at most {MAX_NAME} characters")
        free = _cron.validate_cron(task.cron, task.name)
        key = "timezone"
        _cron.validate_timezone(task.timezone)
        key = "payload"
        return encode_payload(task.payload, payload_limit), free
    except ValueError as exc:
        raise ConfigError(f"task {task.name!r}: key {key!r}: {exc}") from None
