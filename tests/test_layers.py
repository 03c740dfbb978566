"""The layers' import rules, read from the source (docs/architecture.md draws them).

The pure protocol (`snapmesh/protocol/`) may import only other protocol modules,
the generated messages and a short list of standard-library modules that do no
I/O: no asyncio, grpc, socket, threading, time, random, os or file system, so the
gRPC shells, the simulator and the tests can all drive it with time passed in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "snapmesh" / "protocol"

# Standard-library and third-party modules a pure machine may use: data
# structures and encodings only. Anything else is a new dependency of the pure
# layer and has to be argued for here.
PURE_ALLOWED = {
    "__future__", "abc", "base64", "bisect", "collections", "dataclasses", "enum", "functools",
    "hashlib", "heapq", "itertools", "json", "math", "operator", "re", "struct", "types", "typing",
    "zlib", "google.protobuf", "snapmesh.protocol", "snapmesh.v1",
}
# The modules the issue names, kept as a list so a failure says which rule broke.
NEVER = {"asyncio", "grpc", "socket", "threading", "time", "random", "os", "pathlib", "io", "shutil",
         "tempfile", "subprocess", "glob", "signal", "selectors", "multiprocessing", "concurrent"}
# Builtins that reach the outside world.
IO_BUILTINS = {"open", "input", "print", "exec", "eval", "__import__"}


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """Every module a source file imports, as absolute dotted names with line numbers."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
            else:
                found.append((node.lineno, node.module))
    return found


def violations(source: str, package: str = "snapmesh.protocol") -> list[str]:
    """What a would-be pure module does that the pure layer must not."""
    tree = ast.parse(source)
    problems = []
    for line, module in imported_modules(tree, package):
        top = module.split(".")[0]
        if top in NEVER:
            problems.append(f"line {line}: imports {module} (I/O or time)")
        elif not any(module == ok or module.startswith(ok + ".") for ok in PURE_ALLOWED):
            problems.append(f"line {line}: imports {module} (not on the pure layer's list)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IO_BUILTINS:
            problems.append(f"line {node.lineno}: calls {node.func.id}()")
    return problems


PURE_MODULES = sorted(PROTOCOL.glob("*.py"))


def test_the_pure_layer_has_its_modules():
    names = {p.stem for p in PURE_MODULES}
    assert {"core", "link", "wal", "recovery", "node", "overtake"} <= names, names


@pytest.mark.parametrize("path", PURE_MODULES, ids=lambda p: p.name)
def test_a_pure_module_does_no_io(path):
    problems = violations(path.read_text(encoding="utf-8"))
    assert not problems, f"{path.relative_to(ROOT)} breaks the pure layer's rule:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "source, word",
    [
        ("import asyncio\n", "asyncio"),
        ("from time import monotonic\n", "time"),
        ("import os.path\n", "os.path"),
        ("from snapmesh.settings import config\n", "snapmesh.settings"),
        ("from ..serving import durable\n", "snapmesh.serving"),
        ("def f(p):\n    return open(p).read()\n", "open()"),
        ("import grpc\n", "grpc"),
    ],
)
def test_the_rule_catches_what_it_forbids(source, word):
    # The checker itself can fail: each forbidden form is reported by name.
    problems = violations(source)
    assert problems and word in problems[0], problems


def test_the_rule_lets_pure_imports_through():
    assert violations("from collections import deque\nfrom snapmesh.protocol import wal\nimport json\n") == []
