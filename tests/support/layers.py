"""Shared by several test modules (moved out of the test module that first had it)."""

from __future__ import annotations

import ast


# Standard-library and third-party modules a pure machine may use: data
# structures and encodings only. Anything else is a new dependency of the pure
# layer and has to be argued for here.
PURE_ALLOWED = {
    # binascii: base64's own C encoder, called directly on the per-record path (wal.pack).
    "__future__", "abc", "base64", "binascii", "bisect", "collections", "dataclasses", "enum", "functools",
    "hashlib", "heapq", "itertools", "json", "math", "operator", "re", "struct", "types", "typing",
    "zlib", "google.protobuf", "snapmesh.protocol", "snapmesh.v1", "snapmesh.app",
    # The bank's reading of a cut, which the log checkers take (test_layers.PURE_MODULES holds it).
    "snapmesh.bank.cut",
    # The bank's format keys and its parts of the log, trace and snapshot-file checkers, pure alike;
    # so are its v1 accessors and its native nodes' records.
    "snapmesh.bank.formats", "snapmesh.bank.logs", "snapmesh.bank.trace", "snapmesh.bank.snapshot",
    "snapmesh.bank.wire", "snapmesh.bank.v1records",
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
