"""The checksum of a listed snapshot's whole form, streamed (wholedigest.py WD1-WD3),
is the one its whole form's encoding hashes to, byte for byte, whatever the states'
sizes (lengths of one, two and three varint bytes), and its states' digests are
theirs; a short block list or a marker found twice is refused."""

from __future__ import annotations

import random

import pytest

from snapmesh.checking import snapshot_file
from snapmesh.protocol import blocks
from snapmesh.protocol.appstate import digest
from snapmesh.protocol.controller import blockforms
from snapmesh.protocol.controller.wholedigest import WholeDigestError, whole_digest
from snapmesh.v1 import snapmesh_pb2 as pb


def listed_snapshot(sizes: dict[str, int], seed: int = 0) -> tuple[pb.Snapshot, dict[bytes, bytes], dict[str, bytes]]:
    """A COMPLETE snapshot whose states over LISTED_BYTES are listed, its blocks by name, and the states."""
    rng = random.Random(seed)
    snapshot = pb.Snapshot(snapshot_id=f"s{seed}", status=pb.Snapshot.COMPLETE, initiator="a", reason="why not")
    by_name, states = {}, {}
    for node, size in sizes.items():
        state = states[node] = rng.randbytes(size)
        entry = snapshot.nodes.add(node_id=node, balance=rng.randrange(1000), state_digest=digest(state),
                                   app_name="blob", app_version=3)
        if size > blockforms.LISTED_BYTES:
            named = blocks.names(state)[0]
            by_name |= {name: state[a:b] for name, (a, b) in zip(named.names, named.bounds, strict=True)}
            entry.state_blocks.hashes.extend(named.names)
            entry.state_bytes = size
        else:
            entry.state = state
    snapshot.channels.add(src="a", dst="b").in_flight.add()
    return snapshot, by_name, states


def reader(by_name: dict[bytes, bytes]):
    return lambda entry: (by_name[name] for name in entry.state_blocks.hashes)


@pytest.mark.parametrize("sizes", [
    {"a": 70_000, "b": 100},  # one listed, one whole
    {"a": 200_000, "b": 3 << 20, "c": 65_537},  # lengths of three and four varint bytes
    {"a": 5, "b": 9},  # nothing listed
])
def test_the_streamed_checksum_is_the_whole_forms(sizes) -> None:
    snapshot, by_name, states = listed_snapshot(sizes)
    whole = blockforms.BlockForms(lambda: by_name.get).whole(snapshot)
    got = whole_digest(snapshot, reader(by_name))
    assert got.checksum == snapshot_file.checksum(whole)
    assert got.states == {i: digest(states[n.node_id]) for i, n in enumerate(snapshot.nodes) if blockforms.is_listed(n)}


def test_blocks_short_of_the_entrys_size_are_refused() -> None:
    snapshot, by_name, _ = listed_snapshot({"a": 70_000})
    with pytest.raises(WholeDigestError, match="WD2"):
        whole_digest(snapshot, lambda entry: [by_name[entry.state_blocks.hashes[0]]])


def test_a_marker_found_twice_is_refused(monkeypatch) -> None:
    snapshot, by_name, _ = listed_snapshot({"a": 70_000, "b": 100})
    import snapmesh.protocol.controller.wholedigest as wd
    real = wd.hashlib.sha256

    class Same:  # every marker the same: never found once
        def __init__(self, data=b"") -> None:
            self._h = real(data if not data.startswith(b"snapmesh whole-form") else b"same")

        def __getattr__(self, name):
            return getattr(self._h, name)

    snapshot.nodes[1].CopyFrom(snapshot.nodes[0])  # two listed entries
    monkeypatch.setattr(wd.hashlib, "sha256", Same)
    with pytest.raises(WholeDigestError, match="WD1"):
        whole_digest(snapshot, reader(by_name))


def test_a_listed_state_is_digested_in_its_entrys_form() -> None:
    from snapmesh.protocol import statedigest

    snapshot, by_name, states = listed_snapshot({"a": 200_000, "b": 90_000})
    snapshot.nodes[0].state_digest = statedigest.blocks_form(states["a"])
    got = whole_digest(snapshot, reader(by_name))
    assert got.states == {0: statedigest.blocks_form(states["a"]), 1: digest(states["b"])}
    snapshot.nodes[0].state_digest = statedigest.blocks_form(states["b"])  # a wrong one: the bytes' own is found
    assert whole_digest(snapshot, reader(by_name)).states[0] == statedigest.blocks_form(states["a"])
