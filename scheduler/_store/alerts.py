"""The ``row_disabled`` and ``row_recovered`` alerts, delivered from an outbox so a crash
cannot swallow them.

A disable writes ``alert_id`` into the row in the same transaction (a recovery by a probe:
``recovery_alert``, the alert's values as JSON). After the commit the
receivers run, then ``alert_id`` is cleared. If the process dies in between, a worker's sweep
delivers it later: at-least-once, with a stable ``alert_id`` a receiver can use to drop a repeat.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, select, update

from .. import signals
from .retry import retry
from .tables import jobs, rows, runs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alert:
    row_id: int
    row: str
    consecutive_failures: int
    last_error_code: str | None
    job_id: int | None
    disabled_at: datetime | None
    alert_id: str


def cause(conn: Connection, job_id: int | None, code: str | None) -> str | None:
    """The error code to report: for an abandoned job, the error that made it so."""
    if code != "abandoned" or job_id is None:
        return code
    found = conn.execute(
        select(runs.c.error_code)
        .where(runs.c.job_id == job_id, runs.c.error_code.is_not(None))
        .order_by(runs.c.id.desc())
        .limit(1)
    ).scalar()
    return found or code


def deliver(conn: Connection, alert: Alert) -> None:
    """Run the receivers (each isolated), then record the alert as delivered."""
    signals.send(
        signals.row_disabled,
        alert.row,
        row=alert.row,
        consecutive_failures=alert.consecutive_failures,
        last_error_code=alert.last_error_code,
        job_id=alert.job_id,
        disabled_at=alert.disabled_at,
        alert_id=alert.alert_id,
    )

    def clear() -> None:
        with conn.begin():
            conn.execute(
                update(rows)
                .where(rows.c.id == alert.row_id, rows.c.alert_id == alert.alert_id)
                .values(alert_id=None)
            )

    # The receivers ran: only the clearing is retried. Should it still fail, the alert stays
    # pending and the sweep delivers it again (at least once, with the same alert_id).
    retry(f"recording the alert for {alert.row} as delivered", clear, lost=lambda: None)


def pending(conn: Connection, *, now: datetime, older_than: timedelta) -> list[Alert]:
    """Alerts committed at least ``older_than`` ago whose receivers never ran."""
    stmt = (
        select(
            rows.c.id,
            rows.c.name,
            rows.c.consecutive_failures,
            rows.c.last_job_id,
            rows.c.disabled_at,
            rows.c.alert_id,
            jobs.c.last_error_code,
        )
        .select_from(rows.outerjoin(jobs, jobs.c.id == rows.c.last_job_id))
        .where(rows.c.alert_id.is_not(None), rows.c.disabled_at <= now - older_than)
        .order_by(rows.c.disabled_at)
    )
    return [
        Alert(
            r.id,
            r.name,
            r.consecutive_failures,
            cause(conn, r.last_job_id, r.last_error_code),
            r.last_job_id,
            r.disabled_at,
            r.alert_id,
        )
        for r in conn.execute(stmt)
    ]


def deliver_pending(conn: Connection, *, now: datetime, older_than: timedelta) -> int:
    with conn.begin():
        found = pending(conn, now=now, older_than=older_than)
        healed = pending_recovered(conn, now=now, older_than=older_than)
    for alert in found:
        log.warning(
            "delivering a row_disabled alert for task %s left undelivered",
            alert.row,
            extra={"action": "alert_redelivered", "row": alert.row},
        )
        deliver(conn, alert)
    for recovered in healed:
        log.warning(
            "delivering a row_recovered alert for task %s left undelivered",
            recovered.row,
            extra={"action": "alert_redelivered", "row": recovered.row},
        )
        deliver_recovered(conn, recovered)
    return len(found) + len(healed)


@dataclass(frozen=True)
class Recovered:
    """A ``row_recovered`` alert: a probe succeeded and re-enabled the row."""

    row_id: int
    row: str
    probes: int
    disabled_seconds: float
    alert_id: str
    recovered_at: datetime

    def stored(self) -> dict[str, object]:
        """The values the outbox column keeps (the row's id and name are the row's)."""
        return {
            "alert_id": self.alert_id,
            "probes": self.probes,
            "disabled_seconds": self.disabled_seconds,
            "at": self.recovered_at.isoformat(),
        }


def deliver_recovered(conn: Connection, alert: Recovered) -> None:
    """Run the ``row_recovered`` receivers (each isolated), then clear the outbox."""
    signals.send(
        signals.row_recovered,
        alert.row,
        row=alert.row,
        probes=alert.probes,
        disabled_seconds=alert.disabled_seconds,
        alert_id=alert.alert_id,
    )
    stored = json.dumps(alert.stored(), separators=(",", ":"))

    def clear() -> None:
        with conn.begin():
            conn.execute(
                update(rows)
                .where(rows.c.id == alert.row_id, rows.c.recovery_alert == stored)
                .values(recovery_alert=None)
            )

    retry(f"recording the recovery alert for {alert.row} as delivered", clear, lost=lambda: None)


def pending_recovered(conn: Connection, *, now: datetime, older_than: timedelta) -> list[Recovered]:
    """``row_recovered`` alerts committed at least ``older_than`` ago whose receivers never ran."""
    stmt = select(rows.c.id, rows.c.name, rows.c.recovery_alert).where(
        rows.c.recovery_alert.is_not(None)
    )
    found: list[Recovered] = []
    for row_id, name, stored in conn.execute(stmt):
        data = json.loads(stored)
        at = datetime.fromisoformat(data["at"])
        if at > now - older_than:
            continue  # its tick is delivering it
        found.append(
            Recovered(
                row_id,
                name,
                int(data["probes"]),
                float(data["disabled_seconds"]),
                str(data["alert_id"]),
                at,
            )
        )
    return found
