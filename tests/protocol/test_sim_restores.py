"""Restores as blocks in the simulator (snapmesh/sim/blockrestores.py SB5), one rule at a time."""

from __future__ import annotations

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
    restores = SimRestores(Counter())
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
    assert restores.restored["n0"].state == b"abxd"  # held for the next restore (heldblocks.py)


def test_a_node_that_restarted_refuses_and_gets_the_state_whole_unchanged():
    restores = SimRestores(Counter())
    _reported(restores, b"abcd")
    restores.node_crashed("n0")  # it holds nothing now; the controller does not know
    assert restores.state_for("n0", _part(b"abxd")) == b"abxd"  # whole, one round more
    assert restores.faults["restore part refused as blocks (missing), sent whole"] == 1
    assert "n0" not in restores.restored  # the refusal changed nothing at the node


def test_after_a_controller_crash_a_part_goes_whole():
    restores = SimRestores(Counter())
    _reported(restores, b"abcd")
    restores.controller_crashed()
    assert restores.state_for("n0", _part(b"abxd")) == b"abxd" and not restores.faults


def test_a_rebuilt_state_not_the_plans_is_named():
    restores = SimRestores(Counter())
    _reported(restores, b"abcd")
    wrong = blocks.Named(b"abyd", [(0, 4)], [b"?" * 32], {})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(restoreblocks, "whole_restore", lambda request, held: (wrong, ""))
        with pytest.raises(Violation, match=r"SB5: the restore of s2 at n0: the state rebuilt .* is not the plan's"):
            restores.state_for("n0", _part(b"abxd"))
