"""`snapmesh app` imports only the app it was told to drive, never one a node names.

The app is `--app`, else $SNAPMESH_APP, else the [app] of `--data-dir`'s cluster
file. A node whose GetState reports another module (a rogue node, or anyone at its
address on a plaintext cluster) is refused in one line naming the node, what it
reports and what was expected (exit 2): its module is not imported (it would leave
a file behind if it were), and no command is sent.
"""

from __future__ import annotations

import sys
import tomllib

import pytest

from snapmesh.settings import config
from support.fake_cluster import FakeCluster
from support.idle_app import idle_app

pytestmark = pytest.mark.timeout(60)

GOOD = idle_app() + '''
app = App(name="{name}", new=Machine, workload=workload)
'''

# What a rogue node would have the client run: importing it is the harm.
ROGUE = '''
import pathlib

pathlib.Path({marker!r}).write_text("imported")
''' + GOOD


@pytest.fixture
def apps(tmp_path, monkeypatch):
    """good_app (the app the client drives) and rogue_app (a marker file once imported)."""
    where = tmp_path / "apps"
    where.mkdir()
    marker = tmp_path / "rogue-was-imported"
    (where / "good_app.py").write_text(GOOD.replace("{name}", "good"), encoding="utf-8")
    # Its App has the same name, as a rogue's would: a check by App.name cannot tell them apart.
    (where / "rogue_app.py").write_text(ROGUE.replace("{marker!r}", repr(str(marker))).replace("{name}", "good"),
                                        encoding="utf-8")
    monkeypatch.syspath_prepend(str(where))
    monkeypatch.delenv("SNAPMESH_APP", raising=False)
    yield marker
    for name in ("good_app", "rogue_app"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("named_by", ["--app", "$SNAPMESH_APP", "the cluster file"])
def test_a_node_reporting_another_app_is_refused_and_its_module_never_imported(named_by, apps, tmp_path, capsys,
                                                                               monkeypatch):
    from snapmesh.commands import app

    with FakeCluster({"p1": "rogue_app:app", "p2": "good_app:app"}) as cluster:
        argv = ["--controller", cluster.address, "--duration", "1", "--snapshot-every", "0", "--seed", "1"]
        if named_by == "--app":
            argv += ["--app", "good_app:app"]
            how = "--app"
        elif named_by == "$SNAPMESH_APP":
            monkeypatch.setenv("SNAPMESH_APP", "good_app:app")
            how = "$SNAPMESH_APP"
        else:
            path = config.write_cluster(tmp_path / "d" / "cluster.toml", nodes=2)
            config.write(path, {**tomllib.loads(path.read_text()), "app": {"module": "good_app:app"}})
            argv += ["--data-dir", str(path.parent)]
            how = f"[app] of {path}"
        status = app.main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.strip().splitlines() == [
        f"snapmesh app: node p1 at {cluster.nodes['p1']} reports the app 'rogue_app:app', not the app "
        f"'good_app:app' ({how}): refusing to drive a cluster that runs another app"]
    assert not apps.exists() and "rogue_app" not in sys.modules  # never imported
    assert cluster.commands == 0


def test_the_banks_workload_refuses_a_node_that_runs_an_app(apps, capsys):
    from snapmesh.commands import app

    with FakeCluster({"p1": "", "p2": "rogue_app:app"}) as cluster:
        status = app.main(["--controller", cluster.address, "--duration", "1", "--snapshot-every", "0"])
    assert status == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"snapmesh app: node p2 at {cluster.nodes['p2']} reports the app 'rogue_app:app', not the bank "
        "(no --app given): refusing to drive a cluster that runs another app"]
    assert not apps.exists() and "rogue_app" not in sys.modules


def test_a_built_in_named_either_way_is_the_same_app(apps, capsys):
    from snapmesh.commands import app

    # kvshard by its name and by its module:attr: no refusal, the workload runs (and sends commands).
    with FakeCluster("snapmesh.services.app.kvshard:app") as cluster:
        app.main(["--app", "kvshard", "--controller", cluster.address, "--duration", "0.5", "--snapshot-every", "0",
                  "--seed", "1"])
    assert "refusing" not in capsys.readouterr().err
    assert cluster.commands > 0
