"""The documents stay readable and their links into BENCHMARKS.md resolve: every ``BENCHMARKS.md#anchor`` in
README.md, docs/*.md and CHANGELOG.md, and every ``#anchor`` inside BENCHMARKS.md, names a heading that exists
(GitHub's anchors: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``, a repeat suffixed ``-1``);
BENCHMARKS.md's contents list names each of its questions; README.md has no prose line wider than a screen. No
model runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"
LINKING = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
README_WIDTH = 200  # characters, outside code blocks and tables


def outside_code(text: str) -> list[str]:
    """The lines of ``text`` outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in outside_code(text):
        heading = re.match(r"#{1,6} +(.+?)\s*#*\s*$", line)
        if heading:
            base = anchor(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_anchors_follow_github():
    assert anchor("The recipe for an hour: `cpu_hour` (ML-100K, two seeds, the AMX Xeon)") == (
        "the-recipe-for-an-hour-cpu_hour-ml-100k-two-seeds-the-amx-xeon"
    )
    assert anchors("# A\n```\n# not a heading\n```\n## A\n### Test Recall@10 (ML-100K)\n") == {
        "a",
        "a-1",
        "test-recall10-ml-100k",
    }


@pytest.mark.parametrize("doc", LINKING, ids=lambda p: p.name)
def test_links_into_benchmarks_name_a_heading(doc):
    known = anchors(BENCHMARKS.read_text(encoding="utf-8"))
    links = re.findall(r"BENCHMARKS\.md#([^)\s>\"'`]+)", doc.read_text(encoding="utf-8"))
    missing = sorted(set(links) - known)
    assert not missing, f"{doc.name} links to BENCHMARKS.md headings that do not exist: {missing}"


def test_links_inside_benchmarks_name_a_heading():
    text = BENCHMARKS.read_text(encoding="utf-8")
    links = re.findall(r"\]\(#([^)\s]+)\)", text)
    missing = sorted(set(links) - anchors(text))
    assert links and not missing, missing


def test_the_contents_list_every_question_of_benchmarks():
    text = BENCHMARKS.read_text(encoding="utf-8")
    contents = text[text.index("## Contents") : text.index("\n## ", text.index("## Contents") + 1)]
    listed = set(re.findall(r"\]\(#([^)]+)\)", contents))
    sections = {anchor(line[3:]) for line in outside_code(text) if line.startswith("## ")} - {"contents"}
    assert sections == listed, (sorted(sections - listed), sorted(listed - sections))


def test_benchmarks_names_no_issue_and_no_date_outside_commands():
    """BENCHMARKS.md says what is true now: no issue numbers, no dates (run folders in commands may keep theirs)."""
    prose = [
        line
        for line in outside_code(BENCHMARKS.read_text(encoding="utf-8"))
        if not line.startswith("    ")  # indented code blocks: the commands
    ]
    dated = [line for line in prose if re.search(r"\b20\d\d-\d\d-\d\d\b|\b[Ii]ssue \d+|\bstop[ -]\d+", line)]
    assert not dated, dated[:5]


def test_readme_prose_fits_a_screen():
    wide = [
        line
        for line in outside_code((ROOT / "README.md").read_text(encoding="utf-8"))
        if len(line) > README_WIDTH and not line.lstrip().startswith("|")
    ]
    assert not wide, [line[:80] for line in wide]


def test_readme_opens_with_what_it_is_and_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    head = text[: text.index("## Install")]
    assert "bash scripts/demo.sh" in head and "bash scripts/test.sh" in head
    assert head.count("\n## ") == 1  # the opening paragraph, then "The two commands"
