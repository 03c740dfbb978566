"""$SNAPMESH_APP_PARAMS: a deployment gives every process the app's params as one JSON object.

A container has no cluster file of its own to edit (Compose, Swarm, Helm and the EC2
instance give SNAPMESH_APP and SNAPMESH_APP_PARAMS to each process instead), so the
variable stands in for the [app] params wherever they are read: the nodes' and the
controller's cluster file, `snapmesh app` (the load generator), the page's describe and
the reconcile job. A value that is not a JSON object stops each of them at start with
one line naming the variable (exit 2), before anything is served or sent.
"""

from __future__ import annotations

import sys

import pytest

from snapmesh.settings import config
from support.fake_cluster import FakeCluster
from support.idle_app import idle_app

pytestmark = pytest.mark.timeout(60)

# The app refuses a node whose params are not the ones the deployment gives.
SIZED = idle_app('''
if dict(info.params) != {"size": 3, "name": "inventory"}:
    raise ValueError(f"params {dict(info.params)}")
''') + '''
app = App(name="sized", new=Machine, workload=workload)
'''
PARAMS = '{"size": 3, "name": "inventory"}'
BAD = ['{"size": 3', '[1, 2]', 'size=3']


@pytest.fixture
def sized(tmp_path, monkeypatch):
    (tmp_path / "sized_app.py").write_text(SIZED, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SNAPMESH_APP", raising=False)
    monkeypatch.delenv("SNAPMESH_APP_PARAMS", raising=False)
    yield "sized_app:app"
    sys.modules.pop("sized_app", None)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_the_variables_stand_in_for_the_files_app_table(tmp_path):
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=2, settings={"app": {"module": "bank", "size": 1}})
    cfg = config.load(path, env={"SNAPMESH_APP": "kvshard", "SNAPMESH_APP_PARAMS": PARAMS})
    assert (cfg.app.module, dict(cfg.app.params)) == ("kvshard", {"size": 3, "name": "inventory"})
    assert dict(config.load(path, env={}).app.params) == {"size": 1}  # unset: the file's


@pytest.mark.parametrize("bad", BAD)
def test_a_node_and_the_controller_refuse_bad_params_in_one_line(bad, tmp_path, capsys, monkeypatch):
    from snapmesh.services.controller import process as controller
    from snapmesh.services.node import process as node

    path = config.write_cluster(tmp_path / "cluster.toml", nodes=2)
    monkeypatch.setenv("SNAPMESH_APP", "kvshard")
    monkeypatch.setenv("SNAPMESH_APP_PARAMS", bad)
    for name, main, extra in (("node", node.main, ["--id", "p1"]), ("controller", controller.main, [])):
        assert main(["--config", str(path), *extra]) == 2
        line = one_line(capsys)
        assert line.startswith(f"snapmesh {name}: {path}: SNAPMESH_APP_PARAMS: "), line


def test_the_load_generator_gives_the_workload_the_params(sized, capsys, monkeypatch):
    from snapmesh.commands import app

    monkeypatch.setenv("SNAPMESH_APP", sized)
    with FakeCluster(sized) as cluster:  # without the params the app's pre-flight refuses (exit 2)
        monkeypatch.setenv("SNAPMESH_APP_PARAMS", PARAMS)
        status = app.main(["--controller", cluster.address, "--duration", "0.5", "--snapshot-every", "0",
                           "--seed", "1"])
        assert cluster.commands > 0, capsys.readouterr()
        assert status == 0
        monkeypatch.delenv("SNAPMESH_APP_PARAMS")
        assert app.main(["--controller", cluster.address, "--duration", "0.5", "--snapshot-every", "0"]) == 2


@pytest.mark.parametrize("bad", BAD)
def test_the_load_generator_and_the_page_refuse_bad_params_in_one_line(bad, sized, capsys, monkeypatch):
    from snapmesh.commands import app
    from snapmesh.ui import server

    monkeypatch.setenv("SNAPMESH_APP", sized)
    monkeypatch.setenv("SNAPMESH_APP_PARAMS", bad)
    with FakeCluster(sized) as cluster:
        assert app.main(["--controller", cluster.address, "--duration", "0.5", "--snapshot-every", "0"]) == 2
        assert one_line(capsys).startswith("snapmesh app: $SNAPMESH_APP_PARAMS: ")
        assert cluster.commands == 0
        monkeypatch.setattr(server, "serve", lambda *a: pytest.fail("the page served with bad params"))
        assert server.main(["--controller", cluster.address, "--listen", "127.0.0.1:0"]) == 2
        assert one_line(capsys).startswith("snapmesh ui: $SNAPMESH_APP_PARAMS: ")


def test_the_page_describes_with_the_params(monkeypatch):
    from snapmesh.app import App
    from snapmesh.checking import described
    from snapmesh.v1 import snapmesh_pb2 as pb

    seen = App(name="seen", new=lambda info: None, describe=lambda view: dict(view.params))
    snap = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE, app=pb.AppCheck(spec="seen_app:app"))
    about = described.describe(snap, load=lambda spec: seen, params={"size": 3})
    assert about is not None and about.summary == {"size": 3}


def test_the_reconcile_job_takes_the_app_and_its_params_from_the_environment(tmp_path, monkeypatch):
    pytest.importorskip("pyspark")
    from snapmesh.reconcile import invariants, job

    (tmp_path / "cluster.toml").write_text('[app]\nmodule = "kvshard"\nsize = 1\n', encoding="utf-8")
    monkeypatch.delenv("SNAPMESH_APP", raising=False)
    monkeypatch.delenv("SNAPMESH_APP_PARAMS", raising=False)
    assert job.parser().parse_args(["--data-dir", "d"]).app is None  # the bank: the log checks only, as before
    assert invariants.cluster_params(str(tmp_path)) == {"size": 1}
    monkeypatch.setenv("SNAPMESH_APP", "kvshard")
    monkeypatch.setenv("SNAPMESH_APP_PARAMS", PARAMS)
    assert job.parser().parse_args(["--data-dir", "d"]).app == "kvshard"
    assert job.parser().parse_args(["--data-dir", "d", "--app", "sized_app:app"]).app == "sized_app:app"
    assert invariants.cluster_params(str(tmp_path)) == {"size": 3, "name": "inventory"}
    monkeypatch.setenv("SNAPMESH_APP_PARAMS", BAD[0])
    with pytest.raises(invariants.InputError, match="SNAPMESH_APP_PARAMS: not JSON"):
        invariants.cluster_params(str(tmp_path))
