"""``scheduler status``'s table names a probing row's next probe (``recovery = "probe"``)."""

from __future__ import annotations

from scheduler.cli.output import table_row

ROW = {
    "name": "billing-sync",
    "enabled": False,
    "next_run_at": None,
    "timezone": "UTC",
    "consecutive_failures": 3,
    "disabled_reason": "max_consecutive_failures",
    "disabled_note": None,
    "last_job_state": "aborted",
    "last_job_id": 4,
}


def test_a_probing_row_says_when_its_next_probe_runs() -> None:
    probing = table_row({**ROW, "probe_at": "2030-01-01T10:15:00Z"})
    assert probing[-1] == (
        "disabled, probing: next probe at 2030-01-01 10:15:00Z (max_consecutive_failures)"
    )
    assert table_row({**ROW, "probe_at": None})[-1] == "max_consecutive_failures"
    assert table_row(ROW)[-1] == "max_consecutive_failures"  # a status of an older release
