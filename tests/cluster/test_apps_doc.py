"""docs/apps.md is complete as printed (issue 45).

- every name its Python blocks use is defined in one of them, imported by one, or
  a builtin (`token_rows` and `workload` were used and never shown);
- the testing block (section 2) runs as printed, from examples/, and prints what
  its comments say;
- the hint it promises for `--app examples/token_ring.py` is the line load_app
  gives, and the spelling it gives works;
- every `snapmesh reconcile` line gives `--data-dir` and parses;
- the rules it states for view rows hold for the shipped apps'
  views (`view_row_problems`), and each broken rule is found;
- the "Clients" lines run as printed against a real token-ring cluster (the
  default cluster's layout; `--config` of the test cluster added, since its
  ports are free ones), each printing what its comment says.
"""

from __future__ import annotations

import ast
import builtins
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from snapmesh.app import App, AppError, View, load_app
from snapmesh.app.testing import Cluster, view_row_problems
from snapmesh.processes.supervisor import Cluster as Processes
from snapmesh.reconcile.job import parser as reconcile_parser
from snapmesh.services.app import bank, kvshard
from snapmesh.settings import config
from snapmesh.settings.config import write_cluster
from support.ring import APP, CLI, EXAMPLES, env_with, held_by

DOC = Path(__file__).resolve().parents[2] / "docs" / "apps.md"
ENV = env_with(EXAMPLES)


def text() -> str:
    return DOC.read_text(encoding="utf-8")


def blocks(language: str, doc: str | None = None) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text() if doc is None else doc, flags=re.S)


def section(title: str) -> str:
    return text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_name_the_python_blocks_use_is_defined_or_imported() -> None:
    defined, used = set(dir(builtins)), set()
    for block in blocks("python"):
        source = "\n".join(line for line in block.splitlines() if not line.startswith("#"))
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a method of the class, shown alone: parse it as the class body it is
            tree = ast.parse("class _Shown:\n" + source)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name != "_Shown":
                defined.add(node.name)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                defined.add(node.name)
            elif isinstance(node, ast.alias):
                defined.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, ast.Name):
                (defined if isinstance(node.ctx, ast.Store) else used).add(node.id)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
    # the edge, a program's own object (section 4), and `TOKEN`, the file's constant
    known = {"edge", "TOKEN", "self"}
    assert used - defined - known == set()
    assert {"token_rows", "workload"} <= defined


def test_the_testing_block_runs_as_printed(tmp_path: Path) -> None:
    (block,) = blocks("python", section("2. Test it without a cluster"))
    ran = subprocess.run([sys.executable, "-c", block], cwd=EXAMPLES, capture_output=True, text=True, timeout=120,
                         env=ENV)
    assert ran.returncode == 0, ran.stderr
    comments = [line.split("# ", 1)[1] for line in block.splitlines() if line.startswith("print(")]
    out = ran.stdout.splitlines()
    assert len(out) == len(comments) and all(c.startswith(o) for o, c in zip(out, comments, strict=True)), out


def test_the_path_hint_is_load_apps_own_words_and_its_spelling_works(monkeypatch) -> None:
    run_it = section("3. Run it")
    with pytest.raises(AppError) as refused:
        load_app("examples/token_ring.py")
    assert f"\n{refused.value}\n" in run_it
    assert "PYTHONPATH=examples snapmesh cluster up --app token_ring:app" in run_it
    monkeypatch.chdir(EXAMPLES.parent)
    monkeypatch.syspath_prepend(str(EXAMPLES))  # what PYTHONPATH=examples does
    assert load_app("token_ring:app").name == "token_ring"
    sys.modules.pop("token_ring", None)


def test_every_reconcile_line_gives_its_data_dir() -> None:
    lines = [line for block in blocks("sh") for line in block.splitlines() if line.startswith("snapmesh reconcile")]
    assert lines, "the page lost its reconcile line"
    for line in lines:
        args = reconcile_parser().parse_args(shlex.split(line)[2:])
        assert args.data_dir and args.app, line


class _Rows:
    def __init__(self, rows):
        self.rows = rows

    def __call__(self, view: View):
        return [dict(row, snapshot_id=view.snapshot_id) if row.get("snapshot_id", ...) is ... else row
                for row in self.rows]


@pytest.mark.parametrize(("rows", "found"), [
    ([{"n": 1}, {"n": "one"}], "n: a str where another row has a int"),
    ([{"n": 1}, {"m": 1}], "a row has columns"),
    ([{"n": None}], "None in every row"),
    ([{"n": [1]}], "a list, not one of"),
    ([{"n": 2**63}], "does not fit 64 bits"),
    ([{"n": 1, "snapshot_id": "other"}], "snapshot_id is 'other'"),
])
def test_view_rows_that_break_a_rule_are_named(rows, found) -> None:
    view = View(snapshot_id="s1", states={"p1": b""}, in_flight=[])
    app = App(name="rows", new=lambda info: None, views={"t": _Rows(rows)})
    problems = view_row_problems(app, [view])
    assert any(found in p for p in problems), problems


def test_the_shipped_apps_views_keep_the_rules() -> None:
    ring = load_app("snapmesh.examples.token_ring:app")
    cluster = Cluster(ring, channels=[("p1", "p2"), ("p2", "p1")])
    before = cluster.view("s1")
    cluster.command("p1", b"pass")
    assert view_row_problems(ring, [before, cluster.view("s2")]) == []
    kv = Cluster(kvshard.app, channels=[("p1", "p2"), ("p2", "p1")])
    kv.command("p1", b'{"op": "put", "key": "p1/a", "value": 1}')
    kv.command("p1", b'{"op": "move", "key": "p1/a", "to": "p2"}')
    assert view_row_problems(kvshard.app, [kv.view("s1")]) == []
    money = View(snapshot_id="s1", states={"p1": b"990", "p2": b"1000"}, in_flight=[("p1", "p2", 1, b"10")],
                 params={"total": 2000})
    assert view_row_problems(bank.app, [money]) == []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("apps-doc")
    running = Processes(write_cluster(tmp / "cluster.toml", nodes=4, data_dir=tmp), app=APP, env=ENV)
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_the_clients_lines_run_as_printed(cluster) -> None:
    cfg = config.load(cluster.config_path)
    (block,) = blocks("sh", section("11. Clients"))
    lines = [line for line in block.splitlines() if line.startswith("snapmesh ")]
    assert len(lines) >= 5
    for line in lines:
        command, _, expected = line.partition("  # ")
        argv = shlex.split(command)
        if argv[1] == "query":
            held_by(cfg, "p2")  # a pass is answered once logged; the token then takes a hop
        ran = subprocess.run([*CLI, *argv[1:], "--config", str(cluster.config_path)], capture_output=True, text=True,
                             timeout=60, env=ENV)
        refused = "FAILED_PRECONDITION" in expected
        assert ran.returncode == (1 if refused else 0), line
        assert (ran.stderr if refused else ran.stdout) == expected.strip() + "\n", line
