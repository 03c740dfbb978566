"""A pending report's save follows what changed, not the state's size (reportblocks.py RK6):
it reads the state's names once beside the last state's and keeps one set of them, and the
garbage it finds is still every block file that neither the last state nor a pending report
names (RK2), whatever the history of saves, forgets and collections."""

from __future__ import annotations

import random

from snapmesh.protocol import blocks
from snapmesh.services.node.reportblocks import ReportBlocks

B = blocks.BLOCK_BYTES


class Names(list):
    """A state's names that count the passes made over them."""

    passes = 0

    def __iter__(self):
        Names.passes += 1
        return super().__iter__()


def _named(state: bytes) -> blocks.Named:
    named, _ = blocks.names(state, ())
    return blocks.Named(named.state, named.bounds, Names(named.names), None, named.cut)


def test_a_save_passes_over_the_names_of_the_state_and_the_last_one_no_more_than_it_must(tmp_path):
    saved = ReportBlocks(tmp_path / "blocks")
    state = bytearray(random.Random(1).randbytes(64 * B))
    first = bytes(state)
    saved.save("s1", first, (), _named(first))  # taken as the cut named it (RK4): these very names
    saved.collect()  # its blocks durable in the directory: never carried again (SV1)
    saved.forget("s1")
    state[9 * B] ^= 1
    again = bytes(state)
    Names.passes = 0
    named, written = saved.save("s2", again, (), _named(again))
    assert len(written) == 1
    # the compare with the last state (one pass over each) and the set `_named` keeps: no set of every
    # block the last state names, none of this one's to find the absent ones (the old save made 4 passes)
    assert Names.passes == 3, Names.passes
    assert saved.garbage == 1


def test_the_garbage_is_every_file_nothing_needs_after_any_history(tmp_path):
    rng = random.Random(5)
    saved = ReportBlocks(tmp_path / "blocks")
    state = bytearray(rng.randbytes(24 * B))
    pending: dict[str, frozenset[bytes]] = {}
    last: frozenset[bytes] = frozenset()
    for n in range(60):
        sid = f"s{n}"
        for _ in range(rng.randrange(4)):
            state[rng.randrange(len(state))] ^= 1 + rng.randrange(255)
        if rng.random() < 0.15:  # another number of blocks
            state = state[: rng.randrange(8, 24) * B] if rng.random() < 0.5 else state + rng.randbytes(3 * B)
        if rng.random() < 0.1 and n:  # back to an earlier block: named again, never deleted
            state[:B] = bytes(B)
        named, carried = saved.save(sid, bytes(state), ())
        pending[sid], last = frozenset(named.names), frozenset(named.names)
        kept = last.union(*pending.values())  # what the save found needed (RK2)
        on_disk = {bytes.fromhex(p.name) for p in saved.directory.iterdir()} if saved.directory.is_dir() else set()
        # SV1: what the save's file does not carry is durable in the directory
        assert frozenset(named.names) <= on_disk | {name for name, _ in carried}
        if rng.random() < 0.5:
            saved.collect()
            assert {bytes.fromhex(p.name) for p in saved.directory.iterdir()} == kept
        for old in rng.sample(sorted(pending), k=min(len(pending), rng.randrange(3))):
            saved.forget(old)  # garbage from the next save on
            del pending[old]
    named, _ = saved.save("last", bytes(state), ())
    saved.collect()
    kept = frozenset(named.names).union(*pending.values())
    assert {bytes.fromhex(p.name) for p in saved.directory.iterdir()} == kept
    assert saved.state(list(named.names)) == (bytes(state), "")


def test_the_manifest_kept_from_the_last_save_parses_as_the_manifest_of_any_state(tmp_path):
    """RK7: patched where names changed, encoded whole where the count changed or a save failed."""
    from snapmesh.services.node.reportblocks import manifest
    from snapmesh.v1 import snapmesh_pb2 as pb

    rng = random.Random(7)
    saved = ReportBlocks(tmp_path / "blocks")
    state = bytearray(rng.randbytes(20 * B))
    message = pb.FullState(snapshot_id="s", node_id="p1", app_name="blob", app_version=1, cut_at_unix_ns=5)
    for n in range(40):
        for _ in range(rng.randrange(4)):
            state[rng.randrange(len(state))] ^= 1 + rng.randrange(255)
        if rng.random() < 0.15:
            state = state[: rng.randrange(8, 20) * B] if rng.random() < 0.5 else state + rng.randbytes(2 * B)
        named, _ = saved.save(f"s{n}", bytes(state), ())
        found = pb.FullState()
        found.ParseFromString(saved.manifest_body(message, named.names))
        assert found == manifest(message, named.names), n
