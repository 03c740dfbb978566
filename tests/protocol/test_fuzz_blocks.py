"""The fuzzer with reports as blocks (snapmesh/sim/blockstore.py): the store's rules, and reports
going as blocks under the simulator's faults."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from snapmesh.fuzzer import fuzz
from snapmesh.protocol.controller import journal
from snapmesh.services.app import kvshard
from snapmesh.sim.blockstore import SimBlocks
from snapmesh.sim.invariants import Violation
from snapmesh.v1 import snapmesh_pb2 as pb


APPS = {"bank": None, "kvshard": kvshard.app}


@pytest.mark.parametrize("app", APPS)
def test_reports_go_as_blocks_under_the_faults(app: str) -> None:
    seen: Counter[str] = Counter()
    for seed in range(60):
        seen += fuzz.run_case(seed, APPS[app]).faults
    for kind in ("report taken as blocks", "report refused: missing blocks, sent whole", "snapshot filed as blocks"):
        assert seen[kind] > 0, f"no case exercised {kind!r}: {dict(seen)}"


# --------------------------------------------------------------- the store's rules, one at a time


def _store(grain: int = 1) -> SimBlocks:
    store = SimBlocks(random.Random(0), Counter())
    store.grain = grain
    return store


def _report(sid: str, state: bytes, node: str = "n0") -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id=node, state=state)


def _filed(store: SimBlocks, sid: str, state: bytes, node: str = "n0") -> None:
    snapshot = pb.Snapshot(snapshot_id=sid, nodes=[pb.NodeBalance(node_id=node, state=state)])
    assert store.filed(snapshot, {node: state}) == {node: state}


def test_a_report_naming_a_block_the_controller_lacks_is_refused_then_sent_whole() -> None:
    store = _store()
    whole, _ = store.take(store.form("n0", _report("s1", b"abc")))  # nothing taken yet: whole
    store.accepted("n0", whole)
    sent = store.form("n0", _report("s2", b"abd"))
    assert sent.HasField("state_blocks") and list(sent.blocks) == [b"d"]
    assert store.take(sent)[0] is None  # s1 is not filed: its blocks are nowhere (SB2)
    store.refused("n0")
    assert not store.form("n0", _report("s2", b"abd")).HasField("state_blocks")


def test_a_filed_snapshots_blocks_make_the_next_report_whole() -> None:
    store = _store()
    store.accepted("n0", store.take(store.form("n0", _report("s1", b"abc")))[0])
    _filed(store, "s1", b"abc")
    sent = store.form("n0", _report("s2", b"abd"))
    whole, _ = store.take(sent)
    assert whole is not None and whole.state == b"abd" and list(sent.blocks) == [b"d"]


def test_a_filed_state_not_the_one_recorded_is_named() -> None:
    store = _store()
    snapshot = pb.Snapshot(snapshot_id="s1", nodes=[pb.NodeBalance(node_id="n0", state=b"ab")])
    with pytest.raises(Violation, match=r"SB1: snapshot s1: n0's state rebuilt .* \(2 bytes\) is not the state"):
        store.filed(snapshot, {"n0": b"ba"})


def test_a_retired_snapshots_blocks_go_once_no_other_holds_them() -> None:
    store = _store()
    _filed(store, "s1", b"ab")
    _filed(store, "s2", b"ab")
    store.retired("s1")
    assert set(store.disk.values()) == {b"ab"}  # s2's too (SB3)
    store.retired("s2")
    assert store.disk == {}


def test_a_journaled_report_whose_blocks_are_gone_is_dropped_at_a_restart() -> None:
    store = _store()
    store.accepted("n0", store.take(store.form("n0", _report("s1", b"ab")))[0])
    _filed(store, "s1", b"ab")
    sent = store.form("n0", _report("s2", b"ab"))
    assert sent.HasField("state_blocks") and not sent.blocks  # every block held: none carried
    whole, _ = store.take(sent)
    record = journal.Reported(state=whole, wall=1.0, sent=sent)  # type: ignore[arg-type]
    store.retired("s1")  # pinned by s2's journaled report: kept (J2)
    assert [r.state.state for r in store.replayed([record])] == [b"ab"]  # type: ignore[attr-defined]
    store.disk.clear()  # the disk lost them: the snapshot is dropped whole, never taken short (J3)
    assert store.replayed([record]) == []
    assert store.faults["journaled report dropped: its blocks are gone"] == 1
    store.failed("s2")  # its FAILED record is durable: read back from its file, as it is
    assert store.replayed([record]) == [record]
