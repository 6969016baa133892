"""Step 6 of docs/tutorial.md with the page's own job numbers (issue 37, item 8): the worker
log shows ``greet`` as jobs 1 to 4 and ``check-service``'s failing run as job 5, and
``scheduler enable check-service`` must then print what the page shows, job number included
(the page said job 2). The tutorial's own test compares each command's output with the page,
but it skips the worker blocks, so its job numbers are not the reader's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)

# What the reader's two workers did: step 5 ran greet twice (jobs 1 and 2); step 6 ran greet
# (3), then dispatched greet and check-service in one tick (4 and 5), reran job 5 in place,
# and disabled the task.
READER_WORKERS = """
import sys
sys.path.insert(0, ".")
import tutorial_jobs
from datetime import timedelta
from scheduler import Scheduler
from scheduler.testing import ManualClock
# A clock that stands still before the rows' first slot (the sync computed it from the real
# clock; under load a 10-second boundary may have passed since): only the triggers make a
# task due, never its own 10-second slots.
app = Scheduler.from_toml("app.toml")
first = min(app.get_row(name).next_run_at for name in ("greet", "check-service"))
app.close()
app = Scheduler.from_toml("app.toml", clock=ManualClock(first - timedelta(seconds=1)))
for names in (["greet"], ["greet"], ["greet"], ["greet", "check-service"], ["check-service"],
              ["check-service"]):
    for name in names:
        app.trigger(name)
    app.tick()
    app.work()
ids = [job.id for job in app.jobs(limit=100)]
print(sorted(ids))
"""


def page_blocks(kind: str) -> list[str]:
    return [text for k, text in BLOCK.findall(TUTORIAL.read_text()) if k == kind]


def shown_output(command: str) -> list[str]:
    """The lines the page shows under ``$ command``."""
    for text in page_blocks("console"):
        lines = text.rstrip("\n").splitlines()
        if f"$ {command}" in lines:
            shown = []
            for line in lines[lines.index(f"$ {command}") + 1 :]:
                if line.startswith("$ "):
                    break
                shown.append(line)
            return shown
    raise AssertionError(f"no `{command}` on the page")


def run(project: Path, env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, *args], cwd=project, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


def test_the_page_and_the_program_agree_on_the_job_enable_names(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    python, toml = page_blocks("python"), page_blocks("toml")
    (tmp_path / "tutorial_jobs.py").write_text(python[0] + "\n\n" + python[1])
    (tmp_path / "app.toml").write_text(toml[0] + "\n" + toml[1])
    cli = ("-m", "scheduler.cli")
    run(tmp_path, env, *cli, "migrate")
    run(tmp_path, env, *cli, "sync")
    assert run(tmp_path, env, "-c", READER_WORKERS).strip() == "[1, 2, 3, 4, 5]"

    # The page's own log: check-service's failing run is job 5.
    log = "\n".join(page_blocks("console"))
    assert "job 5 (check, task check-service) run 2" in log

    real = run(tmp_path, env, *cli, "enable", "check-service").rstrip("\n").splitlines()
    assert real == shown_output("scheduler enable check-service")
