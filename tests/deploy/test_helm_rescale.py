"""The chart's rescale (rescale.snapshot with another nodes.replicas), rendered and run here.

No Kubernetes API server runs here, so the rendered pieces are run on a local
kvshard cluster whose node ids are the chart's (node-0..node-3): it stops with a
snapshot under load, its cluster file is rewritten for node-0..node-5 (as the
upgrade's ConfigMap is), every node runs the rendered `fenced-log` init
container's command (node-4 and node-5, with no log, get a fenced one; the kept
nodes keep theirs), the 6 nodes start (the new ones fenced: a command is refused
until the restore), and the rendered post-upgrade Job's `snapmesh restore` runs
against the controller: RESTORED, every key of the cut once on the 6 nodes; run
again, the same restore answers (its request id). The upgrade's refusals and
acceptance against a running StatefulSet are tests/deploy/test_helm_chart.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import grpc
import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.settings import config, rescaling
from snapmesh.settings.ports import free_ports
from snapmesh.v1 import snapmesh_pb2 as pb
from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc
from support.helm_chart import REPO, one, render
from support.kvload import Load, cut_keys
from support.polling import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

SNAPSHOT = "20261129T140513.770624Z-670420ae"  # the render's; the run's own id replaces it below
OLD = [f"node-{i}" for i in range(4)]
NEW = [f"node-{i}" for i in range(6)]


def rendered(snapshot: str) -> tuple[str, list[str]]:
    """The node pods' fenced-log command (a shell line) and the rescale Job's args."""
    objects = render({"nodes.replicas": 6, "rescale.snapshot": snapshot, "app.module": "kvshard", "tls.enabled": False})
    pod = one(objects, "StatefulSet", "snapmesh-node")["spec"]["template"]["spec"]
    init = {c["name"]: c for c in pod["initContainers"]}
    assert list(init) == ["fenced-log"] and init["fenced-log"]["command"] == ["/bin/sh", "-c"]
    job = one(objects, "Job", "snapmesh-rescale")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-upgrade"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["restore", snapshot, "--nodes", ",".join(NEW), "--request-id", f"rescale {snapshot} onto 6",
                    "--controller", "snapmesh-controller:50050", "--timeout", "300", "--yes"]
    return init["fenced-log"]["args"][0], args


def test_the_chart_renders_no_rescale_by_default():
    objects = render({"app.module": "kvshard"})
    assert not [o for o in objects if o["metadata"]["name"] == "snapmesh-rescale"]
    pod = one(objects, "StatefulSet", "snapmesh-node")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["own-key"], "TLS's init container alone"
    with_tls = one(render({"rescale.snapshot": SNAPSHOT, "app.module": "kvshard"}), "StatefulSet", "snapmesh-node")
    assert [c["name"] for c in with_tls["spec"]["template"]["spec"]["initContainers"]] == ["fenced-log", "own-key"]


def test_the_native_bank_cannot_be_rescaled_by_the_chart():
    from support.helm_chart import CHART, helm

    result = helm("template", "snapmesh", str(CHART), "--set", f"rescale.snapshot={SNAPSHOT}", check=False)
    assert result.returncode != 0 and "rescale.snapshot: the native bank has no rescale" in result.stderr


def test_the_rendered_fenced_log_and_rescale_job_grow_a_cluster_from_4_to_6_nodes(tmp_path):
    path = config.write_cluster(tmp_path / "cluster.toml", nodes=OLD)
    with Cluster(path, app="kvshard") as cluster:
        with Load(cluster.config, "a") as load, grpc.insecure_channel(cluster.controller_address) as channel:
            wait_for(lambda: len(load.created) >= 30, timeout=60, what="30 keys created under load")
            stopped = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(stop=True), timeout=120)
        assert stopped.status == pb.Snapshot.COMPLETE, stopped.reason
        wait_for(lambda: all(cluster.node(n).wait(1) is not None for n in OLD), timeout=30, what="the nodes exit")
        fenced_log, job = rendered(stopped.snapshot_id)

        document = tomllib.loads(path.read_text())  # the upgrade's ConfigMap: node-0..node-5
        grown = rescaling.rescaled(document, 6, free_ports(4))
        for node, name in zip(grown["nodes"][4:], NEW[4:], strict=True):
            node["id"] = name
        config.write(path, grown)
        env = dict(os.environ, SNAPMESH_APP="kvshard", PYTHONPATH=str(REPO))
        line = fenced_log.replace("exec python ", f"exec {sys.executable} ").replace("/etc/snapmesh/cluster.toml",
                                                                                    str(path))
        said = {}
        for i in range(6):
            ran = subprocess.run(["/bin/sh", "-c", line], env={**env, "POD_NAME": f"snapmesh-node-{i}"}, cwd=REPO,
                                 capture_output=True, text=True, timeout=60)
            assert ran.returncode == 0, ran.stderr
            said[f"node-{i}"] = ran.stderr.strip().rsplit(": ", 1)[-1]
        assert said == {**{n: "kept" for n in OLD}, "node-4": f"fenced for {stopped.snapshot_id}",
                        "node-5": f"fenced for {stopped.snapshot_id}"}, said

        six = Cluster(path, app="kvshard", controller=False)
        try:
            six.start()
            with grpc.insecure_channel(six.config.node("node-5").address) as channel:
                with pytest.raises(grpc.RpcError) as fenced:
                    pb_grpc.NodeStub(channel).Submit(pb.SubmitRequest(command=b'{"op": "put", "key": "node-5/x", '
                                                                      b'"value": 1}'), timeout=10)
            assert fenced.value.code() == grpc.StatusCode.UNAVAILABLE, "a new node waits fenced for the restore"
            args = [*job[:job.index("--controller") + 1], cluster.controller_address, *job[job.index("--timeout"):]]
            runs = [subprocess.run([sys.executable, "-m", "snapmesh.cli", *args], cwd=REPO, capture_output=True,
                                   text=True, timeout=300, env=env) for _ in range(2)]
            for ran in runs:
                assert ran.returncode == 0, ran.stderr + ran.stdout
            assert runs[0].stdout.splitlines()[0] == runs[1].stdout.splitlines()[0], "the retry is the same restore"
            assert runs[0].stdout.startswith(f"snapshot {stopped.snapshot_id}  epoch 2  RESTORED"), runs[0].stdout
            assert "rescaled from 4 nodes (node-0, node-1, node-2, node-3) onto 6: the app's rescale made" in runs[0].stdout
            with grpc.insecure_channel(cluster.controller_address) as channel:
                after = pb_grpc.ControllerStub(channel).TriggerSnapshot(pb.TriggerSnapshotRequest(wait=True), timeout=60)
            assert after.status == pb.Snapshot.COMPLETE and sorted(n.node_id for n in after.nodes) == NEW, after.reason
            assert sorted(cut_keys(after)) == sorted(cut_keys(stopped)), "every key of the cut once, on 6 nodes"
            assert json.loads(after.nodes[5].state)["keys"] or json.loads(after.nodes[4].state)["keys"], "re-homed"
        finally:
            six.stop()
