"""`Job` is built without the dataclass's ``__init__`` on the hot path (``Job.from_row``,
``Job.replaced``, ``Ending.success``): what they make must be what the dataclass makes."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler._model.ending import Ending
from scheduler._model.job import Job
from scheduler._model.rules import SUCCEEDED

NOW = datetime(2026, 12, 7, 21, 0, 0, 123456, tzinfo=UTC)
ROW = {
    "id": 7,
    "handler": "h",
    "state": "claimed",
    "attempts": 2,
    "max_attempts": 3,
    "run_at": NOW,
    "last_error_code": None,
    "payload": '{"a": [1, 2]}',
    "queue": "default",
    "priority": 5,
    "task_name": "t",
    "dedupe_key": None,
    "lease_owner": "w",
    "lease_expires_at": NOW,
    "created_at": NOW,
    "finished_at": None,
}


class _Row:
    def __init__(self, mapping: dict[str, Any]) -> None:
        self._mapping = mapping


def _by_init(**extra: Any) -> Job:
    return Job(**{**ROW, "payload": {"a": [1, 2]}, **extra})


def test_from_row_makes_what_the_dataclass_makes() -> None:
    # A row of an older revision (no traceparent, slot, tenant or fence): the defaults.
    assert Job.from_row(_Row(ROW)) == _by_init()
    full = {**ROW, "traceparent": "00-x", "slot": NOW, "tenant": "acme", "fence": 4}
    made = Job.from_row(_Row(full))
    assert made == _by_init(traceparent="00-x", slot=NOW, tenant="acme", fence=4)
    assert vars(made) == vars(_by_init(traceparent="00-x", slot=NOW, tenant="acme", fence=4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.state = "queued"  # type: ignore[misc]


def test_replaced_is_dataclasses_replace() -> None:
    job = Job.from_row(_Row(ROW))
    changes: dict[str, Any] = {"state": SUCCEEDED, "lease_owner": None, "finished_at": NOW}
    assert vars(job.replaced(**changes)) == vars(dataclasses.replace(job, **changes))
    assert job.state == "claimed"  # the original is left as it was
    with pytest.raises(TypeError, match="no field"):
        job.replaced(stat="succeeded")


def test_a_success_ending_is_the_dataclass_one() -> None:
    job = _by_init()
    for completed in (False, True):
        made = Ending.success(job, NOW, completed=completed)
        assert made == Ending(job, NOW, SUCCEEDED, None, completed=completed)
        assert made.result == "succeeded"
