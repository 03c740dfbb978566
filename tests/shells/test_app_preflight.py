"""One pre-flight for an app, whichever command runs it (snapmesh.app.preflight).

`cluster up --app`, `demo` (through $SNAPMESH_APP, which its nodes would inherit),
`chaos --app` and `app --app` each meet an app whose `new()` raises, whose machine
lacks a method or whose `snapshot()` returns a str with one line on stderr naming
the app and the fault, and exit 2, before any process starts or the data dir is
made: as `snapmesh node --app` always did (tests/cluster/test_app_cluster.py).
`snapmesh app` is run against a controller and a node of this process (no cluster
needed): it must not send the app a single command.
"""

from __future__ import annotations

import sys

import pytest

from snapmesh.processes.supervisor import Cluster
from support.fake_cluster import FakeCluster
from support.idle_app import idle_app

pytestmark = pytest.mark.timeout(60)

MACHINE = idle_app("self.me = info.node_id")

# module name -> (its last lines, the fault the one line names)
FAULTS = {
    "preflight_new_raises": (
        "def new(info):\n    raise ValueError(f'no machine for {info.node_id}')\n\n\n"
        "app = App(name='new_raises', new=new, workload=workload)\n",
        f"app 'new_raises': new() for node p1 raised ValueError: no machine for p1 "
        f"(preflight_new_raises.py:{MACHINE.count(chr(10)) + 2})"),
    "preflight_no_restore": (
        "class NoRestore(Machine):\n    restore = None\n\n\n"
        "app = App(name='no_restore', new=NoRestore, workload=workload)\n",
        "app 'no_restore': node p1: the machine (NoRestore) has no method restore()"),
    "preflight_text_state": (
        "class Text(Machine):\n    def snapshot(self):\n        return 'text'\n\n\n"
        "app = App(name='text_state', new=Text, workload=workload)\n",
        "app 'text_state': snapshot() returned str, not bytes"),
}


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    """The faulty apps, importable; a started cluster fails the test."""
    apps = tmp_path / "apps"
    apps.mkdir()
    for name, (tail, _) in FAULTS.items():
        (apps / f"{name}.py").write_text(MACHINE + tail, encoding="utf-8")
    monkeypatch.syspath_prepend(str(apps))
    monkeypatch.delenv("SNAPMESH_APP", raising=False)

    def started(self, *node_ids):
        raise AssertionError("a process was started for a faulty app")

    monkeypatch.setattr(Cluster, "start", started)
    yield
    for name in FAULTS:
        sys.modules.pop(name, None)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("module", FAULTS)
def test_cluster_up_refuses_a_faulty_app_in_one_line_before_anything_starts(module, faulty, tmp_path, capsys):
    from snapmesh.processes import launcher

    data_dir = tmp_path / "d"
    status = launcher.main(["up", "--nodes", "2", "--data-dir", str(data_dir), "--app", f"{module}:app", "--ui", "off"])
    assert (status, one_line(capsys)) == (2, f"snapmesh cluster: {FAULTS[module][1]}")
    assert not data_dir.exists()


@pytest.mark.parametrize("module", FAULTS)
def test_demo_refuses_the_faulty_app_its_nodes_would_inherit(module, faulty, tmp_path, capsys, monkeypatch):
    from snapmesh.bank import demo

    monkeypatch.setenv("SNAPMESH_APP", f"{module}:app")
    data_dir = tmp_path / "d"
    status = demo.main(["--nodes", "2", "--data-dir", str(data_dir), "--skip-reconcile"])
    assert (status, one_line(capsys)) == (2, f"snapmesh demo: $SNAPMESH_APP: {FAULTS[module][1]}")
    assert not data_dir.exists()


@pytest.mark.parametrize("module", FAULTS)
def test_chaos_refuses_a_faulty_app_in_one_line_before_anything_starts(module, faulty, tmp_path, capsys):
    from snapmesh.commands import chaos

    data_dir = tmp_path / "d"
    status = chaos.main(["--app", f"{module}:app", "--nodes", "2", "--duration", "1", "--data-dir", str(data_dir),
                         "--no-reconcile", "--seed", "1"])
    assert (status, one_line(capsys)) == (2, f"snapmesh chaos: {FAULTS[module][1]}")
    assert not data_dir.exists()


@pytest.mark.parametrize("module", FAULTS)
def test_app_refuses_a_faulty_app_in_one_line_before_its_first_command(module, faulty, capsys):
    from snapmesh.commands import app

    with FakeCluster(f"{module}:app") as cluster:  # the nodes say they run it: only the app itself is at fault
        status = app.main(["--app", f"{module}:app", "--controller", cluster.address, "--duration", "1",
                           "--snapshot-every", "0", "--seed", "1"])
    assert (status, one_line(capsys)) == (2, f"snapmesh app: {FAULTS[module][1]}")
    assert cluster.commands == 0


def test_every_command_says_a_fault_in_the_same_words_as_snapmesh_node(faulty, tmp_path):
    # The node's own check is the same function: its words are the ones above.
    from snapmesh.app import AppError
    from snapmesh.services.node.process import load_node_app
    from snapmesh.settings import config

    path = config.write_cluster(tmp_path / "cluster.toml", nodes=2)
    for module, (_, fault) in FAULTS.items():
        with pytest.raises(AppError) as refused:
            load_node_app(config.with_app(config.load(path, env={}), f"{module}:app"), "p1")
        assert str(refused.value) == fault

