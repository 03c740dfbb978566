"""The README is a landing page: short, and every doc reachable from it; every
relative link in the README and docs/ points at a file that exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 160, "the README grew past a landing page: move the detail to docs/"
    linked = {(ROOT / target).resolve() for target in LINK.findall(readme)}
    docs = set((ROOT / "docs").glob("*.md"))
    assert not {d for d in docs if d.resolve() not in linked}, "docs/ pages the README does not link"


def test_the_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    listed = {(ROOT / "docs" / target).resolve() for target in LINK.findall(index)}
    missing = sorted(d.name for d in (ROOT / "docs").glob("*.md") if d.name != "README.md" and d.resolve() not in listed)
    assert not missing, f"docs/README.md does not list {missing}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
