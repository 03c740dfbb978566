"""The workloads choose only nodes they can reach: on a ring and on random-regular graphs, the load
generator's streams (per node, as the bank's load runs, and over the whole cluster, as `snapmesh app`
runs an app) send only commands that name a node's peers_out (the bank app, kvshard). Nothing is
dialled: the commands are read before they go."""

from __future__ import annotations

import itertools
import json

import pytest

from snapmesh.load.generator import LoadGenerator
from snapmesh.protocol.topology import Topology
from snapmesh.services.app import bank as bank_app
from snapmesh.services.app import kvshard
from snapmesh.services.app.drive import node_infos
from snapmesh.settings import topologies

IDS = [f"p{i}" for i in range(1, 8)]
SHAPES = ["ring", "random-regular:1", "random-regular:2", "random-regular:3"]


def _topology(spec: str) -> Topology:
    return Topology.build(IDS, topologies.channels(spec, IDS, seed=4))


def _load(app, topology: Topology, *, per_node: bool) -> LoadGenerator:
    infos = node_infos(IDS, topology.channels, {"max_amount": 20})
    return LoadGenerator(app, {n: f"127.0.0.1:{i + 1}" for i, n in enumerate(IDS)}, infos, seed=3, per_node=per_node)


@pytest.mark.parametrize("spec", SHAPES)
def test_the_bank_load_pays_only_along_channels(spec: str) -> None:
    topology = _topology(spec)
    load = _load(bank_app.app, topology, per_node=True)
    streams = load.streams(2)
    assert len(streams) == 2 * len(IDS)
    for stream in streams:
        home = stream.rpartition(":")[0]
        sent = list(itertools.islice(load.commands(stream), 20))
        assert len(sent) == 20 and {node for node, _ in sent} == {home}, (spec, stream)
        transfers = [json.loads(command) for _, command in sent]
        assert {t["to"] for t in transfers} <= set(topology.outgoing(home)), (spec, home)
        assert all(1 <= t["amount"] <= 20 for t in transfers), transfers
        # As json.dumps writes {"to": ..., "amount": ...}: the bank reads it without json.loads.
        assert all(bank_app._PLAIN_TRANSFER.fullmatch(command) for _, command in sent), sent[:3]


@pytest.mark.parametrize("spec", SHAPES)
@pytest.mark.parametrize("app, to", [(bank_app.app, lambda c: c["to"]),
                                     (kvshard.app, lambda c: c.get("to"))])
def test_an_apps_load_names_only_peers_out(spec: str, app, to) -> None:
    topology = _topology(spec)
    load = _load(app, topology, per_node=False)
    assert load.streams(1) == ["0"]
    named = [(node, to(json.loads(command))) for node, command in itertools.islice(load.commands("0"), 600)]
    assert len(named) == 600 and any(dst for _, dst in named), named[:5]
    wrong = [(node, dst) for node, dst in named if dst is not None and dst not in topology.outgoing(node)]
    assert not wrong, f"{spec}: commands naming a node with no channel from the submitter: {wrong[:5]}"
