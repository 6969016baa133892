"""docs/tutorial.md, run as a reader runs it: its files from its code blocks, its commands from
its console blocks, and each shown output compared with the real one (so the page
cannot show a schema revision that is no longer the head).

Times, worker ids and job numbers vary from run to run and are compared as placeholders. The
worker's own blocks (`scheduler worker`, which runs until Ctrl-C, and the output that follows
it) are not run; ``...`` in a shown output stands for lines left out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)
VARYING = [
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?Z?( UTC)?"), "<time>"),
    (re.compile(r"last tick (<time>|-)"), "last tick <tick>"),
    (re.compile(r"succeeded \d+"), "succeeded <n>"),
    # the worker blocks are not run here: job numbers are the reader's, not this run's
    (re.compile(r"last job \(\d+\)"), "last job (<n>)"),
]


# Step 6's worker: check-service runs, fails, is rerun in place, fails, and is disabled.
FAIL_TWICE = """
import sys
sys.path.insert(0, ".")
import tutorial_jobs
from scheduler import Scheduler
app = Scheduler.from_toml("app.toml")
app.trigger("greet")  # the worker ran greet too (every 10 s): not left to the clock
for _ in range(3):
    app.trigger("check-service")
    app.tick()
    app.work()
"""


def blocks() -> list[tuple[str, str]]:
    return [(kind, text) for kind, text in BLOCK.findall(TUTORIAL.read_text())]


def normalise(text: str) -> list[str]:
    lines = []
    for line in text.rstrip("\n").splitlines():
        for pattern, placeholder in VARYING:
            line = pattern.sub(placeholder, line)
        lines.append(re.sub(r"\s{2,}", "  ", line.rstrip()))
    return lines


def sessions(text: str) -> list[tuple[str, list[str]]]:
    """(command, shown output lines) for each ``$ scheduler ...`` line of a console block."""
    found: list[tuple[str, list[str]]] = []
    for line in text.rstrip("\n").splitlines():
        if line.startswith("$ "):
            found.append((line[2:], []))
        elif found:
            found[-1][1].append(line)
    return [(cmd, out) for cmd, out in found if cmd.startswith("scheduler ")]


def matches(shown: list[str], real: list[str]) -> bool:
    """``...`` in the shown output stands for any lines."""
    pattern = "\n".join(re.escape(line) if line != "..." else "(?:.*\n?)*?" for line in shown)
    return re.fullmatch(pattern, "\n".join(real) + "", flags=re.DOTALL) is not None


def test_the_tutorial_shows_what_the_commands_print(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scheduler").write_text(f'#!/bin/sh\nexec {sys.executable} -m scheduler.cli "$@"\n')
    (bin_dir / "scheduler").chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    project = tmp_path / "tutorial"
    project.mkdir()
    page = blocks()
    python = [text for kind, text in page if kind == "python"]
    toml = [text for kind, text in page if kind == "toml"]
    # Step 2 writes tutorial_jobs.py, step 3 app.toml; step 6 adds to both, step 7 edits.
    (project / "tutorial_jobs.py").write_text(python[0])
    (project / "app.toml").write_text(toml[0])
    compared = 0
    for kind, text in page:
        if kind == "python" and text is python[1]:
            with (project / "tutorial_jobs.py").open("a") as file:
                file.write("\n\n" + text)
        if kind == "toml" and text is toml[1]:
            with (project / "app.toml").open("a") as file:
                file.write("\n" + text)
        if kind == "toml" and text is toml[2]:
            before = (project / "app.toml").read_text()
            start = before.index('[[tasks]]\nname = "greet"')
            end = before.index("[[tasks]]", start + 1)
            (project / "app.toml").write_text(before[:start] + text + "\n" + before[end:])
        if kind != "console":
            continue
        for command, shown in sessions(text):
            if command.split()[1] == "worker":
                continue  # runs until Ctrl-C (its logs vary); --once prints only logs
            result = subprocess.run(
                command,
                shell=True,
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 0, (command, result.stderr)
            real, want = normalise(result.stdout), normalise("\n".join(shown))
            print(f"$ {command}\n{result.stdout}", file=sys.stderr)
            assert matches(want, real), (command, want, real)
            compared += 1
        if "tick: disabled check-service" in text:  # what that worker did, in one process
            subprocess.run([sys.executable, "-c", FAIL_TWICE], cwd=project, env=env, check=True)
    assert compared >= 9
