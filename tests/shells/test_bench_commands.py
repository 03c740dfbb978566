"""The commands `python -m bench submit_batch` sends each app are commands the app takes.

The bench's smoke run starts the minimal app's mesh only; here every app's
batch, as the bench builds it for each node of a 4-node mesh, runs through the
app itself (snapmesh.app.testing, no cluster), twice, as the bench sends the
same batch again and again: no command is refused, and each sends the
messages the bench says it does (one for minimal and bank, none for kvshard).
"""

from __future__ import annotations

import itertools

import pytest

from bench.submit_batch import APPS
from snapmesh.app import Refused, load_app
from snapmesh.app.testing import Cluster

NODES = ("p1", "p2", "p3", "p4")
MESSAGES = {"minimal": 1, "bank": 1, "kvshard": 0}


@pytest.mark.parametrize("name", list(APPS))
def test_every_command_of_a_bench_batch_is_taken_and_sends_what_the_bench_says(name: str) -> None:
    spec, params, commands = APPS[name]
    cluster = Cluster(load_app(spec), channels=list(itertools.permutations(NODES, 2)), params=params)
    for _ in range(2):
        for node in NODES:
            batch = commands(node, sorted(p for p in NODES if p != node), 50)
            assert len(batch) == 50
            for command in batch:
                before = len(cluster.pending())
                reply = cluster.command(node, command)
                assert not isinstance(reply, Refused), (node, command, reply)
                assert len(cluster.pending()) - before == MESSAGES[name], (node, command)
                cluster.drain()
