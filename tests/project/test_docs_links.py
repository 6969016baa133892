"""The docs' links lead somewhere: every relative link of the Markdown files names a file that
exists, and its ``#anchor`` a heading of that file (GitHub's slug of it) or an explicit
``<a id="...">``. Sections get renumbered; a link to the old number is found here, not by a
reader. And the docs stand on their own: no file cites a specification that is not in the
repository."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "benchmarks" / "README.md",
        *(ROOT / "docs").rglob("*.md"),
    ]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)
EXPLICIT = re.compile(r"<a id=\"([^\"]+)\"")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@functools.cache  # a page linked to many times is read once
def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found: set[str] = set(EXPLICIT.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers a repeated heading
        seen[base] = n + 1
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(FENCE.sub("", page.read_text()))
        if not re.match(r"[a-z]+:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_an_anchor_that_exist(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_the_docs_cite_no_specification_outside_the_repository() -> None:
    citing = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in PAGES
        if page.name != "CHANGELOG.md"  # it may say that the citations were removed
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"\bSPEC\b", line)
    ]
    assert citing == []


def test_the_slug_is_githubs() -> None:
    assert slug("17. Wake-ups (`wakeup_latency.py`, issue 26)") == (
        "17-wake-ups-wakeup_latencypy-issue-26"
    )
    assert slug("What `explain` says") == "what-explain-says"
