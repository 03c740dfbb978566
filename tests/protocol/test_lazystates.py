"""An app's View of a snapshot reads each node's state when asked for
(snapmesh/protocol/lazystates.py L1-L2): no copy of every state at once."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from snapmesh.app import App, check_invariants
from snapmesh.protocol.appstate import view_of
from snapmesh.v1 import snapmesh_pb2 as pb

MIB = 1024 * 1024


def snapshot(sizes: dict[str, int]) -> pb.Snapshot:
    out = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE)
    for i, (node, size) in enumerate(sizes.items()):
        out.nodes.add(node_id=node, state=bytes([i + 1]) * size)
    return out


def test_the_states_are_the_snapshots_in_its_order_and_an_unknown_node_is_named():
    view = view_of(snapshot({"p2": 3, "p1": 2}))
    assert list(view.states) == ["p2", "p1"] and len(view.states) == 2
    assert view.states == {"p2": b"\x01\x01\x01", "p1": b"\x02\x02"}
    assert view.states["p1"] == b"\x02\x02" and "p3" not in view.states and view.states.get("p3") is None
    with pytest.raises(KeyError, match="no node 'p3' in this snapshot"):
        view.states["p3"]
    assert "<3 bytes>" in repr(view.states)


def test_invariants_that_read_the_states_one_by_one_hold_one_at_a_time():
    whole = snapshot({f"p{i}": 8 * MIB for i in range(1, 5)})

    def each_state_nonempty(view) -> list[str]:
        return [node for node, state in view.states.items() if not state]

    app = App(name="blob", new=lambda info: None, invariants={"nonempty": each_state_nonempty})
    gc.collect()
    tracemalloc.start()
    try:
        assert check_invariants(app, view_of(whole)) == {"nonempty": []}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 8 * MIB + MIB, f"the check held {peak / MIB:.1f} MiB: more than a state or two of 8 MiB"


def test_sizes_read_no_state_a_listed_ones_is_its_entrys_size():
    """L4: `View.sizes` of the controller's view is each entry's size, a listed state's
    (its block list, no bytes) from its `state_bytes`, the reader never called; a view
    over a plain mapping measures its states."""
    from snapmesh.app import View
    from snapmesh.protocol import lazystates

    listed = snapshot({"p1": 3, "p2": 0})
    entry = listed.nodes.add(node_id="p3", state_digest="sha256:00", state_bytes=5 * MIB)
    entry.state_blocks.hashes.extend([b"\x01" * 32, b"\x02" * 32])

    def no_read(node, snapshot_id):
        raise AssertionError(f"the state of {node.node_id} was read for its size")

    view = lazystates.with_reader(no_read, lambda: view_of(listed))
    assert view.sizes == {"p1": 3, "p2": 0, "p3": 5 * MIB} and list(view.sizes) == ["p1", "p2", "p3"]
    with pytest.raises(AssertionError, match="p3 was read"):
        view.states["p3"]  # the states themselves are still read
    plain = View(snapshot_id="s1", states={"a": b"xy", "b": b""}, in_flight=[])
    assert plain.sizes == {"a": 2, "b": 0}


def test_the_blob_apps_invariant_reads_sizes_not_states():
    from bench import blob_app
    from snapmesh.protocol import lazystates

    listed = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE)
    for node, size in (("p1", 64 * MIB), ("p2", 64 * MIB)):
        listed.nodes.add(node_id=node, state_bytes=size).state_blocks.hashes.append(b"\x01" * 32)

    def no_read(node, snapshot_id):
        raise AssertionError("a state was read")

    judged = lazystates.with_reader(no_read, lambda: check_invariants(blob_app.app, view_of(listed)))
    assert judged == {"every blob the same size": []}
    listed.nodes[1].state_bytes -= 1
    judged = lazystates.with_reader(no_read, lambda: check_invariants(blob_app.app, view_of(listed)))
    assert "differ in size" in judged["every blob the same size"][0]
