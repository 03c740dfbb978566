"""A blocks app's cut keeps its parts as they are (node/apphost.py H8): the state is
never joined or copied whole on the way from the marker to the report, its save and
the block shelf (cutnames.CN4, blocks.B8, reportblocks.RK5, statedigest.SD5)."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

from snapmesh.protocol import blocks, statedigest
from snapmesh.protocol.blocks import BLOCK_BYTES
from snapmesh.protocol.blockstate import BlockState
from snapmesh.protocol.node.apphost import Host
from snapmesh.protocol.node.cutnames import CutNames
from snapmesh.protocol.reports import report_message
from snapmesh.services.node.blockshelf import BlockShelf
from snapmesh.services.node.pendingreports import PendingReports
from snapmesh.services.node.sentblocks import SentBlocks
from snapmesh.v1 import snapmesh_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import blob_app  # noqa: E402
from support.applog import AppLogs  # noqa: E402

MIB = 1024 * 1024


def _host(mib: int = 2) -> Host:
    return Host(blob_app.app, node_id="p1", incoming=(), outgoing=(), params={"mib": mib})


def _report(sid: str, state, parts) -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id="p1", state_parts=[len(p) for p in parts], app_name="blob")


def test_the_cut_of_a_large_blocks_app_holds_the_apps_own_blocks_and_the_undo_base_too() -> None:
    host = _host()
    state, parts = host.cut()
    assert type(state) is BlockState and len(state) == 2 * MIB
    assert all(a is b for a, b in zip(state.blocks, host.machine.blocks, strict=True)), "the parts, not a copy"
    assert host.undo.base is state  # the undo base keeps them (H5), joined by nothing
    assert bytes(state) == host.machine.snapshot()  # BST3: the one join, where bytes are wanted


def test_a_small_state_is_joined_as_before_and_a_large_one_off_the_grid_is_kept() -> None:
    small = _host()
    small.machine._set(b"x" * (BLOCK_BYTES * 2 + 3))
    state, _ = small.cut()
    assert type(state) is bytes and len(state) == BLOCK_BYTES * 2 + 3
    off = _host()
    off.machine.blocks[0] = off.machine.blocks[0][:-1]  # a part that is not a whole block
    state, parts = off.cut()
    assert type(state) is BlockState and all(a is b for a, b in zip(state.blocks, parts, strict=True))
    assert bytes(state) == off.machine.snapshot()


def test_from_the_cut_to_the_saved_and_formed_report_nothing_copies_the_state_whole(tmp_path) -> None:
    host, names, sent = _host(4), CutNames(), SentBlocks(carry_over=64 * 1024)
    pending, shelf = PendingReports(tmp_path / "p1.reports"), BlockShelf(tmp_path / "p1.blocks")
    sent.on_formed = lambda named: shelf.keep("report", named)
    peaks, hashed = [], []
    for sid in ("s1", "s2"):
        host.command(blob_app.write(3 * BLOCK_BYTES + 7, sid.encode()))
        before = names.hashed, pending.blocks.hashed, sent.hashed
        tracemalloc.start()
        state, parts = host.cut()
        digest, named = names.digest(state, parts)
        message = _report(sid, state, parts)
        pending.save_unsynced(message, 1, state, named)
        formed, held = sent.form(message, pending.named.pop(sid))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert named is not None and named.state is state  # named from the parts (CN4)
        assert sent.last is named and digest == statedigest.blocks_form(bytes(state))
        carried = b"".join(formed.blocks)  # the first form carries every block (carry_over), the second one
        assert carried == bytes(state) if sid == "s1" else carried == state[3 * BLOCK_BYTES:4 * BLOCK_BYTES]
        hashed.append((names.hashed - before[0], pending.blocks.hashed - before[1], sent.hashed - before[2]))
        sent.accepted(pb.ReportStateResponse(takes_blocks=True), held)
    # The carried blocks of the first report are the protobuf's own copy; the rest of the path
    # (cut, names, save, shelf) holds no whole copy. The second report carries one block.
    assert peaks[1] < MIB, f"the second report's path allocated {peaks[1]} bytes of a {4 * MIB}-byte state"
    assert peaks[0] < 4 * MIB + MIB, peaks
    assert hashed == [(512, 0, 0), (1, 0, 0)], "each block hashed once, at the cut; the unchanged ones never"
    [(loaded, _)] = [(m, lsn) for m, lsn in pending.load() if m.snapshot_id == "s2"]
    assert loaded.state == host.machine.snapshot()


def test_a_node_machines_finished_part_is_its_apps_blocks_and_reports_whole_when_asked() -> None:
    logs = AppLogs(blob_app.app, ("p1", "p2"))
    node = logs.nodes["p1"]
    logs.command("p1", blob_app.write(5, b"hello"))
    node.start_snapshot("s1")
    logs.route("p1")
    while logs.deliver():
        pass
    part = logs.finished["s1", "p1"].state
    assert type(part.state) is BlockState
    assert all(a is b for a, b in zip(part.state.blocks, node.host.machine.blocks, strict=True))
    assert blocks.names(part.state, part.parts, None, part.named) == (part.named, 0)
    message = report_message(part)  # a v1 / simulator reader: joined there
    assert message.state == node.host.machine.snapshot()


def test_parts_that_moved_are_known_by_identity_and_none_in_place_is_hashed_again() -> None:
    parts = [bytes([i]) * BLOCK_BYTES for i in range(40)]
    names = CutNames()
    first = names.digest(BlockState(parts), tuple(parts))[1]
    assert names.hashed == 40
    moved = [b"\xff" * BLOCK_BYTES, *parts]  # one part in front: every other one a place further on
    second = names.digest(BlockState(moved), tuple(moved))[1]
    assert names.hashed == 41 and second is not None and first is not None
    assert second.names == [blocks.block_hash(moved[0]), *first.names]

    kept = BlockState(moved)
    assert names.digest(kept, tuple(moved))[1].names == second.names and names.hashed == 41


def test_carried_blocks_stay_the_states_own_and_stream_as_the_message_holding_them_would() -> None:
    from snapmesh.protocol import chunking

    host, names, sent = _host(4), CutNames(), SentBlocks(carry_over=64 * 1024)
    state, parts = host.cut()
    named = names.digest(state, parts)[1]
    message = _report("s1", state, parts)
    carried: list[bytes] = []
    tracemalloc.start()
    formed, _ = sent.form(message, named, carried)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert not formed.blocks and len(carried) == len(parts) and all(a is b for a, b in zip(carried, parts, strict=True))
    assert peak < MIB, f"a first report's form allocated {peak} bytes of a {4 * MIB}-byte state"
    whole = pb.FullState()
    whole.CopyFrom(formed)
    whole.blocks.extend(carried)
    extra = chunking.carried_bytes(carried)
    assert formed.ByteSize() + extra == whole.ByteSize()
    assert chunking.chunk_count(formed, extra=extra) == chunking.chunk_count(whole)
    apart = [c.data for c in chunking.stream_state(formed, carried=carried)]
    assert apart == [c.data for c in chunking.stream_state(whole)]
