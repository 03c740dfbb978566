"""Restores as blocks in the simulator (snapmesh/sim/blockrestores.py SB5), one rule at a time."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from snapmesh.protocol import blocks, restoreblocks
from snapmesh.sim.blockrestores import SimRestores
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb


def _report(state: bytes, parts: list[int]) -> pb.FullState:
    return pb.FullState(snapshot_id="s5", node_id="n0", state=state, state_parts=parts)


def _part(state: bytes) -> pb.RestoreStateRequest:
    return pb.RestoreStateRequest(snapshot_id="s2", epoch=2, state=state)


def _reported(restores: SimRestores, state: bytes) -> None:
    message = _report(state, [1] * len(state))
    restores.formed("n0", message)
    restores.accepted("n0", message)


def test_the_node_gets_only_the_blocks_it_lacks_and_rebuilds_the_plans_state():
    restores = SimRestores(random.Random(0), Counter())
    _reported(restores, b"abcd")
    sent = []
    real = restoreblocks.referenced_restore

    def spy(request, held, parts=()):
        out = real(request, held, parts)
        sent.append(out[0])
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(restoreblocks, "referenced_restore", spy)
        assert restores.state_for("n0", _part(b"abxd")) == b"abxd"
    assert list(sent[0].blocks) == [b"x"] and restores.faults["restore part sent as blocks"] == 1
    assert set(restores.slots["n0"][1].values()) == {b"a", b"b", b"x", b"d"}  # held for the next restore (heldblocks.py)
    assert restores.taken["n0"][0] >= set(blocks.names(b"abxd", [1, 1, 1, 1])[0].names)  # and taken to be (nodeblocks.py)


def test_a_node_that_lost_its_blocks_refuses_and_gets_the_state_whole_unchanged():
    restores = SimRestores(random.Random(0), Counter())
    _reported(restores, b"abcd")
    restores.rng.random = lambda: 0.0  # type: ignore[method-assign]  # the crash loses every unsynced copy
    restores.node_crashed("n0")  # it holds nothing now; the controller does not know
    assert restores.state_for("n0", _part(b"abxd")) == b"abxd"  # whole, one round more
    assert restores.faults["restore part refused as blocks (missing), sent whole"] == 1
    assert "n0" not in restores.slots  # the refusal changed nothing at the node
    assert "n0" not in restores.taken  # and the controller forgot what it took the node to hold


def test_a_node_that_restarted_with_its_shelf_rebuilds_from_it():
    restores = SimRestores(random.Random(0), Counter())
    _reported(restores, b"abcd")
    restores.rng.random = lambda: 1.0  # type: ignore[method-assign]  # the crash keeps every copy (RB4)
    restores.node_crashed("n0")
    assert restores.state_for("n0", _part(b"abxd")) == b"abxd"
    assert restores.faults["restore part sent as blocks"] == 1 and not restores.faults["held block lost in a node crash"]


def test_a_restarted_controller_takes_back_only_what_kept_manifests_name():
    restores = SimRestores(random.Random(0), Counter())
    _reported(restores, b"abcd")  # its report of s5
    restores.controller_restarted({})  # s5 not filed: nothing taken back, the part goes whole
    assert restores.taken == {} and restores.state_for("n0", _part(b"abxd")) == b"abxd"
    assert not restores.faults["restore part sent as blocks"]
    stored = pb.Snapshot(snapshot_id="s5", nodes=[pb.NodeBalance(node_id="n0")])
    stored.nodes[0].state_blocks.hashes.extend(blocks.names(b"abcd", [1, 1, 1, 1])[0].names)
    restores.controller_restarted({"s5": stored})
    assert restores.state_for("n0", _part(b"abxd")) == b"abxd" and restores.faults["restore part sent as blocks"] == 1


def test_a_rebuilt_state_not_the_plans_is_named():
    restores = SimRestores(random.Random(0), Counter())
    _reported(restores, b"abcd")
    wrong = blocks.Named(b"abyd", [(0, 4)], [b"?" * 32], {})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(restoreblocks, "whole_restore", lambda request, held: (wrong, ""))
        with pytest.raises(Violation, match=r"SB5: the restore of s2 at n0: the state rebuilt .* is not the plan's"):
            restores.state_for("n0", _part(b"abxd"))
