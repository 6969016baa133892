"""Edits race safely: real ticker processes tick in real time while real editor processes
change, remove and re-create the application's rows (``put_task``, ``remove_task``), every
second, on SQLite (2 and 2), PostgreSQL and MariaDB (4 and 4).

The jobs and decisions tables then say: each (row, slot) was dispatched at most once; no job
of a removed row was committed after its removal (the removal's own transaction read the
row's jobs: any other one came later); and every slot of the rows that never changed was
dispatched exactly once (or merged into the run of the slot before, when a tick came late)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SECONDS = 20.0


def _worker() -> ModuleType:
    path = Path(__file__).with_name("tasks_edit_race_worker.py")
    found = importlib.util.spec_from_file_location("tasks_edit_race_worker", path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    sys.modules[found.name] = module  # its dataclasses look their module up
    found.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.direct  # a pooler adds nothing to what this checks, and each run is ~30 s
def test_edits_race_ticks_safely(db_url: str, tmp_path: Path) -> None:
    worker = _worker()
    processes = 2 if db_url.startswith("sqlite") else 4
    found = worker.race(db_url, tmp_path, SECONDS, processes, processes)

    # the race was run: rows were changed, removed and made again while they were ticked
    edited = found.reports["edit"]
    assert sum(r["removed"] for r in edited) >= 5 and found.recreated_names >= 2
    assert sum(r["cron"] for r in edited) >= 5 and sum(r["payload"] for r in edited) >= 5
    assert found.jobs > SECONDS * 4
    if processes == 4:
        ticked = found.reports["tick"]
        assert sum(r["lost_race"] + r["locked"] for r in ticked) > 0, "the tickers never raced"

    assert found.duplicates == []  # each (row, slot) at most once
    assert found.after_removal == []  # none after its row's removal committed
    assert found.stable_wrong == []  # every slot of an unchanged row exactly once
    assert found.stable_dispatched + found.stable_coalesced == found.stable_expected
    assert found.stable_expected >= worker.STABLE_ROWS * (SECONDS - 2)
