"""The framework knows bytes only: no framework module imports an app.

The framework is the pure protocol, the serving layer, the checkers and the node's
and the controller's shells. An app (the bank, the apps under services/app, the
example apps) is loaded by name through the app contract (snapmesh.app); a framework
module that imports one, at any depth in the file or through
`importlib.import_module("snapmesh.bank...")`, ties every app to that one.

The bank's word `tally` goes with it: a node's or a message's tally is the bank's
figure, and the framework's own records are payloads and state digests.

Files still being changed are listed below with exactly what they break today. A
new break fails, and so does a listed break that has gone: the lists only shrink,
and the rule holds with no exceptions once they are empty.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from snapmesh.app import BUILT_IN
from support.layers import imported_modules

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORK = ("snapmesh/protocol", "snapmesh/serving", "snapmesh/checking", "services/node", "services/controller")
# The app packages, as they are imported. services/ is importable both as itself and
# as snapmesh.services (snapmesh/services links to it).
APPS = ("snapmesh.bank", "snapmesh.services.app", "services.app", "snapmesh.apps", "snapmesh.examples")
# A string that names an app module, as import_module or a default app spec takes it.
APP_NAME = re.compile(r"(?:%s)(?:\.\w+)*(?::\w+)?" % "|".join(re.escape(app) for app in APPS))

# Framework files that import an app today, and what each imports (a path, then the app
# modules). Other branches are removing these; the lead empties the dict at merge.
STILL_IMPORTS_AN_APP: dict[str, set[str]] = {}

# `tally` and `tallies` as whole words, the bank word lint's way (test_layers.BANK_WORD):
# any case, and an underscore separates words, so NODE_TALLY_KEY counts.
TALLY_WORD = re.compile(r"(?<![a-z0-9])(?:tally|tallies)(?![a-z0-9])", re.IGNORECASE)
# Framework files that still say it; the lead empties the set at merge.
STILL_SAYS_TALLY: set[str] = set()


def framework_files() -> list[Path]:
    return [p for top in FRAMEWORK for p in sorted((ROOT / top).rglob("*.py"))]


def dotted(path: Path, base: Path = ROOT) -> str:
    """A file's module name, as it is imported (services/ as snapmesh.services)."""
    parts = path.relative_to(base).with_suffix("").parts
    if parts and parts[0] == "services":
        parts = ("snapmesh", *parts)
    return ".".join(parts).removesuffix(".__init__")


def is_app(module: str) -> bool:
    return any(module == app or module.startswith(app + ".") for app in APPS)


def app_imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """The app modules a framework module's source imports, or names as a string to import."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    found = {target for _, target in imported_modules(tree, package) if target and is_app(target)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            # `from snapmesh import bank`: the app package, named after the module it comes from
            [(_, base)] = imported_modules(node, package)
            if not is_app(base):
                found |= {f"{base}.{alias.name}" for alias in node.names if is_app(f"{base}.{alias.name}")}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and APP_NAME.fullmatch(node.value):
            found.add(node.value.partition(":")[0])
    return found


def breaks(paths: list[Path], base: Path = ROOT) -> dict[str, set[str]]:
    """The files of `paths` that import an app, by path from `base`, with the app modules."""
    found = {}
    for path in paths:
        apps = app_imports(path.read_text(encoding="utf-8"), dotted(path, base), path.name == "__init__.py")
        if apps:
            found[path.relative_to(base).as_posix()] = apps
    return found


def test_no_framework_module_imports_an_app():
    found = breaks(framework_files())
    new = {name: apps - STILL_IMPORTS_AN_APP.get(name, set()) for name, apps in found.items()}
    new = {name: apps for name, apps in new.items() if apps}
    assert not new, "framework modules that import an app (load it by name through snapmesh.app):\n" + "\n".join(
        f"{name}: {', '.join(sorted(apps))}" for name, apps in sorted(new.items()))


def test_the_files_still_importing_an_app_still_do():
    # A file cleaned since it was listed is taken off (or its entry shortened), so the list only shrinks.
    found = breaks([ROOT / name for name in STILL_IMPORTS_AN_APP if (ROOT / name).exists()])
    gone = {name: apps - found.get(name, set()) for name, apps in STILL_IMPORTS_AN_APP.items()}
    gone = {name: apps for name, apps in gone.items() if apps}
    assert not gone, "take these off STILL_IMPORTS_AN_APP, they no longer import them:\n" + "\n".join(
        f"{name}: {', '.join(sorted(apps))}" for name, apps in sorted(gone.items()))


def test_the_import_rule_catches_every_form(tmp_path):
    # The rule can fail: a synthetic framework package imports an app each way it can.
    node = tmp_path / "services" / "node"
    node.mkdir(parents=True)
    (node / "__init__.py").write_text("from ..app import bank\n")
    (node / "plain.py").write_text("import snapmesh.bank.wire as wire\n")
    (node / "late.py").write_text("def f():\n    from snapmesh.bank.formats import NODE_TALLY_KEY\n")
    (node / "package.py").write_text("from snapmesh import bank\nfrom snapmesh import app\n")
    (node / "named.py").write_text("import importlib\nlogs = importlib.import_module('snapmesh.bank.logs')\n")
    (node / "spec.py").write_text("DEFAULT = 'snapmesh.services.app.bank:BankApp'\n")
    (node / "clean.py").write_text("from snapmesh import app\nimport snapmesh.protocol.wal\nNOTE = 'as snapmesh.bank does'\n")
    assert breaks(sorted(node.glob("*.py")), base=tmp_path) == {
        "services/node/__init__.py": {"snapmesh.services.app"},
        "services/node/plain.py": {"snapmesh.bank.wire"},
        "services/node/late.py": {"snapmesh.bank.formats"},
        "services/node/package.py": {"snapmesh.bank"},
        "services/node/named.py": {"snapmesh.bank.logs"},
        "services/node/spec.py": {"snapmesh.services.app.bank"},
    }


def tally_lines(path: Path, name: str = "") -> list[str]:
    """Each line of a file that says tally or tallies, as "file:line: text"."""
    name = name or path.relative_to(ROOT).as_posix()
    return [f"{name}:{number}: {line.strip()}"
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if TALLY_WORD.search(line)]


def test_the_framework_says_no_tally():
    hits = [hit for path in framework_files() if path.relative_to(ROOT).as_posix() not in STILL_SAYS_TALLY
            for hit in tally_lines(path)]
    assert not hits, "the bank's word tally in the framework (payloads and state digests are its words):\n" + "\n".join(
        hits)


def test_the_files_still_saying_tally_still_do():
    # A file cleaned (or removed) since it was listed is taken off, so the set only shrinks.
    clean = sorted(name for name in STILL_SAYS_TALLY if not (ROOT / name).exists() or not tally_lines(ROOT / name))
    assert not clean, f"take these off STILL_SAYS_TALLY: {clean}"


def test_the_tally_rule_finds_whole_words(tmp_path):
    # The rule can fail: each form is found, naming file and line; a longer word is not.
    source = tmp_path / "m.py"
    source.write_text("key = NODE_TALLY_KEY\n# the tallies add up\nTally = 1\ntallyho = 0\nmessage_tallying = 0\n")
    assert tally_lines(source, "m.py") == ["m.py:1: key = NODE_TALLY_KEY", "m.py:2: # the tallies add up",
                                           "m.py:3: Tally = 1"]


# The framework does not ask which app a node runs by its name either: what an app needs of its
# node it declares (its `edge`, `old_logs`, `v1_fields` plug-ins), and which app a file names
# by default is the settings' (snapmesh/settings/appsettings.py). So no framework module holds
# a built-in app's name as a string, or takes the settings' names for the bank.
BUILT_IN_NAMES = frozenset(BUILT_IN)
BANK_SETTINGS = frozenset({"BANK", "runs_bank"})


def app_names(source: str) -> list[str]:
    """Where a framework module's source names a built-in app: a string that is exactly one's name
    ("bank"), or the settings' names for the bank (appsettings.BANK, runs_bank) imported or read."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() in BUILT_IN_NAMES:
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name in BANK_SETTINGS]
        elif isinstance(node, ast.Attribute) and node.attr in BANK_SETTINGS:
            found.append(f"{node.lineno}: .{node.attr}")
    return found


def test_the_framework_names_no_app():
    hits = [f"{path.relative_to(ROOT).as_posix()}:{hit}" for path in framework_files()
            for hit in app_names(path.read_text(encoding="utf-8"))]
    assert not hits, "the framework names an app (ask what the app declares, or the settings):\n" + "\n".join(hits)


def test_the_app_name_rule_catches_every_form():
    # The rule can fail: each way services/node/embedded.py once named the bank is found, the words in
    # a docstring or a longer string are not.
    source = ('"""Runs the bank, or an app."""\nfrom snapmesh.settings.appsettings import BANK, same_app\n'
              'from snapmesh.settings import config\nx = app.name == "bank"\ny = config.runs_bank(cfg.app)\n'
              'z = spec.strip() == " kvshard"\nw = "the bank app"\n')
    assert app_names(source) == ["2: import BANK", "4: 'bank'", "5: .runs_bank", "6: ' kvshard'"]
