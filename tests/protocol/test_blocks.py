"""Content-addressed blocks, pure: a state cut into blocks and rebuilt byte for byte
(snapmesh/protocol/blocks.py B1-B3), and the blocks' reference counts
(snapmesh/protocol/controller/blockrefs.py G1-G2)."""

from __future__ import annotations

import random

import pytest

from snapmesh.protocol import blocks
from snapmesh.protocol.controller.blockrefs import BlockRefs
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES


def app_snapshot(states: dict[str, bytes]) -> pb.Snapshot:
    snapshot = pb.Snapshot(snapshot_id="s1", status=pb.Snapshot.COMPLETE)
    for node, state in states.items():
        snapshot.nodes.add(node_id=node, state=state, state_digest="sha256:x", app_name="blob", app_version=1)
    snapshot.channels.add(src="p1", dst="p2").in_flight.add(msg_id="p1:p2:1", seq=1, payload=b"in flight")
    return snapshot


@pytest.mark.parametrize("size", [1, B - 1, B, B + 1, 3 * B + 17])
def test_a_state_is_cut_into_blocks_of_the_block_size_and_rebuilt_byte_for_byte(size):
    state = random.Random(size).randbytes(size)
    parts = blocks.split(state)
    assert b"".join(parts) == state and all(len(p) == B for p in parts[:-1]) and 0 < len(parts[-1]) <= B
    snapshot = app_snapshot({"p1": state, "p2": b""})
    stored, found = blocks.stored_form(snapshot)
    assert not stored.nodes[0].HasField("state") and len(stored.nodes[0].state_blocks.hashes) == len(parts)
    assert stored.nodes[1].HasField("state") and not stored.nodes[1].HasField("state_blocks")  # B2: empty stays inline
    assert stored.channels == snapshot.channels  # the in-flight messages stay whole
    whole, problems = blocks.whole_form(stored, found.get)
    assert problems == [] and whole.SerializeToString(deterministic=True) == snapshot.SerializeToString(deterministic=True)


def test_equal_blocks_are_one_block_and_a_changed_run_changes_the_blocks_it_touches():
    base = random.Random(1).randbytes(8 * B)
    changed = bytearray(base)
    changed[B + 100 : B + 1124] = bytes(1024)  # 1 KiB inside the second block
    first, _ = blocks.stored_form(app_snapshot({"p1": base, "p2": base}))
    second, _ = blocks.stored_form(app_snapshot({"p1": bytes(changed), "p2": base}))
    assert len(blocks.hashes(first)) == 8  # p2's blocks are p1's
    assert blocks.hashes(second) - blocks.hashes(first) == {second.nodes[0].state_blocks.hashes[1]}


def test_a_missing_or_corrupt_block_is_named_and_nothing_is_rebuilt():
    stored, found = blocks.stored_form(app_snapshot({"p1": random.Random(2).randbytes(3 * B), "p2": b"small"}))
    gone, bad = stored.nodes[0].state_blocks.hashes[0], stored.nodes[1].state_blocks.hashes[0]
    found.pop(gone)
    found[bad] = b"smalL"
    whole, problems = blocks.whole_form(stored, found.get)
    assert whole is None
    assert [(p.snapshot_id, p.node_id, p.hash) for p in problems] == [("s1", "p1", gone), ("s1", "p2", bad)]
    assert problems[0].why == "missing" and problems[1].why.startswith("corrupt")
    assert f"snapshot s1, node p1, block sha256:{gone.hex()}: missing" == str(problems[0])


def test_an_inline_snapshot_is_its_own_whole_form():
    snapshot = app_snapshot({"p1": b"abc"})
    assert not blocks.is_stored_form(snapshot)
    assert blocks.whole_form(snapshot, lambda name: None) == (snapshot, [])


def test_a_block_goes_only_when_its_last_holder_does():
    refs = BlockRefs()
    assert refs.hold("a", [b"x", b"y", b"y"]) == set()  # G1: once per snapshot
    refs.hold("b", [b"y", b"z"])
    assert len(refs) == 3
    assert refs.drop("a") == {b"x"}  # y is b's too
    assert refs.referenced(b"y") and not refs.referenced(b"x")
    assert refs.hold("b", [b"z", b"w"]) == {b"y"}  # filed again, naming other blocks
    assert refs.drop("b") == {b"z", b"w"} and len(refs) == 0
    assert refs.drop("unknown") == set()


def report(state: bytes) -> pb.FullState:
    message = pb.FullState(snapshot_id="s2", node_id="p1", epoch=1, app_name="blob", app_version=1, state=state)
    message.channels.add(src="p2", dst="p1").in_flight.add(msg_id="p2:p1:1", seq=1, payload=b"m")
    return message


def test_a_report_as_blocks_sends_only_the_blocks_not_held_and_rebuilds_byte_for_byte():
    before = random.Random(3).randbytes(6 * B)
    after = before[:2 * B] + bytes(100) + before[2 * B + 100:]
    _, held = blocks.referenced_report(report(before), set())
    sent, names = blocks.referenced_report(report(after), held)
    assert len(names) == 6 and len(sent.blocks) == 1 and not sent.HasField("state")
    assert sent.ByteSize() < B + 6 * 34 + 300 < report(after).ByteSize() / 5  # one block, six names
    on_disk = {name: block for name, block in zip(sent.state_blocks.hashes, blocks.split(after), strict=True)
               if name in held}
    whole, missing = blocks.whole_report(sent, on_disk.get)
    assert missing == [] and whole.SerializeToString(deterministic=True) == report(after).SerializeToString(
        deterministic=True)


def test_a_report_goes_whole_when_nothing_is_held_or_it_has_no_state():
    assert blocks.referenced_report(report(b"abc"), set())[0] is None
    assert blocks.referenced_report(pb.FullState(snapshot_id="s", node_id="p1", balance=5), {b"x"}) == (None, set())


def test_a_reference_the_controller_cannot_resolve_is_named_and_nothing_is_rebuilt():
    state = random.Random(4).randbytes(3 * B)
    _, held = blocks.referenced_report(report(state), set())
    sent, _ = blocks.referenced_report(report(state), held)
    assert len(sent.blocks) == 0
    first, second, third = sent.state_blocks.hashes
    mine = {first: blocks.split(state)[0], second: b"corrupt"}
    whole, missing = blocks.whole_report(sent, mine.get)
    assert whole is None and missing == [second, third]



def test_the_hashes_of_unchanged_blocks_are_taken_from_the_state_before_and_agree_with_hashing():
    before = random.Random(6).randbytes(10 * B + 100)
    fresh, hashed = blocks.names(before)
    assert hashed == 11 and fresh.names == [blocks.block_hash(b) for b in blocks.split(before)]
    after = before[:3 * B + 5] + b"x" * 10 + before[3 * B + 15:]
    named, hashed = blocks.names(after, last=fresh)
    assert hashed == 1 and named.names == blocks.names(after)[0].names
    grown = after + b"t" * B  # the last block changes, one is added
    named, hashed = blocks.names(grown, last=named)
    assert hashed == 2 and named.names == blocks.names(grown)[0].names
    shrunk = grown[:4 * B]
    named, hashed = blocks.names(shrunk, last=named)
    assert hashed == 0 and named.names == blocks.names(shrunk)[0].names
    # The names passed in are the ones the report lists; the blocks sent are the state's own bytes.
    sent, _ = blocks.referenced_report(report(after), {fresh.names[0]}, blocks.names(after)[0])
    assert list(sent.blocks) == blocks.split(after)[1:]


@pytest.mark.parametrize("seed", range(6))
def test_a_state_on_the_last_ones_cut_hashes_exactly_the_blocks_that_changed_whatever_the_windows(seed):
    rng = random.Random(seed)
    parts = [rng.choice((B // 2, 3 * B, 9 * B + 7, 20 * B)) for _ in range(rng.randrange(1, 5))]
    before = rng.randbytes(sum(parts))
    last = blocks.names(before, parts)[0]
    for _ in range(3):  # chained, as a node's reports are: each named from the one before
        after = bytearray(last.state)
        for _ in range(rng.randrange(0, 6)):  # runs anywhere: inside a block, across blocks and windows, the ends
            at = rng.choice((0, len(after) - 1, blocks.WINDOW_BLOCKS * B - 1, rng.randrange(len(after))))
            run = rng.randrange(1, 2 * B)
            after[at:at + run] = bytes(b ^ 0xFF for b in after[at:at + run])
        after = bytes(after)
        named, hashed = blocks.names(after, parts, last)
        fresh = blocks.names(after, parts)[0]
        changed = sum(after[s:e] != last.state[s:e] for s, e in fresh.bounds)
        assert named.names == fresh.names and named.bounds == fresh.bounds and hashed == changed
        assert named.placed() == fresh.placed()  # what a later state cut otherwise reuses
        last = named


def test_an_apps_parts_are_cut_on_the_grid_each_so_a_change_in_one_part_changes_its_blocks_only():
    assert blocks.bounds(10, (3, 7)) == [(0, 3), (3, 10)]
    assert blocks.bounds(2 * B + 3, (B + 1, B + 2)) == [(0, B), (B, B + 1), (B + 1, 2 * B + 1), (2 * B + 1, 2 * B + 3)]
    assert blocks.bounds(10, (3, 3)) == [(0, 10)]  # sizes that do not add up: one part
    rng = random.Random(8)
    parts = [rng.randbytes(n) for n in (3000, 5000, 9000, 100)]
    state = blocks.PartedState.of(parts)
    assert state == b"".join(parts) and state.parts == (3000, 5000, 9000, 100)
    first, _ = blocks.names(state, state.parts)
    parts[1] = parts[1][:10] + b"grown by a key" + parts[1][10:]  # the part's size changes
    again = blocks.PartedState.of(parts)
    second, hashed = blocks.names(again, again.parts, first)
    assert hashed == 1 and len(set(second.names) - set(first.names)) == 1
    assert blocks.names(again)[1] == 3  # on the plain grid, every block from the change on differs
    message = report(again)
    message.state_parts.extend(again.parts)
    sent, _ = blocks.referenced_report(message, set(first.names))
    assert len(sent.blocks) == 1 and list(sent.state_parts) == list(again.parts)
    stored, named = blocks.stored_form(pb.Snapshot(snapshot_id="s", nodes=[pb.NodeBalance(node_id="p1", state=again)]),
                                       {"p1": again.parts})
    assert list(stored.nodes[0].state_blocks.hashes) == second.names and set(named) == set(second.names)


def test_a_report_is_rebuilt_from_the_blocks_kept_of_the_nodes_last_state_reading_only_what_is_not_kept():
    """B7, knownblocks.py KB1-KB2: the last state's blocks, kept by name, stand in for the
    store's; what is neither kept nor carried is read (and checked) as before."""
    from snapmesh.protocol.controller.knownblocks import KnownBlocks

    first = random.Random(7).randbytes(8 * B)
    known = KnownBlocks()
    known.keep("p1", blocks.names(first)[0])
    second = bytearray(first)
    second[2 * B : 2 * B + 10] = b"0123456789"
    report = pb.FullState(snapshot_id="s2", node_id="p1", state=bytes(second))
    sent, _ = blocks.referenced_report(report, set(blocks.names(first)[0].names))
    reads: list[bytes] = []
    whole, missing, named = blocks.whole_state(sent, lambda name: reads.append(name), known.reader("p1"))
    assert missing == [] and reads == [] and whole == report
    known.keep("p1", named)
    third = pb.FullState(snapshot_id="s3", node_id="p2", state=bytes(second[: 4 * B]) + first[: 4 * B])
    sent, _ = blocks.referenced_report(third, set(named.names))
    assert blocks.whole_state(sent, lambda name: None, known.reader("p2"))[0] == third  # another node's blocks too
    carried = {blocks.block_hash(block) for block in sent.blocks}
    assert blocks.whole_state(sent, lambda name: None, KnownBlocks().reader("p2"))[1] == [
        name for name in sent.state_blocks.hashes if name not in carried]  # none kept: every reference is read


def test_the_blocks_kept_are_bounded_the_longest_kept_going_first_and_a_state_over_the_bound_not_kept():
    """knownblocks.py KB2: memory is bounded; what is not kept is read from the store instead."""
    from snapmesh.protocol.controller.knownblocks import KnownBlocks

    states = {node: random.Random(node).randbytes(4 * B) for node in ("p1", "p2", "p3")}
    named = {node: blocks.names(state)[0] for node, state in states.items()}
    known = KnownBlocks(max_bytes=9 * B)
    known.keep("p1", named["p1"])
    known.keep("p2", named["p2"])
    assert known.kept_bytes == 8 * B
    known.keep("p3", named["p3"])  # 12 B over 9: p1, kept longest, goes
    assert known.kept_bytes == 8 * B
    first_of = {node: named[node].names[0] for node in states}
    assert known.reader("p3")(first_of["p1"]) is None
    assert known.reader("p3")(first_of["p2"]) == states["p2"][:B]
    known.keep("p2", blocks.names(random.Random(9).randbytes(10 * B))[0])  # over the bound: p2 is not kept
    assert known.reader("p2")(first_of["p2"]) is None and known.kept_bytes == 4 * B
    assert known.reader("p1")(first_of["p3"]) == states["p3"][:B]
    with pytest.raises(ValueError, match="max_bytes"):
        KnownBlocks(max_bytes=-1)


def _every_field_set() -> pb.FullState:
    """A FullState with each of its fields set (whatever fields it has now), none to its default."""
    message = pb.FullState()
    for field in message.DESCRIPTOR.fields:
        repeated = field.is_repeated
        if field.message_type is not None:
            sub = getattr(message, field.name).add() if repeated else getattr(message, field.name)
            for inner in sub.DESCRIPTOR.fields:  # one set field makes it present
                if inner.type == inner.TYPE_STRING and not inner.is_repeated:
                    setattr(sub, inner.name, f"{field.name}.{inner.name}")
                    break
            else:
                sub.SetInParent()
            continue
        value = {field.TYPE_STRING: f"{field.name}!", field.TYPE_BYTES: field.name.encode(),
                 field.TYPE_BOOL: True}.get(field.type, field.number)
        if repeated:
            getattr(message, field.name).extend([value, value])
        else:
            setattr(message, field.name, value)
    return message


def test_a_copy_without_the_state_is_the_report_with_its_state_cleared_and_the_report_unchanged():
    report = _every_field_set()
    report.state = random.Random(9).randbytes(3 * B)
    before = report.SerializeToString(deterministic=True)
    expected = pb.FullState()
    expected.CopyFrom(report)
    expected.ClearField("state")
    copy = blocks.without_state(report)
    assert copy.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
    assert not copy.HasField("state") and copy.ListFields() == expected.ListFields()
    assert report.SerializeToString(deterministic=True) == before


def test_a_copy_without_the_state_keeps_an_optional_field_set_to_its_default_and_leaves_unset_ones_unset():
    report = pb.FullState(snapshot_id="s", state=b"")  # present, and empty: not the same as unset
    assert not blocks.without_state(report).HasField("state")
    assert blocks.without_state(pb.FullState()).ListFields() == []
