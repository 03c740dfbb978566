"""Reports journaled as blocks (snapmesh/protocol/controller/journalblocks.py JB1-JB3)
and the blocks they pin (blockpins.py), pure."""

from __future__ import annotations

import random

from snapmesh.protocol import blocks
from snapmesh.protocol.appstate import digest
from snapmesh.protocol.controller import blockforms
from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller import journalblocks
from snapmesh.protocol.controller.blockpins import BlockPins
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES


def report(sid: str, node: str, state: bytes) -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id=node, state=state, app_name="blob", app_version=1)


def as_blocks(whole: pb.FullState, held: set[bytes]) -> pb.FullState:
    sent, _ = blocks.referenced_report(whole, held)
    assert sent is not None
    return sent


def test_a_report_as_blocks_is_journaled_as_it_came_and_read_back_whole():
    before = random.Random(1).randbytes(8 * B)
    after = bytearray(before)
    after[3 * B + 5 : 3 * B + 1029] = bytes(1024)
    stored = dict(zip(blocks.names(before)[0].names, blocks.split(before), strict=True))
    whole = report("s2", "p1", bytes(after))
    sent = as_blocks(whole, set(stored))
    record = R.Reported(state=whole, wall=1.5, sent=sent)
    frame = R.encode(record)
    assert len(frame) < 2 * B  # the manifest and the one changed block, not the state
    [back], _, problem = R.decode_all(frame)
    assert problem is None and back.state.HasField("state_blocks") and back.sent == sent
    records, pins, warnings = journalblocks.rebuilt([back], stored.get)
    assert warnings == [] and records[0].state == whole and records[0].wall == 1.5
    changed = blocks.block_hash(after[3 * B : 4 * B])
    # every block it names: the one it carried is on disk too (JB1), for the node's next report
    assert pins == {"s2": set(blocks.names(bytes(after))[0].names)} and changed in pins["s2"]
    assert journalblocks.held(sent) == pins["s2"] - {changed}


def test_a_record_that_cannot_be_made_whole_takes_its_snapshots_records_with_it():
    state = random.Random(2).randbytes(4 * B)
    stored = dict(zip(blocks.names(state)[0].names, blocks.split(state), strict=True))
    sent = as_blocks(report("s1", "p1", state), set(stored))
    records = [
        R.Started(snapshot_id="s1", initiator="p1", wall=1.0),
        R.Reported(state=sent, wall=1.1, sent=sent),
        R.Finished(snapshot_id="s1", status=pb.Snapshot.COMPLETE, reason="", wall=1.2),
        R.Started(snapshot_id="s2", initiator="p1", wall=2.0),
    ]
    gone = dict(stored)
    gone.pop(sent.state_blocks.hashes[2])
    kept, pins, warnings = journalblocks.rebuilt(records, gone.get)
    assert [r.snapshot_id for r in kept] == ["s2"] and pins == {}
    assert len(warnings) == 1 and "dropping snapshot s1" in warnings[0] and sent.state_blocks.hashes[2].hex() in warnings[0]
    skipped, pins, warnings = journalblocks.rebuilt(records, gone.get, skip={"s1"})  # filed: the replay skips it
    assert skipped == records and pins == {} and warnings == []


def test_a_replay_refuses_a_report_left_as_blocks():
    from snapmesh.protocol.controller.tracker import Now

    state = pb.FullState(snapshot_id="s1", node_id="a")
    state.state_blocks.hashes.append(bytes(32))
    record = R.Reported(state=state, wall=1.0, sent=state)

    class Tracker:
        epoch = 1
        forms = blockforms.BlockForms()  # nothing noted: the manifest is not a listed report (JB5)

        def report(self, *_):  # pragma: no cover  (must not be reached)
            raise AssertionError("a manifest reached the tracker")

    _, warnings = R.replay([record], Tracker(), Now(mono=0.0, wall=0.0), skip=set())  # type: ignore[arg-type]
    assert len(warnings) == 1 and "still a manifest of blocks" in warnings[0]


def test_a_block_stays_pinned_while_any_call_pins_it_and_a_refused_call_unpins_only_its_own():
    pins = BlockPins()
    x, y, z = b"x" * 32, b"y" * 32, b"z" * 32
    pins.pin("s1", {x, y}, call=1)
    pins.pin("s1", {y, z}, call=2)
    pins.pin("s2", {x}, call=3)
    assert pins.unpin("s1", 2) == {z}  # y is still call 1's
    assert pins.pinned(y) and not pins.pinned(z)
    assert pins.unpin("s1") == {y}  # x is still s2's
    assert pins.unpin("s2") == {x} and len(pins) == 0
    assert pins.unpin("s9") == set()


def test_a_report_journaled_whole_pins_its_blocks_on_disk_again():
    """JB3: the node takes the controller to hold the blocks of its report that came whole
    (JB1 wrote them), so a replay pins them again, cut as the node cut them; one the disk
    lost is not pinned (the node's next report naming it is refused and sent whole)."""
    state = random.Random(3).randbytes(3 * B + 100)
    whole = report("s1", "p1", state)
    whole.state_parts.extend([B + 7, 2 * B + 93])  # the node's own cut (B6), not the plain grid
    named = blocks.names(state, whole.state_parts)[0]
    disk = dict(zip(named.names, (state[a:b] for a, b in named.bounds), strict=True))
    [back], _, problem = R.decode_all(R.encode(R.Reported(state=whole, wall=1.0)))
    assert problem is None and back.sent is None
    records, pins, warnings = journalblocks.rebuilt([back], disk.get)
    assert records == [back] and warnings == [] and pins == {"s1": set(named.names)}
    lost = dict(disk)
    lost.pop(named.names[1])
    assert journalblocks.rebuilt([back], lost.get)[1] == {"s1": set(named.names) - {named.names[1]}}
    assert journalblocks.rebuilt([back], disk.get, skip={"s1"})[1] == {}  # filed: the replay skips it
    empty = report("s2", "p1", b"")
    assert journalblocks.rebuilt([R.Reported(state=empty, wall=1.0)], disk.get)[1] == {}


def test_a_large_report_as_blocks_is_read_back_listed_with_a_note_and_a_small_one_whole():
    """JB5: the large one's record holds its manifest and its size and digest are noted;
    a small one is made whole as before; a block gone drops the snapshot (JB3)."""
    large, small = random.Random(2).randbytes(9 * B + 3), random.Random(3).randbytes(2 * B)
    stored = {name: block for state in (large, small)
              for name, block in zip(blocks.names(state)[0].names, blocks.split(state), strict=True)}
    records = [R.Reported(state=w, wall=1.0, sent=as_blocks(w, set(stored)))
               for w in (report("s1", "p1", large), report("s1", "p2", small))]
    noted: list[tuple[pb.FullState, blockforms.BlockList]] = []
    back, pins, warnings = journalblocks.rebuilt(records, stored.get, note=lambda r, bl: noted.append((r, bl)))
    assert warnings == [] and len(pins["s1"]) == 12
    listed, whole = (r.state for r in back)
    assert not listed.HasField("state") and list(listed.state_blocks.hashes) == blocks.names(large)[0].names
    assert whole == report("s1", "p2", small)
    [(noted_report, block_list)] = noted
    assert noted_report == listed and block_list.size == len(large) and block_list.digest == digest(large)
    gone = dict(stored)
    del gone[blocks.names(large)[0].names[4]]
    kept, pins, warnings = journalblocks.rebuilt(records, gone.get, note=lambda r, bl: None)
    assert kept == [] and pins == {} and "dropping snapshot s1" in warnings[0]
