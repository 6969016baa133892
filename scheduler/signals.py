"""Signals, in one blinker namespace of our own.

Every signal is sent after its transaction committed, by the one process whose conditional
update won. Each receiver is called on its own: one that raises is logged and the others still
run. blinker holds receivers by weak reference: connect module-level functions, or pass
``weak=False`` (a lambda or closure connected inside a function is collected and never fires).

Senders: the task (row) name for ``row_disabled``, ``row_recovered``, ``job_dispatched``,
``job_rerun`` and ``slot_skipped``; the handler name for the ``job_*`` outcome signals. Filter with
``connect(fn, sender="name")``.
"""

from __future__ import annotations

import logging
from typing import Any

from blinker import NamedSignal, Namespace

log = logging.getLogger(__name__)

_signals = Namespace()

row_disabled: NamedSignal = _signals.signal(
    "row-disabled",
    doc="A row reached its failure limit and was disabled. kw: row, consecutive_failures,"
    " last_error_code (for an abandoned job: the error behind it, from the run history),"
    " job_id, disabled_at, alert_id (stable: drop repeats by it).",
)
row_recovered: NamedSignal = _signals.signal(
    "row-recovered",
    doc='A probe of a row the failure limit disabled succeeded (recovery = "probe") and the'
    " row is enabled again. kw: row, probes (how many ran), disabled_seconds, alert_id (stable:"
    " drop repeats by it).",
)
job_dispatched: NamedSignal = _signals.signal(
    "job-dispatched", doc="The tick created a fresh job for a row. kw: row, job_id, slot."
)
job_rerun: NamedSignal = _signals.signal(
    "job-rerun",
    doc="The tick reset a row's aborted job in place. kw: row, job_id, consecutive_failures.",
)
slot_skipped: NamedSignal = _signals.signal(
    "slot-skipped",
    doc="A row's slot did not run: dropped while its last job was in flight (overlap skip),"
    " older than its catch-up window, or passed while the row was disabled. kw: slot (the"
    " nominal instant, aware UTC), decision (skipped_overlap, missed or paused), reason.",
)
job_succeeded: NamedSignal = _signals.signal(
    "job-succeeded", doc="A job finished. kw: job (a Job view)."
)
job_failed: NamedSignal = _signals.signal(
    "job-failed",
    doc="An attempt failed and the job will retry. kw: job, error_code, retry_at.",
)
job_aborted: NamedSignal = _signals.signal(
    "job-aborted", doc="A job ended aborted (terminal). kw: job, error_code."
)
job_abandoned: NamedSignal = _signals.signal(
    "job-abandoned",
    doc="A job that is not retry-safe was abandoned after a crash or a raise; its"
    " handler's abandoned() hook ran. kw: job, error_code.",
)

__all__ = [
    "job_abandoned",
    "job_aborted",
    "job_dispatched",
    "job_failed",
    "job_rerun",
    "job_succeeded",
    "row_disabled",
    "row_recovered",
    "send",
    "slot_skipped",
]


def send(signal: NamedSignal, sender: str, **kwargs: Any) -> int:
    """Call each receiver of ``signal`` for ``sender`` on its own; return how many raised."""
    if not signal.receivers:  # none connected (the usual case): the tick sends one per row
        return 0
    failures = 0
    for receiver in list(signal.receivers_for(sender)):
        try:
            receiver(sender, **kwargs)
        except Exception:
            failures += 1
            log.exception(
                "signal receiver %r for %s raised",
                receiver,
                signal.name,
                extra={"action": "signal_receiver_failed", "signal": signal.name},
            )
    return failures
