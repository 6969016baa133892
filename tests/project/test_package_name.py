"""The distribution is ``rerun-scheduler`` on PyPI (``scheduler`` there is someone else's
project): no doc, example, configuration file or message of ours tells a user to
``pip install scheduler``, and the installed metadata and ``--version`` say the name."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".md", ".py", ".toml", ".txt", ".html", ".service", ".yml", ".yaml", ".sh", ".cfg"}
SKIP = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache"}
# pip install scheduler, 'scheduler[postgres]', "scheduler[dashboard]"; a bare `scheduler[x]`
# extra named in prose too. (The install of a checkout, `pip install -e .`, names no package.)
WRONG = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?scheduler\b(?!-)|(?<![\w/.-])scheduler\[\w")


def shipped_files() -> list[Path]:
    return [
        path
        for path in ROOT.rglob("*")
        if path.is_file()
        and path.suffix in SUFFIXES
        and not SKIP.intersection(path.relative_to(ROOT).parts)
        and path != Path(__file__).resolve()
    ]


def test_nothing_tells_a_user_to_install_the_other_projects_scheduler() -> None:
    found = []
    for path in shipped_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if WRONG.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_the_pattern_finds_the_old_install_lines() -> None:
    for line in (
        "pip install scheduler",
        "pip install 'scheduler[postgres]'",
        'pip install -q "scheduler[dashboard]"',
        "needs the extra scheduler[metrics]",
    ):
        assert WRONG.search(line), line
    for line in (
        "pip install rerun-scheduler",
        "pip install 'rerun-scheduler[postgres]'",
        "pip install -e .",
    ):
        assert not WRONG.search(line), line


def test_the_installed_distribution_and_the_version_say_the_name() -> None:
    assert version("rerun-scheduler")
    done = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.startswith("scheduler, version ")
    assert version("rerun-scheduler") in done.stdout
