"""A state's digest in its two forms (snapmesh/protocol/statedigest.py) and the node's
naming of its cut states' blocks by identity (snapmesh/protocol/node/cutnames.py)."""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

import pytest

from snapmesh.protocol import blocks, statedigest
from snapmesh.protocol.blocks import BLOCK_BYTES
from snapmesh.protocol.node.cutnames import CutNames
from snapmesh.protocol.reports import report_message
from snapmesh.protocol.restoreblocks import whole_restore
from snapmesh.protocol import wal
from snapmesh.v1 import snapmesh_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import blob_app  # noqa: E402
from support.applog import AppLogs  # noqa: E402


def _state(size: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(size)


def _changed(state: bytes, at: int) -> bytes:
    return state[:at] + bytes([state[at] ^ 1]) + state[at + 1 :]


# ---------------------------------------------------------------- the two forms (SD1, SD2, SD4)


@pytest.mark.parametrize("size", [0, 1, BLOCK_BYTES - 1, BLOCK_BYTES, 3 * BLOCK_BYTES + 5, 100 * 1024])
def test_the_same_state_has_one_digest_in_each_form_and_a_changed_byte_another(size: int) -> None:
    state = _state(size)
    assert statedigest.blocks_form(state) == statedigest.blocks_form(bytes(state))
    assert statedigest.whole(state) == "sha256:" + hashlib.sha256(state).hexdigest()
    assert statedigest.blocks_form(state).startswith("sha256-blocks:")
    if size:
        other = _changed(state, size - 1)
        assert statedigest.blocks_form(other) != statedigest.blocks_form(state)
        assert not statedigest.matches(statedigest.blocks_form(state), other)


def test_a_reader_accepts_both_forms_and_neither_is_read_as_the_other() -> None:
    state = _state(5 * BLOCK_BYTES + 7)
    whole, by_blocks = statedigest.whole(state), statedigest.blocks_form(state)
    assert statedigest.matches(whole, state) and statedigest.matches(by_blocks, state)
    assert whole.split(":")[1] != by_blocks.split(":")[1]
    assert not statedigest.matches("sha256-blocks:" + whole.split(":")[1], state)
    assert not statedigest.matches("md5:" + hashlib.md5(state).hexdigest(), state)
    assert not statedigest.matches("", state)


def test_a_cut_record_holds_the_whole_form_bare_and_the_blocks_form_prefixed() -> None:
    state = _state(BLOCK_BYTES * 9)
    for digest in (statedigest.whole(state), statedigest.blocks_form(state)):
        assert statedigest.from_record(statedigest.record_text(digest)) == digest
    assert ":" not in statedigest.record_text(statedigest.whole(state))  # what older records held
    assert statedigest.from_record(hashlib.sha256(state).hexdigest()) == statedigest.whole(state)
    assert statedigest.from_record("") == ""


@pytest.mark.parametrize("seed", range(5))
def test_a_state_fed_in_pieces_of_any_size_has_the_blocks_form(seed: int) -> None:
    rng = random.Random(seed)
    state = _state(rng.randrange(0, 20 * BLOCK_BYTES), seed)
    hasher, at = statedigest.Hasher(blocks=True), 0
    while at < len(state):
        n = rng.choice([1, 100, BLOCK_BYTES, BLOCK_BYTES + 3, 3 * BLOCK_BYTES])
        hasher.update(state[at : at + n])
        at += n
    assert hasher.text() == statedigest.blocks_form(state)
    whole = statedigest.Hasher.like("sha256:00")
    whole.update(state)
    assert whole.text() == statedigest.whole(state)


# ---------------------------------------------------------------- the node's cut (CN1-CN3)


@pytest.fixture
def hash_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many SHA-256s statedigest computes (a list holding one count)."""
    calls = [0]
    real = hashlib.sha256

    def counting(*args):  # noqa: ANN002, ANN202
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(statedigest.hashlib, "sha256", counting)
    return calls


def _digest(names: CutNames, parts: list[bytes]) -> tuple[str, blocks.Named | None]:
    """The cut's digest of the state the app's `parts` make, as the host hands it over (Host.cut)."""
    given = tuple(part for part in parts if part)
    return names.digest(b"".join(given), given)


def test_a_part_handed_over_again_is_not_hashed_again(hash_calls: list[int]) -> None:
    parts = [_state(BLOCK_BYTES, i) for i in range(20)] + [b"tail"]
    names = CutNames()
    first, _ = _digest(names, parts)
    assert first == statedigest.blocks_form(b"".join(parts))
    assert names.hashed == 21
    parts[3] = _state(BLOCK_BYTES, 99)  # the app replaced one block
    hash_calls[0] = 0
    second, named = _digest(names, parts)
    assert hash_calls[0] == 2  # the new block, and the digest over the names: no other block
    assert second == statedigest.blocks_form(b"".join(parts)) != first
    assert names.hashed == 22
    sizes = tuple(len(part) for part in parts)
    assert named is not None
    taken, hashed = blocks.names(named.state, sizes, None, named)  # the report takes the cut's names
    assert taken is named and hashed == 0
    assert named.names == blocks.names(b"".join(parts), sizes)[0].names and named.bounds == blocks.bounds(len(named.state), sizes)


def test_a_new_object_under_a_remembered_id_is_hashed() -> None:
    parts = [_state(BLOCK_BYTES, i) for i in range(10)]
    names = CutNames()
    _digest(names, parts)
    fresh = _state(BLOCK_BYTES, 42)
    parts[0] = fresh
    # An entry where the new object is that holds another object, with wrong names (as if
    # an id had been reused): it is not taken, whatever its place.
    names._kept = (b"x" * BLOCK_BYTES, *names._kept[1:])
    names._kept_names[0] = (b"\0" * 32,)
    assert _digest(names, parts)[0] == statedigest.blocks_form(b"".join(parts))


def test_a_mutable_part_is_always_hashed_and_a_dropped_part_let_go() -> None:
    parts: list[bytes] = [bytearray(_state(BLOCK_BYTES, i)) for i in range(10)]
    names = CutNames()
    _digest(names, parts)
    parts[5][0] ^= 1  # the same object, changed
    assert _digest(names, parts)[0] == statedigest.blocks_form(b"".join(parts))
    assert names.hashed == 20 and not any(names._kept)
    kept = [_state(BLOCK_BYTES, i) for i in range(10)]
    _digest(names, kept)
    _digest(names, kept[:9])
    assert len(names._kept) == 9 and all(a is b for a, b in zip(names._kept, kept, strict=False))  # current only


def test_a_state_given_without_its_parts_is_named_by_compare() -> None:
    state = _state(40 * BLOCK_BYTES + 17)
    names = CutNames()
    given = names.digest  # parts off the grid: tests/protocol/test_cut_off_grid.py (CN5)

    assert given(state) == (statedigest.blocks_form(state), None)
    assert names.hashed == 41
    changed = _changed(state, 5 * BLOCK_BYTES + 3)
    assert given(changed) == (statedigest.blocks_form(changed), None)
    assert names.hashed == 42


def test_a_small_state_keeps_the_whole_form() -> None:
    state = _state(statedigest.BLOCKS_FORM_BYTES)
    assert CutNames().digest(state) == (statedigest.whole(state), None)
    assert statedigest.canonical(state) == statedigest.whole(state)
    assert statedigest.canonical(state + b"!") == statedigest.blocks_form(state + b"!")


# ---------------------------------------------------------------- the blob app, its node, its readers


def test_the_blob_app_replaces_only_the_blocks_a_write_touches() -> None:
    from snapmesh.app import NodeInfo

    blob = blob_app.Blob(NodeInfo(node_id="n1", peers_out=(), peers_in=(), params={"mib": 0.5}))
    before = blob.snapshot_blocks()
    assert all(len(b) == BLOCK_BYTES for b in before) and len(before) == 64
    blob.on_command(blob_app.write(BLOCK_BYTES - 2, b"abcd"), None)  # across blocks 0 and 1
    after = blob.snapshot_blocks()
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a is not b] == [0, 1]
    whole = bytearray(b"".join(before))
    whole[BLOCK_BYTES - 2 : BLOCK_BYTES + 2] = b"abcd"
    assert blob.snapshot() == bytes(whole) == b"".join(after)
    copy = blob_app.Blob(NodeInfo(node_id="n2", peers_out=(), peers_in=(), params={"mib": 0.5}))
    copy.restore(blob.snapshot())
    assert copy.snapshot() == blob.snapshot()


def test_a_node_records_the_blocks_form_and_hashes_only_what_a_command_wrote() -> None:
    logs = AppLogs(blob_app.app, ("p1", "p2"))
    node = logs.nodes["p1"]
    counts = []
    for sid in ("s1", "s2"):
        logs.command("p1", blob_app.write(10 * BLOCK_BYTES + 5, sid.encode()))
        hashed = node._cut_names.hashed
        node.start_snapshot(sid)
        logs.route("p1")
        while logs.deliver():
            pass
        finished = logs.finished[sid, "p1"]
        part = finished.state
        cut = next(r for r in logs.records("p1") if isinstance(r, wal.Cut) and r.snapshot_id == sid)
        assert statedigest.from_record(cut.digest) == statedigest.blocks_form(part.state)
        assert finished.digest == cut.digest
        message = report_message(part, digest=cut.digest)
        assert message.state_digest == statedigest.blocks_form(part.state)
        assert tuple(message.state_parts) == part.parts == (BLOCK_BYTES,) * 128  # the blob's blocks (B6)
        assert part.named is not None and blocks.names(part.state, part.parts, None, part.named)[1] == 0
        counts.append((cut.digest, node._cut_names.hashed - hashed))
    assert counts[0][0] != counts[1][0]
    assert counts[0][1] == 128 and counts[1][1] == 1  # the first cut names all; the second, the block written


def test_a_restore_by_blocks_checks_the_blocks_form_and_names_a_missing_block() -> None:
    state = _state(12 * BLOCK_BYTES + 9)
    named = blocks.names(state)[0]
    request = pb.RestoreStateRequest(snapshot_id="s7", state_digest=statedigest.blocks_form(state))
    request.state_blocks.hashes.extend(named.names)
    held = {name: state[start:end] for name, (start, end) in zip(named.names, named.bounds, strict=True)}
    got, why = whole_restore(request, held.get)
    assert got is not None and got.state == state, why
    gone = dict(held)
    del gone[named.names[4]]
    got, why = whole_restore(request, gone.get)
    assert got is None and "snapshot s7" in why and f"sha256:{named.names[4].hex()}" in why
    bad = dict(held)
    bad[named.names[4]] = b"not it"  # a held block that is not what its name says: the digest catches it
    got, why = whole_restore(request, bad.get)
    assert got is None and "snapshot s7" in why and request.state_digest in why


def test_snapshot_verify_checks_a_state_against_either_form() -> None:
    from snapmesh.checking import snapshot_file

    state = _state(100 * 1024)
    snapshot = pb.Snapshot(snapshot_id="s9", status=pb.Snapshot.COMPLETE)
    snapshot.nodes.add(node_id="a", state=state, state_digest=statedigest.blocks_form(state))
    snapshot.nodes.add(node_id="b", state=b"small", state_digest=statedigest.whole(b"small"))
    assert not [p for p in snapshot_file.inconsistencies(snapshot) if "digest" in p]
    snapshot.nodes[0].state = _changed(state, 77_000)
    snapshot.nodes[1].state_digest = "sha256-blocks:" + statedigest.whole(b"small").split(":")[1]
    assert [p for p in snapshot_file.inconsistencies(snapshot) if "digest" in p] == [
        f"node a: its state does not match its digest {statedigest.blocks_form(state)}",
        f"node b: its state does not match its digest {snapshot.nodes[1].state_digest}",
    ]
