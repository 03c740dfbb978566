"""`snapmesh chaos --app X` on the compose stack and on the multi-host bench (issue 46).

Both were refused ("an app runs on local processes only"). Now the app reaches every
process of either cluster as a deployment gives it, and the campaign drives its
workload (snapmesh.chaos.appmode). No Docker, no root here: what is checked is what
each backend would start the cluster with, and that `snapmesh chaos` hands the app
to the campaign. The campaigns themselves run in tests/deploy and tests/hosts.
"""

from __future__ import annotations

import json

import pytest

from snapmesh.chaos.campaign import Options
from snapmesh.commands import chaos

pytestmark = pytest.mark.timeout(60)


class _Ran(Exception):
    pass


@pytest.fixture
def campaign(monkeypatch):
    """chaos.main up to the campaign: what it would run, and on which backend."""
    seen = {}

    class Campaign:
        def __init__(self, options, backend, say=print):
            seen.update(options=options, backend=backend)
            raise _Ran()

    from snapmesh.chaos import compose
    from snapmesh.hosts import net

    monkeypatch.setattr(chaos, "Campaign", Campaign)
    monkeypatch.setattr(compose, "engine_problem", lambda: "")
    monkeypatch.setattr(net, "missing_rights", lambda: "")
    monkeypatch.delenv("SNAPMESH_APP", raising=False)
    return seen


@pytest.mark.parametrize("lane", ["--compose", "--hosts"])
def test_chaos_takes_an_app_on_either_cluster(lane, campaign, tmp_path, capsys):
    with pytest.raises(_Ran):
        chaos.main([lane, "--app", "kvshard", "--seed", "1", "--duration", "1", "--data-dir", str(tmp_path / "d")])
    assert campaign["options"].app == "kvshard"
    assert campaign["backend"].__name__ == ("ComposeBackend" if lane == "--compose" else "HostsBackend")
    assert "the app kvshard's workload" in capsys.readouterr().out


def test_chaos_runs_the_app_a_deployment_is_given(campaign, tmp_path, monkeypatch):
    monkeypatch.setenv("SNAPMESH_APP", "kvshard")
    with pytest.raises(_Ran):
        chaos.main(["--compose", "--seed", "1", "--duration", "1", "--data-dir", str(tmp_path / "d")])
    assert campaign["options"].app == "kvshard"


def test_the_compose_backend_gives_every_container_the_app(tmp_path, monkeypatch):
    from snapmesh.chaos.compose import ComposeBackend

    monkeypatch.setenv("SNAPMESH_APP_PARAMS", json.dumps({"keys": 3}))
    monkeypatch.setenv("SNAPMESH_IMAGE", "my-app:1")
    backend = ComposeBackend(Options(app="kvshard"), tmp_path, say=print)
    assert (backend.env["SNAPMESH_APP"], backend.env["SNAPMESH_APP_PARAMS"]) == ("kvshard", '{"keys": 3}')
    assert backend.env["SNAPMESH_IMAGE"] == "my-app:1"
    assert (backend.config.app.module, dict(backend.config.app.params)) == ("kvshard", {"keys": 3})
    monkeypatch.delenv("SNAPMESH_IMAGE")
    bank = ComposeBackend(Options(), tmp_path, say=print)
    assert bank.env["SNAPMESH_APP"] == "" and "SNAPMESH_APP_PARAMS" not in bank.env
    assert bank.config.app.module == "" and bank.env["SNAPMESH_IMAGE"] == "snapmesh:latest"


def test_the_hosts_backend_gives_every_process_the_app(tmp_path, monkeypatch):
    from snapmesh.chaos.hosts import HostsBackend
    from snapmesh.processes.supervisor import Cluster

    monkeypatch.setenv("SNAPMESH_APP", "bank")  # this process's: the campaign's app goes over it
    backend = HostsBackend(Options(app="kvshard", nodes=2), tmp_path, say=print)
    assert backend.config.app.module == "kvshard"
    cluster = Cluster(backend.config_path, hosts={})
    backend.give_app(cluster)
    assert {child.env["SNAPMESH_APP"] for child in (cluster.controller, *cluster.nodes.values())} == {"kvshard"}
    assert "kvshard" in backend.config_path.read_text()


def test_chaos_refuses_bad_params_in_one_line_before_anything_starts(campaign, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SNAPMESH_APP_PARAMS", '{"keys": 3')
    status = chaos.main(["--compose", "--app", "kvshard", "--seed", "1", "--duration", "1",
                         "--data-dir", str(tmp_path / "d")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "options" not in campaign, err
    assert len(err.splitlines()) == 1 and err.startswith("snapmesh chaos: $SNAPMESH_APP_PARAMS: not JSON"), err
