"""No class defines a method (or any name) twice: the second def silently replaces the first,
and every caller of the first then runs the second (a servicer once had two `_listed`s, and
ListSnapshots called the report one). ruff's F811 misses it when the first was used in between."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("snapmesh", "services", "bench", "jobs", "deploy")


def redefined(source: str, where: str) -> list[str]:
    found = []
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        seen: dict[str, int] = {}
        for item in cls.body:
            if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            overloads = {getattr(d, "attr", getattr(d, "id", "")) for d in item.decorator_list}
            if overloads & {"overload", "setter", "deleter", "getter"}:
                continue
            if item.name in seen:
                found.append(f"{where}:{item.lineno}: {cls.name}.{item.name} is defined again (first at line {seen[item.name]})")
            seen.setdefault(item.name, item.lineno)
    return found


def test_no_class_defines_a_method_twice() -> None:
    found = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            found += redefined(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, "\n".join(found)


def test_the_check_finds_a_second_def() -> None:
    source = "class A:\n    def f(self): pass\n    def g(self): pass\n    async def f(self): pass\n"
    assert redefined(source, "x.py") == ["x.py:4: A.f is defined again (first at line 2)"]
