"""Tasks as data under racing ticks: editors change and remove the application's rows while
tickers dispatch them.

``--tickers`` (4) processes tick in real time while ``--editors`` (4) processes call
``put_task`` (payload and cron changes), ``remove_task`` and re-create the same names, for
``--seconds`` (180), on rows that fire every second; 4 more rows never change. The race and
its checks are those of ``tests/e2e/test_tasks_edit_race.py`` (``tests/e2e/
tasks_edit_race_worker.py``), run for minutes instead of 20 seconds:

- each (row, slot) dispatched at most once (a re-created name is a new row);
- no job of a removed row committed after its removal: the removal's transaction reads the
  name's jobs (a locking read), and every job of that row must be among them;
- every slot of the rows that never changed dispatched exactly once (a job each, or merged
  into the one before by a late tick: ``coalesced``).

    python reliability/tasks_edit_race.py [--seconds 180] [--tickers 4] [--editors 4] [--url URL]
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

WORKER = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "tasks_edit_race_worker.py"


def _worker() -> ModuleType:
    found = importlib.util.spec_from_file_location("tasks_edit_race_worker", WORKER)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    sys.modules[found.name] = module
    found.loader.exec_module(module)
    return module


def main() -> int:
    p = c.parser(__doc__, 180.0, c.DEFAULT_PG)
    p.add_argument("--tickers", type=int, default=4)
    p.add_argument("--editors", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    url = args.url or f"sqlite:///{c.workdir('edit-race-db') / 'scheduler.db'}"
    c.prepare_database(url)
    out = c.workdir("edit-race")
    found = _worker().race(url, out, args.seconds, args.tickers, args.editors, args.seed)
    edited, ticked = found.reports["edit"], found.reports["tick"]
    figures = [
        c.Figure("jobs dispatched", found.jobs),
        c.Figure("rows made (incarnations)", found.incarnations),
        c.Figure("names re-created", found.recreated_names),
        c.Figure("removals", found.removals),
        c.Figure("payload changes", sum(r["payload"] for r in edited)),
        c.Figure("cron changes", sum(r["cron"] for r in edited)),
        c.Figure("ticks' lost races + locked", sum(r["lost_race"] + r["locked"] for r in ticked)),
        c.Figure("(row, slot) dispatched twice", len(found.duplicates), True),
        c.Figure("jobs committed after their row's removal", len(found.after_removal), True),
        c.Figure("unchanged rows' slots expected", found.stable_expected),
        c.Figure("  dispatched", found.stable_dispatched),
        c.Figure("  merged by a late tick (coalesced)", found.stable_coalesced),
        c.Figure("unchanged rows with a slot missing or twice", len(found.stable_wrong), True),
    ]
    title = f"tasks edit race: {args.tickers} tickers, {args.editors} editors, {args.seconds:.0f} s"
    return c.finish(title, (figures, []), out, args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
