"""The code says what a rule is, never which issue brought it: an issue number tells a
reader nothing without the tracker, and the tracker may move or close. A line in
snapmesh/, services/ or bench/ that names an issue or a defect by number fails here;
tests may name the issue they reproduce."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = [ROOT / "snapmesh", ROOT / "services", ROOT / "bench"]
ISSUE_NUMBER = re.compile(r"\b(defect|issue) [0-9]+", re.IGNORECASE)


def issue_lines(text: str) -> list[tuple[int, str]]:
    """The (line number, line) of `text` that name an issue or a defect by number."""
    return [(no, line.strip()) for no, line in enumerate(text.splitlines(), 1) if ISSUE_NUMBER.search(line)]


def test_the_check_finds_an_issue_number() -> None:
    text = "x = 1  # the rule, issue 35\n'''Defect 7: ...'''\nrule I1: ids keep increasing\nissues 3 and 4\n"
    assert [no for no, _ in issue_lines(text)] == [1, 2]


def test_no_code_line_names_an_issue_number() -> None:
    found = []
    for top in CODE:
        for path in sorted(top.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:  # images and other binary files
                continue
            found += [f"{path.relative_to(ROOT)}:{no}: {line}" for no, line in issue_lines(text)]
    assert not found, "say what the rule is instead of the issue that brought it:\n" + "\n".join(found)
