"""Every test module lives in a lane folder, tests/<lane>/, whose conftest.py marks
it; the pure lanes are pure: a module there starts no process, serves no socket and
needs no Spark; and no test module imports another (what they share is in tests/support/)."""

import ast
from pathlib import Path

from support.lanes import LANES, PURE

TESTS = Path(__file__).resolve().parents[1]
# What a pure lane's module may not import: each starts processes, serves sockets or Spark.
NOT_PURE = ("subprocess", "snapmesh.processes", "pyspark", "snapmesh.reconcile", "services.node.process",
            "services.controller.process", "support.cluster_helpers", "support.node_harness", "support.engine_harness",
            "support.spark_fixtures", "support.ring", "support.processes")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_every_test_module_is_in_a_lane() -> None:
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and p.name not in ("support", "__pycache__"))
    assert folders == sorted(LANES), "a lane folder that tests/support/lanes.py does not name, or the other way round"
    assert not sorted(p.name for p in TESTS.glob("test_*.py")), "a test module outside tests/<lane>/"
    for lane in LANES:
        assert (TESTS / lane / "conftest.py").is_file(), f"tests/{lane}/ has no conftest.py to mark its tests"
    names = [p.name for p in TESTS.glob("*/test_*.py")]
    assert len(names) == len(set(names)), "two test modules of one name (pytest needs them unique)"


def test_the_pure_lanes_start_nothing() -> None:
    offenders = {
        path.name: sorted(m for m in _imports(path) if m.startswith(NOT_PURE))
        for lane in PURE for path in (TESTS / lane).glob("test_*.py")
    }
    assert not {m: bad for m, bad in offenders.items() if bad}, offenders


def test_no_test_module_imports_another() -> None:
    """What several test modules share lives in tests/support/, one import style: `from support.x import y`."""
    offenders = {
        path.name: sorted(m for m in _imports(path) if m.split(".")[-1].startswith("test_") or m.startswith("tests."))
        for path in [*TESTS.glob("*/test_*.py"), *TESTS.glob("support/*.py"), TESTS / "conftest.py"]
    }
    assert not {name: bad for name, bad in offenders.items() if bad}, offenders


def test_the_purity_check_sees_a_subprocess(tmp_path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("import subprocess\nfrom snapmesh.processes.supervisor import Cluster\n")
    assert {m for m in _imports(module) if m.startswith(NOT_PURE)} == {"subprocess", "snapmesh.processes.supervisor"}
