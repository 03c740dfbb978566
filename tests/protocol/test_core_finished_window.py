"""Bounded memory: core.Process remembers the FINISHED_WINDOW newest finished snapshots, not every one."""

from __future__ import annotations

import pytest

from snapmesh.protocol.node import core


def finish(p: core.Process, sid: str) -> None:
    p.start_snapshot(sid)
    effects = p.receive(src="X", message=core.Marker(snapshot_id=sid))
    assert any(isinstance(e, core.SnapshotCompleted) for e in effects)


def test_finished_snapshots_are_kept_for_a_window_only() -> None:
    p = core.Process(node_id="P", incoming=["X"], outgoing=[])
    total = 2 * core.FINISHED_WINDOW + 5
    for i in range(total):
        finish(p, f"s{i}")
    kept = [i for i in range(total) if p.phase(f"s{i}") is core.Phase.COMPLETED]
    assert kept == list(range(total - core.FINISHED_WINDOW, total))
    # A late marker inside the window is still known; past it, it starts over
    # (R5: dropped later by the node's recording ttl, refused by the controller).
    with pytest.raises(core.RemoteProtocolError, match="second marker"):
        p.receive(src="X", message=core.Marker(snapshot_id=f"s{total - 1}"))
    assert p.phase("s0") is core.Phase.IDLE


def test_abandoned_ids_given_at_start_are_bounded_too() -> None:
    p = core.Process(node_id="P", incoming=["X"], outgoing=[],
                     abandoned=[f"a{i}" for i in range(core.FINISHED_WINDOW + 10)])
    assert p.phase("a0") is core.Phase.IDLE
    assert p.phase(f"a{core.FINISHED_WINDOW + 9}") is core.Phase.ABANDONED
