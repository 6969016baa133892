"""The tests' own layout holds: every test file sits in a folder named after its subject, no
test module imports another (what tests share lives in ``tests/helpers/``), test files' names
are unique (pytest imports each by its bare name), and nothing is named after a ticket.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SUBJECTS = {"model", "store", "worker", "cli", "dashboard", "e2e", "project"}
HELPERS = "helpers"
AT_THE_ROOT = {"conftest.py"}  # the shared fixtures, found by pytest for every folder
TICKET = re.compile(r"issue_?\d|ticket", re.IGNORECASE)
SKIPPED = {"__pycache__", ".pytest_cache", ".hypothesis"}


def python_files() -> list[Path]:
    return sorted(
        path
        for path in TESTS.rglob("*.py")
        if not SKIPPED.intersection(path.relative_to(TESTS).parts)
    )


def is_test_module(path: Path) -> bool:
    return path.name.startswith("test_") or path.name.endswith("_test.py")


def test_every_test_file_is_in_a_subject_folder() -> None:
    misplaced = [
        str(path.relative_to(TESTS))
        for path in python_files()
        if is_test_module(path) and path.relative_to(TESTS).parts[0] not in SUBJECTS
    ]
    assert misplaced == [], f"move these into one of tests/{{{','.join(sorted(SUBJECTS))}}}/"
    at_the_root = {
        path.name
        for path in TESTS.iterdir()
        if path.name not in SKIPPED and not path.name.startswith(".")
    }
    allowed = SUBJECTS | {HELPERS} | AT_THE_ROOT
    assert at_the_root - allowed == set(), "tests/ holds only its subject folders"


def test_test_files_have_unique_names() -> None:
    # pytest imports a test file of a folder without __init__.py by its bare name.
    seen: dict[str, list[str]] = {}
    for path in python_files():
        if is_test_module(path):
            seen.setdefault(path.name, []).append(str(path.relative_to(TESTS)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_no_test_module_imports_another() -> None:
    test_modules = {path.stem for path in python_files() if is_test_module(path)}
    wrong = [
        f"{path.relative_to(TESTS)} imports {module}"
        for path in python_files()
        for module in sorted(imported_modules(path))
        if module.split(".")[0] == "tests" or test_modules.intersection(module.split("."))
    ]
    assert wrong == [], "share through tests/helpers/ instead"


def test_nothing_is_named_after_a_ticket() -> None:
    named = sorted(
        {
            str(Path(*path.relative_to(TESTS).parts[: index + 1]))
            for path in TESTS.rglob("*")
            if not SKIPPED.intersection(path.relative_to(TESTS).parts)
            for index, part in enumerate(path.relative_to(TESTS).parts)
            if TICKET.search(part)
        }
    )
    assert named == [], "name a test file or folder after what it checks"
