"""gridmemo.py GM6: the memo of each node's last off-grid state filed forgets a node once it
has left the cluster (a rescale's Adopt: engine.py `_adopt`; the controller's start:
process.py), and a filing under way that names it keeps it not; the nodes that stay keep
theirs. Before, a node that left was held (its manifest and grid names) for as long as the
controller ran."""

from __future__ import annotations

import asyncio
import dataclasses

from snapmesh.protocol import blocks
from snapmesh.protocol.topology import Topology
from snapmesh.services.controller.gridmemo import Found, GridMemo
from snapmesh.settings import config
from support.controller_fakes import blob_controller


def found(seed: int) -> Found:
    name = blocks.block_hash(bytes([seed]) * 10)
    return Found(offsets=[0], names=[name], sizes=[10], grid=[name], total=10)


def test_a_node_that_left_is_forgotten_and_not_kept_again_and_the_others_stay():
    memo = GridMemo()
    for seed, node in enumerate(["p1", "p2", "p3"]):
        memo.keep(node, found(seed))
    memo.members(["p1", "p3", "p4"])
    assert [memo.holds(n) for n in ("p1", "p2", "p3")] == [True, False, True]
    memo.keep("p2", found(7))  # a filing under way of a snapshot from before the rescale
    assert not memo.holds("p2")
    memo.keep("p4", found(8))  # one that joined
    assert memo.holds("p4")
    memo.members(["p1", "p2", "p3", "p4"])  # back again: kept from now on, starting empty (GM4)
    memo.keep("p2", found(9))
    assert memo.holds("p2")


def test_a_rescale_s_adopt_forgets_the_nodes_that_left(tmp_path):
    asyncio.run(_adopted(tmp_path))


async def _adopted(tmp_path) -> None:
    c = blob_controller(tmp_path)
    memo = c.store.grids
    for seed, node in enumerate(["a", "b"]):
        memo.keep(node, found(seed))
    smaller = Topology.build(["a"])
    c.engine._read = dataclasses.replace(config.load(config.DEFAULT_CONFIG), nodes=[], topology=smaller)
    c.engine._adopt(smaller)
    assert memo.holds("a") and not memo.holds("b")
    await c.engine.close()
    await c.journal.close()
    c.writer.close()
