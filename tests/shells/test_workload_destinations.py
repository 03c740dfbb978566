"""The workloads choose only nodes they can reach: on a ring and on random-regular graphs, the bank's
load generator pays only along a node's channels out, and an app's drive (the bank app, kvshard) sends
only commands that name a node's peers_out. Nothing is dialled: the requests are read before they go."""

from __future__ import annotations

import json
import random

import pytest

from snapmesh.bank.load import LoadGenerator
from snapmesh.protocol.topology import Topology
from snapmesh.services.app import bank as bank_app
from snapmesh.services.app import kvshard
from snapmesh.services.app.drive import Driver, node_infos
from snapmesh.settings import topologies
from snapmesh.v1 import snapmesh_pb2 as pb

IDS = [f"p{i}" for i in range(1, 8)]
SHAPES = ["ring", "random-regular:1", "random-regular:2", "random-regular:3"]


def _topology(spec: str) -> Topology:
    return Topology.build(IDS, topologies.channels(spec, IDS, seed=4))


@pytest.mark.parametrize("spec", SHAPES)
def test_the_bank_load_pays_only_along_channels(spec: str) -> None:
    topology = _topology(spec)
    load = LoadGenerator({n: f"127.0.0.1:{i + 1}" for i, n in enumerate(IDS)},
                         {n: topology.outgoing(n) for n in IDS}, batch=20, seed=3)
    rng = random.Random(3)
    for node in IDS:
        for _ in range(20):
            request = pb.TransferBatchRequest.FromString(load._request(node, rng)[0])
            assert {t.to for t in request.transfers} <= set(topology.outgoing(node)), (spec, node)


class _Recorded(Driver):
    """The drive as it runs, its commands kept instead of sent."""

    def submit(self, node: str, command: bytes, request_id: str):
        self.sent.append((node, command))
        if len(self.sent) >= 600:
            self.stop()
        return None


@pytest.mark.parametrize("spec", SHAPES)
@pytest.mark.parametrize("app, to", [(bank_app.app, lambda c: c["to"]),
                                     (kvshard.app, lambda c: c.get("to"))])
def test_an_apps_drive_names_only_peers_out(spec: str, app, to) -> None:
    topology = _topology(spec)
    infos = node_infos(IDS, topology.channels, {})
    driver = _Recorded(app, {}, infos, seed=5)
    driver.sent = []
    driver.run()
    named = [(node, to(json.loads(command))) for node, command in driver.sent]
    assert len(named) >= 600 and any(dst for _, dst in named), named[:5]
    wrong = [(node, dst) for node, dst in named if dst is not None and dst not in topology.outgoing(node)]
    assert not wrong, f"{spec}: commands naming a node with no channel from the submitter: {wrong[:5]}"
