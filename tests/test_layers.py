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


# The layers, lowest first. A module may import its own layer and the layers
# below it, never a layer above: docs/architecture.md draws the same table.
LAYERS = [
    ("pure protocol", ["snapmesh.protocol", "snapmesh.v1"]),
    ("settings", ["snapmesh.settings"]),
    ("checking", ["snapmesh.checking", "snapmesh.reconcile", "snapmesh.sim", "snapmesh.trace"]),
    ("shells", ["snapmesh.serving", "services.node", "services.controller"]),
    (
        "tools",
        ["snapmesh.commands", "snapmesh.processes", "snapmesh.hosts", "snapmesh.ui", "snapmesh.bank",
         "snapmesh.chaos", "services.app", "services", "snapmesh.cli", "snapmesh.version", "snapmesh", "bench"],
    ),
]


def layer_of(module: str) -> int | None:
    """The layer a dotted module belongs to (the longest matching prefix), or None if it is not ours."""
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (rank, len(prefix))
    return None if best is None else best[0]


def source_modules() -> list[tuple[str, Path]]:
    files = [*ROOT.glob("snapmesh/**/*.py"), *ROOT.glob("services/**/*.py"), *ROOT.glob("bench/*.py")]
    return [
        (".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"), p)
        for p in sorted(files)
        if "v1" not in p.relative_to(ROOT).parts
    ]


def upward_imports(module: str, source: str) -> list[str]:
    """Imports (at any depth in the file) that reach a layer above the module's own."""
    own = layer_of(module)
    package = module if source_is_package(module) else module.rpartition(".")[0]
    found = []
    for line, target in imported_modules(ast.parse(source), package):
        rank = layer_of(target)
        if rank is not None and own is not None and rank > own:
            found.append(f"{module} line {line} imports {target} ({LAYERS[rank][0]} is above {LAYERS[own][0]})")
    return found


def source_is_package(module: str) -> bool:
    return (ROOT / Path(*module.split(".")) / "__init__.py").exists()


def test_every_module_has_a_layer():
    assert [m for m, _ in source_modules() if layer_of(m) is None] == []


def test_no_module_imports_a_layer_above_its_own():
    problems = [p for module, path in source_modules() for p in upward_imports(module, path.read_text(encoding="utf-8"))]
    assert not problems, "imports that go up a layer:\n" + "\n".join(problems)


def test_the_layer_rule_catches_an_upward_import():
    assert upward_imports("snapmesh.checking.x", "from snapmesh.serving import runtime\n")
    assert upward_imports("snapmesh.protocol.node", "def f():\n    from services.node import engine\n")
    assert not upward_imports("services.node.engine", "from snapmesh.protocol import node\n")
