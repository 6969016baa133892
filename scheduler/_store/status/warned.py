"""The rows ``status`` warns about, found by the database: one statement, bounded on request.

Five kinds, each a small select of the columns its warning needs (docs/runbook.md):

* ``overdue``: enabled, due longer ago than ``row_overdue`` and not held back by a job in
  flight (a row that allows overlap is never held back);
* ``held_back``: enabled, not allowing overlap, its last job queued or claimed, due longer ago
  than ``row_held_back``;
* ``failing``: enabled, its last job aborted (the failure is counted at its next slot);
* ``disabled_by_failures``: disabled for a reason nobody chose (failures);
* ``disabled``: every disabled row (those a person or the file disabled are reported, not
  warned about).

The due ones come from the ``(enabled, next_run_at)`` index, the disabled ones from its other
end; ``failing`` looks up each enabled row's last job by its primary key. With ``limit`` each
kind returns its first ``limit`` rows by name and, in every row, how many match in all
(``count(*) OVER ()`` is taken before the ``LIMIT``), so a page shows a count and the first
names without the database sending, or Python building, the other rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Integer,
    and_,
    bindparam,
    cast,
    func,
    literal_column,
    null,
    or_,
    select,
    union_all,
)

from ..._model.rules import ABORTED, CLAIMED, QUEUED
from .. import rows as _rows
from ..tables import UTCDateTime, jobs, rows

if TYPE_CHECKING:
    from ..._model.rules import Thresholds

#: Disables a person or the file asked for; every other reason (failures) is warned about.
CHOSEN_DISABLES = (_rows.REASON_MANUAL, _rows.REASON_CONFIG, _rows.REASON_REMOVED)
KINDS = ("overdue", "held_back", "failing", "disabled_by_failures", "disabled")


@dataclass(frozen=True)
class Warned:
    """One row that warns, with what its warning says."""

    name: str
    last_error_code: str | None
    consecutive_failures: int
    max_consecutive_failures: int | None
    disabled_reason: str | None


@dataclass(frozen=True)
class WarnedRows:
    """Per kind: the rows read (by name, at most ``limit``) and how many there are in all."""

    found: dict[str, list[Warned]]
    total: dict[str, int]

    def names(self, kind: str) -> list[str]:
        return [w.name for w in self.found[kind]]

    def more(self, kind: str) -> int:
        """How many rows of ``kind`` were not read (0 without a limit)."""
        return self.total[kind] - len(self.found[kind])


def _conditions() -> dict[str, Any]:
    """Each kind's condition; the instants are the parameters ``overdue_at`` and ``held_at``."""
    state = jobs.c.state
    in_flight = state.in_((QUEUED, CLAIMED))
    enabled, disabled = rows.c.enabled.is_(True), rows.c.enabled.is_(False)
    return {
        "overdue": and_(
            enabled,
            rows.c.next_run_at <= bindparam("overdue_at", type_=UTCDateTime),
            or_(rows.c.concurrent.is_(True), state.is_(None), ~in_flight),
        ),
        "held_back": and_(
            enabled,
            rows.c.next_run_at <= bindparam("held_at", type_=UTCDateTime),
            rows.c.concurrent.is_(False),
            in_flight,
        ),
        "failing": and_(enabled, state == ABORTED),
        "disabled_by_failures": and_(
            disabled,
            or_(rows.c.disabled_reason.is_(None), rows.c.disabled_reason.not_in(CHOSEN_DISABLES)),
        ),
        "disabled": disabled,
    }


def condition(kind: str) -> Any:
    """The condition of `kind` (one of :data:`KINDS`) over the rows outer-joined to their last
    job; its instants are the parameters :func:`instants` gives (the dashboard's task filters)."""
    return _conditions()[kind]


def instants(now: datetime, limits: Thresholds) -> dict[str, datetime]:
    """The parameters of the conditions: the instants before which a row is overdue, or held
    back for too long."""
    return {
        "overdue_at": now - timedelta(seconds=limits.row_overdue),
        "held_at": now - timedelta(seconds=limits.row_held_back),
    }


@functools.lru_cache(maxsize=8)
def _statement(limit: int | None) -> Any:
    """The UNION ALL of one select per kind, built once per ``limit`` (building it cost more
    than the database's part on SQLite)."""
    conditions = _conditions()
    with_job = rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id)
    no_code = cast(null(), jobs.c.last_error_code.type)
    parts = []
    for order, kind in enumerate(KINDS):
        # The disabled kinds need nothing of the last job: no lookup of it per row.
        joined = not kind.startswith("disabled")
        part = (
            select(
                literal_column(str(order), Integer).label("kind"),  # a constant of ours
                rows.c.name,
                (jobs.c.last_error_code if joined else no_code).label("last_error_code"),
                rows.c.consecutive_failures,
                rows.c.max_consecutive_failures,
                rows.c.disabled_reason,
                func.count().over().label("total"),
            )
            .select_from(with_job if joined else rows)
            .where(conditions[kind])
            .order_by(rows.c.name)
        )
        if limit is not None:
            part = part.limit(limit)
        parts.append(select(part.subquery()))  # each its own ORDER BY and LIMIT
    every = union_all(*parts).subquery()
    return select(every).order_by(every.c.kind, every.c.name)


def read(
    conn: Connection, now: datetime, limits: Thresholds, *, limit: int | None = None
) -> WarnedRows:
    """One statement: the rows of every kind, by name; with ``limit``, the first ``limit`` of
    each kind (and the count of all)."""
    params = instants(now, limits)
    found: dict[str, list[Warned]] = {kind: [] for kind in KINDS}
    total = dict.fromkeys(KINDS, 0)
    for r in conn.execute(_statement(limit), params):
        kind = KINDS[r.kind]
        total[kind] = int(r.total)
        found[kind].append(
            Warned(
                r.name,
                r.last_error_code,
                r.consecutive_failures,
                r.max_consecutive_failures,
                r.disabled_reason,
            )
        )
    return WarnedRows(found, total)
