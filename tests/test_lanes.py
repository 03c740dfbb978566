"""Every test module has exactly one lane (tests/lanes.py), and the pure lanes are
pure: a module there starts no process, serves no socket and needs no Spark."""

import ast
from pathlib import Path

from lanes import LANES, PURE, lane_of

TESTS = Path(__file__).resolve().parent
# What a pure lane's module may not import: each starts processes, serves sockets or Spark.
NOT_PURE = ("subprocess", "snapmesh.processes", "pyspark", "snapmesh.reconcile", "services.node.main",
            "services.controller.main", "support.cluster_helpers", "support.node_harness", "support.engine_harness",
            "support.spark_fixtures", "support.ring", "support.processes")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_every_test_module_has_one_lane() -> None:
    listed = [name for names in LANES.values() for name in names.split()]
    twice = sorted({n for n in listed if listed.count(n) > 1})
    assert not twice, f"in more than one lane: {twice}"
    modules = {p.stem for p in TESTS.glob("test_*.py")}
    lanes = lane_of()
    assert not sorted(modules - set(lanes)), f"test modules with no lane in tests/lanes.py: {sorted(modules - set(lanes))}"
    assert not sorted(set(lanes) - modules), f"tests/lanes.py names modules that do not exist: {sorted(set(lanes) - modules)}"


def test_the_pure_lanes_start_nothing() -> None:
    lanes = lane_of()
    offenders = {
        module: sorted(m for m in _imports(TESTS / f"{module}.py") if m.startswith(NOT_PURE))
        for module, lane in lanes.items() if lane in PURE
    }
    assert not {m: bad for m, bad in offenders.items() if bad}, offenders


def test_no_test_module_imports_another() -> None:
    """What several test modules share lives in tests/support/, one import style: `from support.x import y`."""
    offenders = {
        path.name: sorted(m for m in _imports(path) if m.split(".")[-1].startswith("test_") or m.startswith("tests."))
        for path in [*TESTS.glob("test_*.py"), *TESTS.glob("support/*.py"), TESTS / "conftest.py"]
    }
    assert not {name: bad for name, bad in offenders.items() if bad}, offenders


def test_the_purity_check_sees_a_subprocess(tmp_path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("import subprocess\nfrom snapmesh.processes.supervisor import Cluster\n")
    assert {m for m in _imports(module) if m.startswith(NOT_PURE)} == {"subprocess", "snapmesh.processes.supervisor"}
