"""Every test module lives in a lane folder, tests/<lane>/, whose conftest.py marks
it; the pure lanes are pure: a module there starts no process, serves no socket and
needs no Spark; and no test module imports another (what they share is in tests/support/)."""

import ast
from pathlib import Path

from support.lanes import LANES, PURE

TESTS = Path(__file__).resolve().parents[1]
# What a pure lane's module may not import: each starts processes, serves sockets or Spark.
NOT_PURE = ("subprocess", "snapmesh.processes", "pyspark", "snapmesh.reconcile", "snapmesh.services.node.process",
            "snapmesh.services.controller.process", "support.cluster_helpers", "support.node_harness", "support.engine_harness",
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
    folders = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and p.name not in ("support", "fixtures", "__pycache__"))
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


# The one polling helper: a function that loops on the clock with time.sleep is a second one.
POLLING = TESTS / "support" / "polling.py"


def _pollers(source: str) -> list[str]:
    """The functions of `source` with a loop that reads the clock (time.monotonic/time.time)
    and sleeps (time.sleep): hand-written polling, which tests/support/polling.py does once."""
    tree = ast.parse(source)
    modules = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.name == "time"}
    imported = {a.asname or a.name: a.name for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module == "time" for a in n.names}

    def calls(node: ast.AST, names: set[str]) -> bool:
        for call in ast.walk(node):
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in modules \
                    and func.attr in names:
                return True
            if isinstance(func, ast.Name) and imported.get(func.id) in names:
                return True
        return False

    def own_nodes(function: ast.AST):
        stack = list(ast.iter_child_nodes(function))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(c for c in ast.iter_child_nodes(node)
                         if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    return [f"{function.name} (line {function.lineno})"
            for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            if any(isinstance(loop, (ast.While, ast.For)) and calls(loop, {"monotonic", "time"}) and calls(loop, {"sleep"})
                   for loop in own_nodes(function))]


def test_no_polling_loop_outside_the_polling_helper() -> None:
    """Waiting until something holds is support.polling.wait_for, never a loop of its own."""
    offenders = {
        str(path.relative_to(TESTS)): found
        for path in sorted(TESTS.rglob("*.py")) if path != POLLING
        if (found := _pollers(path.read_text(encoding="utf-8")))
    }
    assert not offenders, f"poll with support.polling.wait_for instead: {offenders}"


def test_the_polling_check_sees_a_hand_written_wait() -> None:
    old_poll = (  # tests/support/cluster_helpers.py's poll, before support/polling.py
        "import time\n\n"
        "def poll(what, condition, timeout=30.0, interval=0.05):\n"
        "    deadline = time.monotonic() + timeout\n"
        "    while True:\n"
        "        value = what()\n"
        "        if condition(value):\n"
        "            return value\n"
        "        assert time.monotonic() < deadline\n"
        "        time.sleep(interval)\n"
    )
    inline = (  # a deadline loop in a test body, and the same through `from time import`
        "from time import monotonic, sleep\n\n"
        "def test_x():\n"
        "    end = monotonic() + 5\n"
        "    for attempt in range(9):\n"
        "        if monotonic() > end:\n"
        "            break\n"
        "        sleep(0.1)\n"
    )
    assert _pollers(old_poll) == ["poll (line 3)"]
    assert _pollers(inline) == ["test_x (line 3)"]
    assert _pollers("import time\n\ndef f():\n    time.sleep(1)\n    return time.monotonic()\n") == []
    # the helper itself is such a loop: the one the check lets be
    assert [found.split()[0] for found in _pollers(POLLING.read_text(encoding="utf-8"))] == ["wait_for"]
