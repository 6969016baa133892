"""The package's layout holds: no import circle at any level, and no comment or docstring that
points a reader at a file that is not there.

The import-linter contracts (``[tool.importlinter]`` in pyproject.toml, run by CI as
``lint-imports``) say which room may import which; they see imports between layers. A circle
*inside* a room (two modules of the store importing each other, even only for a type) is
found here: the graph is every import of the package's source, at module level, under
``TYPE_CHECKING`` and inside functions.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scheduler"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports, anywhere in its source. A parent package counts
    like any other module: a child that takes names from a parent which imports the child (even
    inside a function) is a circle too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                targets.append(whole if whole in known else base)
        for target in targets:
            if target in known and target != name:
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in on_stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while True:
                popped = stack.pop()
                on_stack.discard(popped)
                component.append(popped)
                if popped == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()  # restored: other tests rely on the default depth
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_module_imports_itself_back_through_others() -> None:
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert sum(len(edges) for edges in graph.values()) > 300  # the walk saw the imports
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_import_contracts_hold() -> None:
    """The same check CI runs: ``lint-imports`` with the contracts of pyproject.toml."""
    probe = (
        "import sys; from importlinter.cli import lint_imports;"
        " sys.exit(lint_imports(no_logo=True, no_cache=True))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0 and "No module named" in done.stderr:
        pytest.skip(f"import-linter is not installed ({done.stderr.strip()})")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


# A path a comment or docstring names: scheduler/..., docs/... (and the other folders of the
# repository), or a module path inside the package such as _store/tables.py.
PATH = re.compile(r"(?<![\w/.])((?:scheduler|docs|tests|benchmarks|reliability)/[\w./-]*\w)")
INSIDE = re.compile(r"(?<![\w/.])(_\w+/[\w/]*\w\.py)\b")


def named_paths(path: Path) -> list[tuple[int, str]]:
    """The repository paths named in the comments and docstrings of a source file."""
    text = path.read_text()
    found: list[tuple[int, str]] = []
    tree = ast.parse(text)
    docs: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            docs.append((node.lineno, node.value))
    lines = text.splitlines()
    comments = [(n + 1, line.partition("#")[2]) for n, line in enumerate(lines) if "#" in line]
    for lineno, chunk in [*docs, *comments]:
        for match in PATH.finditer(chunk):
            found.append((lineno, match.group(1).rstrip(".")))
        for match in INSIDE.finditer(chunk):
            found.append((lineno, "scheduler/" + match.group(1)))
    return found


def test_every_path_a_comment_names_exists() -> None:
    missing = []
    for source in sorted(PACKAGE.rglob("*.py")):
        for lineno, named in named_paths(source):
            if not (ROOT / named).exists():
                missing.append(f"{source.relative_to(ROOT)}:{lineno}: {named}")
    assert missing == []


def test_the_path_check_sees_a_missing_file(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        '"""See scheduler/_gone.py and docs/howto/operate.md."""\n# also _store/tables.py\n'
    )
    assert [named for _, named in named_paths(source)] == [
        "scheduler/_gone.py",
        "docs/howto/operate.md",
        "scheduler/_store/tables.py",
    ]
