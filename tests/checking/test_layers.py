"""The layers' import rules, read from the source (docs/architecture.md draws them).

The pure protocol (`snapmesh/protocol/`) may import only other protocol modules,
the generated messages and a short list of standard-library modules that do no
I/O: no asyncio, grpc, socket, threading, time, random, os or file system, so the
gRPC shells, the simulator and the tests can all drive it with time passed in.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support.layers import imported_modules, violations

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "snapmesh" / "protocol"







# The bank's reading of a cut lives with the bank but is held to the pure rules: the log
# checkers pass it to snapmesh/checking/cut.py.
# The bank's reading of raw logs, of a trace and of a snapshot file (logs.py, trace.py, snapshot.py), the
# keys of its formats (formats.py), its native nodes' records (v1records.py) and its v1 accessors (wire.py)
# likewise: the checkers take them as the app's part, the bank's reading decodes an old native record
# (`wal.Older`) with v1records.py, and the bank's v1 adapters (edge.py, v1fields.py) ask wire.py.
BANK_PURE = [ROOT / "snapmesh" / "bank" / name for name in
             ("cut.py", "formats.py", "logs.py", "trace.py", "snapshot.py", "wire.py", "v1records.py")]
PURE_MODULES = sorted(PROTOCOL.rglob("*.py")) + BANK_PURE


def test_the_pure_layer_has_its_modules():
    names = {str(p.relative_to(PROTOCOL).with_suffix("")) for p in PURE_MODULES if p.is_relative_to(PROTOCOL)}
    assert {"node/core", "node/link", "node/recovery", "node/machine", "controller/machine", "controller/tracker",
            "wal", "overtake", "topology", "chunking"} <= names, names


@pytest.mark.parametrize(
    "path", PURE_MODULES, ids=lambda p: str(p.relative_to(PROTOCOL if p.is_relative_to(PROTOCOL) else ROOT))
)
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
    # The public app contract: apps import it, and so does every layer that hosts them.
    ("app contract", ["snapmesh.app"]),
    ("pure protocol", ["snapmesh.protocol", "snapmesh.v1", "snapmesh.bank.cut",
                       "snapmesh.bank.formats", "snapmesh.bank.logs", "snapmesh.bank.trace", "snapmesh.bank.snapshot",
                       "snapmesh.bank.wire", "snapmesh.bank.v1records"]),
    ("settings", ["snapmesh.settings"]),
    ("checking", ["snapmesh.checking", "snapmesh.reconcile", "snapmesh.spark", "snapmesh.synth", "snapmesh.sim",
                  "snapmesh.fuzzer", "snapmesh.trace"]),
    ("shells", ["snapmesh.serving", "snapmesh.services.node", "snapmesh.services.controller"]),
    (
        "tools",
        ["snapmesh.commands", "snapmesh.processes", "snapmesh.hosts", "snapmesh.ui", "snapmesh.bank",
         "snapmesh.chaos", "snapmesh.load", "snapmesh.services.app", "snapmesh.services", "snapmesh.cli",
         "snapmesh.version", "snapmesh", "bench"],
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
    # services/ is imported as snapmesh.services (snapmesh/services links to it)
    return [
        (".".join(("snapmesh", *p.relative_to(ROOT).with_suffix("").parts) if p.relative_to(ROOT).parts[0] == "services"
                  else p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"), p)
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


def test_the_settings_open_no_grpc():
    # settings read files; every server and channel is opened by snapmesh/serving (credentials.py)
    problems = [f"{module} line {line} imports {target}" for module, path in source_modules()
                if module.startswith("snapmesh.settings")
                for line, target in imported_modules(ast.parse(path.read_text(encoding="utf-8")), module)
                if target == "grpc" or target.startswith("grpc.")]
    assert not problems, "\n".join(problems)


def test_every_module_has_a_layer():
    assert [m for m, _ in source_modules() if layer_of(m) is None] == []


def test_no_module_imports_a_layer_above_its_own():
    problems = [p for module, path in source_modules() for p in upward_imports(module, path.read_text(encoding="utf-8"))]
    assert not problems, "imports that go up a layer:\n" + "\n".join(problems)


def test_the_layer_rule_catches_an_upward_import():
    assert upward_imports("snapmesh.app", "from snapmesh.protocol import core\n")
    assert upward_imports("snapmesh.checking.x", "from snapmesh.serving import runtime\n")
    assert upward_imports("snapmesh.protocol.node.machine", "def f():\n    from snapmesh.services.node import engine\n")
    assert not upward_imports("snapmesh.services.node.engine", "from snapmesh.protocol import node\n")


# ---- No import cycles --------------------------------------------------------
# Read from the source, not from sys.modules: an import inside a function or
# under `if TYPE_CHECKING:` is an edge too, since a cycle there still ties two
# modules together so that neither can be read or moved without the other.

# Modules another helper is untangling; the lead empties this set at merge. Each
# entry is one strongly connected group, so a new module joining it still fails.
def import_edges(source: str, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that a module's source imports, wherever in the file it does."""
    package = name if is_package else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # `from pkg import mod` imports the submodule; `from mod import name` the module.
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module for alias in node.names]
        for target in targets:
            if target == "snapmesh.v1" or target.startswith("snapmesh.v1."):
                continue  # the generated code: outside the graph (source_modules), not the package root
            while target and target not in known:  # `import a.b.c` of a name in a.b: the module a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


def import_graph() -> dict[str, set[str]]:
    modules = dict(source_modules())
    known = set(modules)
    return {
        name: import_edges(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", known)
        for name, path in modules.items()
    }


def cycle_groups(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other, in turn or through others (Tarjan's strongly connected groups)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep graph cannot hit the recursion limit.
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return groups


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other, as a path."""
    return [cycle_through(graph, group) for group in cycle_groups(graph)]


def cycle_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    first = min(group)
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == first:
                    return paths[node] + [first]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle in {group}")  # a strongly connected group always has one


def test_no_import_cycles():
    graph = import_graph()
    new = cycle_groups(graph)
    assert not new, "import cycles:\n" + "\n".join(" -> ".join(cycle_through(graph, g)) for g in new)


def test_the_graph_has_edges_of_every_kind():
    # The graph's reader can fail: a function-level import, a relative import and
    # `from package import module` each give an edge.
    known = {"p", "p.a", "p.b", "p.c", "q"}
    source = "from . import b\nfrom .c import thing\ndef f():\n    import q\n"
    assert import_edges(source, "p.a", False, known) == {"p.b", "p.c", "q"}
    assert import_edges("from .a import x\n", "p", True, known) == {"p.a"}


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# ---- Modules that fit in a head ----------------------------------------------
# Hand-written Python of the product, the benchmarks and the deploy scripts. The
# tests are left out: a test module is a list of cases, often sharing one real
# cluster started once per module, and splitting it by line count would start
# that cluster again for each part.

MAX_LINES = 500
SIZED_ROOTS = ("snapmesh", "services", "bench", "deploy")
# Files other helpers are splitting; the lead empties this set at merge.
STILL_TOO_LONG: set[str] = set()


def hand_written(root: str) -> list[Path]:
    """The .py files under `root` a person wrote: the generated gRPC code (snapmesh/v1) is not."""
    return [p for p in sorted((ROOT / root).rglob("*.py")) if "v1" not in p.relative_to(ROOT).parts[:2]]


def too_long(paths: list[Path], base: Path = ROOT) -> dict[str, int]:
    """The files over MAX_LINES lines, by path from `base`, with their line counts."""
    sizes = {p.relative_to(base).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    return {name: lines for name, lines in sizes.items() if lines > MAX_LINES}


def test_no_module_is_over_500_lines():
    found = too_long([p for root in SIZED_ROOTS for p in hand_written(root)])
    over = {name: lines for name, lines in found.items() if name not in STILL_TOO_LONG}
    assert not over, f"modules over {MAX_LINES} lines: " + ", ".join(f"{n} ({k})" for n, k in sorted(over.items()))


def test_the_still_too_long_are_still_too_long():
    # A file split since it was listed is taken off, so the set only shrinks.
    found = too_long([ROOT / name for name in STILL_TOO_LONG if (ROOT / name).exists()])
    assert set(found) == {name for name in STILL_TOO_LONG if (ROOT / name).exists()}, STILL_TOO_LONG - set(found)


def test_the_size_rule_counts_lines(tmp_path):
    # The rule can fail: 501 lines is over, 500 is not.
    long, short = tmp_path / "long.py", tmp_path / "short.py"
    long.write_text("x = 1\n" * 501)
    short.write_text("x = 1\n" * 500)
    assert too_long([long, short], base=tmp_path) == {"long.py": 501}


def test_generated_code_is_not_sized():
    names = {p.relative_to(ROOT).as_posix() for p in hand_written("snapmesh")}
    assert "snapmesh/bank/workload.py" in names
    assert not any(n.startswith("snapmesh/v1/") for n in names)


# ---- The framework speaks no bank (issue 32) ---------------------------------
# The bank is one app among others: its words (a balance, an amount, money) belong
# to the bank app (services/app/bank.py, snapmesh/bank/: its v1 fields are
# snapmesh/bank/v1fields.py's), never to the framework that runs any app. A word is
# whole between letters and digits, so an underscore separates words too: `_AMOUNT`
# and `run.amounts` count, `NodeBalance` (a v1 message's name, the wire) does not.
# The stronger rule, that no framework module imports an app, and the bank's word
# `tally`, are test_app_imports.py's.

BANK_WORD = re.compile(r"(?<![a-z0-9])(?:balances?|amounts?|money)(?![a-z0-9])", re.IGNORECASE)
# Where the rule holds, in full: the pure protocol (the controller's machine, the node's,
# the log and the reports), the serving layer, the controller's and the node's shells, and every checker.
APP_NEUTRAL = ("snapmesh/protocol", "snapmesh/serving", "services/controller", "services/node", "snapmesh/checking")
WHERE_THE_BANK_IS = ("the bank's fields are snapmesh/bank/v1fields.py's and wire.py's, its format keys formats.py's, "
                     "its part of the checkers logs.py, trace.py, snapshot.py and cut.py")


def bank_words(path: Path, name: str = "") -> list[str]:
    """Each line of a file with a bank word, as "file:line: text"."""
    name = name or path.relative_to(ROOT).as_posix()
    return [f"{name}:{number}: {line.strip()}"
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if BANK_WORD.search(line)]


def bank_word_lines(directory: str) -> list[str]:
    """The lines with a bank word in the .py files under `directory`."""
    return [hit for p in sorted((ROOT / directory).rglob("*.py")) for hit in bank_words(p)]


@pytest.mark.parametrize("directory", APP_NEUTRAL)
def test_the_framework_has_no_bank_word(directory):
    hits = bank_word_lines(directory)
    assert not hits, f"bank words in {directory} ({WHERE_THE_BANK_IS}):\n" + "\n".join(hits)


def test_the_bank_word_rule_finds_whole_words(tmp_path):
    # The rule can fail: each form is found, naming file and line; a longer word is not.
    source = tmp_path / "m.py"
    source.write_text("x = state.balance\n_AMOUNT = 1\n# Money moves\nok = pb.NodeBalance\nrebalanced = amountless = 0\n")
    assert bank_words(source, "m.py") == ["m.py:1: x = state.balance", "m.py:2: _AMOUNT = 1", "m.py:3: # Money moves"]
