"""A manifest sent as its change from a base (snapmesh/protocol/manifestdelta.py MD1-MD4,
snapmesh/protocol/controller/manifestbases.py MB1-MB2)."""

from __future__ import annotations

import hashlib
import random

import pytest

from snapmesh.protocol import carriedblocks, chunking, manifestdelta
from snapmesh.protocol.controller.manifestbases import ManifestBases
from snapmesh.v1 import snapmesh_pb2 as pb


def _name(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


@pytest.mark.parametrize("seed", range(40))
def test_applied_rebuilds_any_manifest_from_its_change_and_the_change_names_only_what_differs(seed):
    rng = random.Random(seed)
    base = [_name(rng.randrange(50)) for _ in range(rng.randrange(0, 60))]
    names = list(base[: rng.randrange(0, len(base) + 1)]) + [_name(rng.randrange(80)) for _ in range(rng.randrange(0, 20))]
    for _ in range(rng.randrange(0, 10)):
        if names:
            names[rng.randrange(len(names))] = _name(rng.randrange(80))
    print(f"seed {seed}: base {len(base)} names, manifest {len(names)}")  # replays with this one seed
    delta = manifestdelta.change("s-1", base, names)
    assert manifestdelta.applied(delta, base) == names
    differ = [i for i in range(len(names)) if i >= len(base) or base[i] != names[i]]
    assert list(delta.positions) == differ
    assert (delta.base_snapshot_id, delta.base_count, delta.block_count) == ("s-1", len(base), len(names))
    again = pb.StateChange()
    again.ParseFromString(delta.SerializeToString())  # what the controller parses
    assert manifestdelta.applied(again, base) == names


def test_a_steady_change_carries_only_the_changed_names():
    base = [_name(i) for i in range(8192)]
    names = list(base)
    names[7], names[4000] = _name(-1), _name(-2)
    delta = manifestdelta.change("s-1", base, names)
    assert list(delta.positions) == [7, 4000] and list(delta.hashes) == [_name(-1), _name(-2)]
    assert delta.ByteSize() < 200


def _delta(**fields) -> pb.StateChange:
    base = dict(base_snapshot_id="s-1", base_count=3, block_count=3, positions=[1], hashes=[_name(9)])
    return pb.StateChange(**{**base, **fields})


@pytest.mark.parametrize("fields, words", [
    (dict(base_count=4), "says its base has 4 names"),
    (dict(positions=[1, 2]), "2 positions and 1 names"),
    (dict(positions=[3]), "position 3 in a manifest of 3 names"),
    (dict(positions=[2, 1], hashes=[_name(1), _name(2)]), "not strictly increasing"),
    (dict(positions=[1, 1], hashes=[_name(1), _name(2)]), "not strictly increasing"),
    (dict(hashes=[b"short"]), "not 32 bytes"),
    (dict(block_count=5, positions=[1, 4], hashes=[_name(1), _name(2)]), "without naming each past 3"),
])
def test_a_change_that_does_not_fit_its_base_is_refused_naming_what(fields, words):
    with pytest.raises(manifestdelta.BadChange, match=words) as caught:
        manifestdelta.applied(_delta(**fields), [_name(0), _name(1), _name(2)])
    assert caught.value.code == "INVALID_ARGUMENT"


def _report(node: str, sid: str, delta: pb.StateChange) -> pb.FullState:
    report = pb.FullState(snapshot_id=sid, node_id=node, state_digest="sha256:x")
    report.state_change.CopyFrom(delta)
    report.blocks.append(b"new block")
    return report


def test_a_change_is_rebuilt_from_the_base_held_for_its_node_and_snapshot():
    bases = ManifestBases()
    base = [_name(i) for i in range(5)]
    bases.kept("n1", "s-1", base)
    names = base[:4] + [_name(99)]
    report = _report("n1", "s-2", manifestdelta.change("s-1", base, names))
    whole, manifest = bases.whole(report)
    assert manifest == names and list(whole.state_blocks.hashes) == names
    assert not whole.HasField("state_change") and list(whole.blocks) == [b"new block"]
    assert (whole.snapshot_id, whole.node_id, whole.state_digest) == ("s-2", "n1", "sha256:x")
    assert report.HasField("state_change")  # the report as it came is not changed


def test_a_base_not_held_is_refused_missing_base_and_nothing_changes():
    bases = ManifestBases()
    base = [_name(i) for i in range(5)]
    bases.kept("n1", "s-1", base)
    delta = manifestdelta.change("s-1", base, base[:2])
    for report in (_report("n2", "s-2", delta),  # another node's base
                   _report("n1", "s-2", manifestdelta.change("s-0", base, base[:2]))):  # a base not held
        with pytest.raises(manifestdelta.MissingBase) as caught:
            bases.whole(report)
        assert str(caught.value).startswith(manifestdelta.MISSING_BASE)
        assert caught.value.code == "FAILED_PRECONDITION" and report.node_id in str(caught.value)
    assert bases.base("n1", "s-1") == base


def test_the_last_bases_of_each_node_are_held_and_a_report_with_no_change_passes_as_it_is():
    bases = ManifestBases(kept=2)
    for i in range(4):
        bases.kept("n1", f"s-{i}", [_name(i)])
    bases.kept("n2", "s-0", [_name(7)])
    assert [bases.base("n1", f"s-{i}") for i in range(4)] == [None, None, [_name(2)], [_name(3)]]
    assert bases.base("n2", "s-0") == [_name(7)]
    bases.forget("n1")
    assert bases.base("n1", "s-3") is None
    plain = pb.FullState(snapshot_id="s-9", node_id="n1")
    plain.state_blocks.hashes.append(_name(1))
    assert bases.whole(plain) == (plain, None)


def test_a_change_streamed_with_its_blocks_carried_apart_is_read_as_a_report_with_a_manifest():
    """carriedblocks.py CB3: a stream's carried blocks need a manifest, and a change is one (MD1)."""
    base = [_name(i) for i in range(4)]
    report = _report("n1", "s-2", manifestdelta.change("s-1", base, base[:3] + [_name(9)]))
    report.ClearField("blocks")
    stream = carriedblocks.CarriedBlocks()
    came = []
    for chunk in chunking.stream_state(report, chunk_bytes=64, carried=[b"b" * 100, b"c" * 50]):
        came += stream.feed(chunk.data)
    assert came == [b"b" * 100, b"c" * 50]
    assert stream.finish() == report
