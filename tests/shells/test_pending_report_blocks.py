"""A node's pending report of a large state is saved as blocks, each once
(services/node/reportblocks.py RK1-RK6, snapmesh/protocol/savedblocks.py SV1-SV3): the
file holds the manifest and carries the blocks not durable yet, a later report carries
only the blocks that changed, a restart reads the state back whole
from them, and a report whose blocks are not all there (power lost during the
round's sync) is dropped with a warning, never read back wrong."""

from __future__ import annotations

import logging
import os
import random

import pytest

from snapmesh.protocol import blocks
from snapmesh.services.node.pendingreports import CorruptReportError, PendingReports
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES


def report(sid: str, state: bytes) -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id="p1", state=state, app_name="blob", app_version=1)


def block_files(pending: PendingReports) -> set[str]:
    directory = pending.blocks.directory
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


def test_a_large_state_is_saved_once_and_a_later_one_carries_what_changed(tmp_path):
    pending = PendingReports(tmp_path / "p1.reports")
    state = bytearray(random.Random(1).randbytes(32 * B))
    assert pending.save_unsynced(report("s1", bytes(state)), 7, bytes(state)) == [], "durable already: nothing to sync"
    [file] = pending.directory.glob("*" + PendingReports.SUFFIX)
    assert block_files(pending) == set() and len(file.read_bytes()) > 32 * B, "every block carried in its file (SV1)"
    assert pending.blocks.collect() == 0 and len(block_files(pending)) == 32, "then in their directory (SV2)"
    pending.remove("s1")  # accepted
    state[5 * B] ^= 1
    pending.save_unsynced(report("s2", bytes(state)), 9, bytes(state))
    [file] = pending.directory.glob("*" + PendingReports.SUFFIX)
    assert len(file.read_bytes()) < 32 * 40 + B + 200, "the manifest and the one changed block"
    assert len(block_files(pending)) == 32, "the save writes and deletes no block: the round is the report's path"
    assert pending.blocks.collect() == 1
    assert len(block_files(pending)) == 32, "s2's block in, the block s1 had there and s2 does not gone (RK2)"
    [(message, lsn)] = pending.load()
    assert (message.snapshot_id, lsn, message.state) == ("s2", 9, bytes(state))
    assert not message.HasField("state_blocks")


def test_a_pending_report_keeps_its_blocks_while_a_later_one_is_saved(tmp_path):
    pending = PendingReports(tmp_path / "p1.reports")
    one = random.Random(2).randbytes(16 * B)
    two = random.Random(3).randbytes(16 * B)  # no block alike
    pending.save_unsynced(report("s1", one), 1, one)
    pending.save_unsynced(report("s2", two), 2, two)  # s1 not yet accepted: its blocks stay
    pending.blocks.collect()
    assert len(block_files(pending)) == 32
    found = {m.snapshot_id: m.state for m, _ in PendingReports(tmp_path / "p1.reports").load()}
    assert found == {"s1": one, "s2": two}


def test_a_report_whose_block_is_lost_or_wrong_is_dropped_with_a_warning(tmp_path, caplog):
    pending = PendingReports(tmp_path / "p1.reports")
    state = bytearray(random.Random(4).randbytes(16 * B))
    pending.save_unsynced(report("s1", bytes(state)), 1, bytes(state))
    pending.blocks.collect()
    pending.remove("s1")
    state[9 * B] ^= 1
    pending.save_unsynced(report("s2", bytes(state)), 2, bytes(state))  # carries block 9 only
    victim = pending.blocks.path(blocks.block_hash(state[3 * B:4 * B]))
    victim.write_bytes(b"\0" * B)  # its name kept, not its bytes
    again = PendingReports(tmp_path / "p1.reports")
    with caplog.at_level(logging.WARNING):
        assert again.load() == []
    assert "does not hash to its name" in caplog.text and "dropping it" in caplog.text
    assert block_files(again) == set(), "no pending report names them: swept"


def test_a_crash_between_the_report_file_and_the_block_directory_loses_and_duplicates_nothing(tmp_path):
    """SV2-SV3: a crash after the report's file is durable and before (or while) its
    carried blocks reach their directory: the restart rebuilds the state from the file,
    writes the carried blocks there whole (over one the crash cut short) and syncs them,
    and a later save carries none of them again."""
    pending = PendingReports(tmp_path / "p1.reports")
    one = bytearray(random.Random(6).randbytes(16 * B))
    pending.save_unsynced(report("s1", bytes(one)), 1, bytes(one))
    pending.blocks.collect()
    pending.remove("s1")
    one[2 * B] ^= 1
    one[7 * B] ^= 1
    two = bytes(one)
    pending.save_unsynced(report("s2", two), 2, two)
    torn = pending.blocks.path(blocks.block_hash(two[2 * B:3 * B]))
    torn.write_bytes(two[2 * B:2 * B + 100])  # the crash: the collection half wrote block 2, not block 7
    again = PendingReports(tmp_path / "p1.reports")
    [(message, lsn)] = again.load()
    assert (message.snapshot_id, lsn, message.state) == ("s2", 2, two)
    assert torn.read_bytes() == two[2 * B:3 * B], "written whole from the file"
    assert pending.blocks.path(blocks.block_hash(two[7 * B:8 * B])).read_bytes() == two[7 * B:8 * B]
    assert len(block_files(again)) == 16, "s1's two old blocks swept"
    again.save_unsynced(report("s3", two), 3, two)
    [third, _] = sorted(again.directory.glob("*" + PendingReports.SUFFIX), key=lambda p: p.stat().st_size)
    assert len(third.read_bytes()) < 16 * 40 + 200, "nothing carried: every block durable in the directory"
    found = {m.snapshot_id: m.state for m, _ in PendingReports(tmp_path / "p1.reports").load()}
    assert found == {"s2": two, "s3": two}


def test_a_pending_report_whose_carried_blocks_are_cut_short_is_dropped(tmp_path, caplog):
    pending = PendingReports(tmp_path / "p1.reports")
    state = random.Random(8).randbytes(16 * B)
    pending.save_unsynced(report("s1", state), 1, state)
    [file] = pending.directory.glob("*" + PendingReports.SUFFIX)
    file.write_bytes(file.read_bytes()[:-B // 2])  # power lost while it was synced: half its last block
    with caplog.at_level(logging.WARNING):
        assert PendingReports(tmp_path / "p1.reports").load() == []
    assert "cut short" in caplog.text and not file.exists()


def test_a_pending_report_whose_carried_blocks_do_not_frame_is_refused_by_name(tmp_path):
    pending = PendingReports(tmp_path / "p1.reports")
    state = random.Random(9).randbytes(16 * B)
    pending.save_unsynced(report("s1", state), 1, state)
    [file] = pending.directory.glob("*" + PendingReports.SUFFIX)
    data = bytearray(file.read_bytes())
    first = len(data) - 16 * (B + 4)
    data[first:first + 4] = (B * 4).to_bytes(4, "big")  # a length past the blocks
    file.write_bytes(bytes(data))
    with pytest.raises(CorruptReportError, match=f"{file}: a carried block at byte 0"):
        PendingReports(tmp_path / "p1.reports").load()
    assert file.exists(), "left for a human"


def test_a_small_state_stays_in_its_file(tmp_path):
    pending = PendingReports(tmp_path / "p1.reports")
    state = b"x" * 1000
    [path] = pending.save_unsynced(report("s1", state), 3, state)
    assert state in path.read_bytes() and block_files(pending) == set()
    [(message, _)] = pending.load()
    assert message.state == state


def test_the_report_is_formed_from_the_names_its_save_found(tmp_path):
    """RK4: the save cut and named the state; the report's form takes those names
    rather than cutting, comparing and hashing it again, and sends the same."""
    from snapmesh.services.node.sentblocks import SentBlocks

    pending = PendingReports(tmp_path / "p1.reports")
    state = bytearray(random.Random(5).randbytes(24 * B))
    node, fresh = SentBlocks(), SentBlocks()
    for call, sid in enumerate(["s1", "s2"], start=1):
        state[call * B] ^= 1
        message = report(sid, bytes(state))
        pending.save_unsynced(message, call, bytes(state))
        named = pending.named.pop(sid)
        sent, names = node.form(message, named)
        assert (sent, names) == fresh.form(message)
        for reporter in (node, fresh):
            reporter.accepted(pb.ReportStateResponse(takes_blocks=True), names)
    assert node.hashed == 0 and pending.blocks.hashed == 24 + 1, "hashed by the save only, each change once"
    assert sent.HasField("state_blocks") and len(sent.blocks) == 1


def test_a_block_named_again_before_its_collection_is_kept(tmp_path, monkeypatch):
    """RK2: a save unlinks nothing; a block that became garbage and that a later save names
    again (the state changed back) is no longer garbage, so `collect` leaves it, and the
    later report reads back whole."""
    pending = PendingReports(tmp_path / "p1.reports")
    state = bytearray(random.Random(4).randbytes(16 * B))
    original = bytes(state)
    pending.save_unsynced(report("s1", original), 1, original)
    pending.blocks.collect()  # its blocks in their directory
    pending.remove("s1")
    state[3 * B] ^= 1
    unlinked = []
    real = os.unlink
    blocks_dir = str(pending.blocks.directory)
    monkeypatch.setattr(os, "unlink", lambda path, *a, **k: (str(path).startswith(blocks_dir) and unlinked.append(path))
                        or real(path, *a, **k))  # a block's file, not a report's
    pending.save_unsynced(report("s2", bytes(state)), 2, bytes(state))  # the original block 3: garbage
    pending.remove("s2")
    assert unlinked == [] and pending.blocks.garbage == 1
    pending.save_unsynced(report("s3", original), 3, original)  # named again: kept
    assert unlinked == []
    assert pending.blocks.collect() == 0  # the changed block 3 of s2, never written (SV2): nothing names it
    [(message, lsn)] = PendingReports(tmp_path / "p1.reports").load()
    assert (message.snapshot_id, lsn, message.state) == ("s3", 3, original)
