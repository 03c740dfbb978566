"""blockdir.py D10: a node's block sizes found all on disk are not checked against the
directory again, name by name, until something may have left it: a removal the controller
made, one its watch saw behind its back, a read that found no file, or a listing."""

from __future__ import annotations

import os
from types import SimpleNamespace

from snapmesh.protocol.blocks import block_hash
from snapmesh.services.controller.blockdir import BlockDir
from snapmesh.services.controller.servicer import ControllerService
from snapmesh.services.controller.store import SnapshotStore, StoreWriter


def blocks(count: int, seed: int = 0) -> dict[bytes, bytes]:
    contents = [os.urandom(64) + bytes([seed, i]) for i in range(count)]
    return {block_hash(c): c for c in contents}


def test_removals_count_what_may_take_a_held_name_away_and_writes_do_not(tmp_path):
    files = BlockDir(tmp_path / "blocks")
    written = blocks(6)
    files.write(written)
    files.names()
    at = files.removals
    files.write(blocks(3, seed=1))
    assert files.holds(next(iter(written))) and files.removals == at, "a write takes nothing away"
    first, second, third, *_ = written
    files.delete([first])
    assert files.removals > at
    at = files.removals
    files.path(second).unlink()  # behind its back: a read finds it gone
    assert files.read(second) is None and files.removals > at
    at = files.removals
    files.names()  # a listing (the watch starts from it)
    assert files.removals > at
    at = files.removals
    files.path(third).unlink()
    files.listed_for("s1")  # the watch says what went (D9), no listing
    assert files.removals > at and not files.holds(third)


def counting(files: BlockDir) -> list[int]:
    calls = [0]
    real = files.lacking

    def lacking(names):
        calls[0] += 1
        return real(names)

    files.lacking = lacking  # type: ignore[method-assign]
    return calls


def test_a_node_s_sizes_are_checked_once_and_again_only_after_a_removal(tmp_path):
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    writer = StoreWriter(store, on_filed=lambda sid: None)
    try:
        service = ControllerService(SimpleNamespace(writer=writer, machine=SimpleNamespace(  # type: ignore[arg-type]
            forms=SimpleNamespace())))
        files = store.blocks
        written = blocks(8)
        files.write(written)
        service._sizes["p1"] = {name: len(block) for name, block in written.items()}
        calls = counting(files)
        names = list(written)
        assert service._sized("p1", "s1")(names[0]) == len(written[names[0]])
        assert calls[0] == 1
        for sid in ("s1", "s2", "s3"):  # no removal since: no pass over the sizes again
            assert service._sized("p1", sid)(names[1]) == len(written[names[1]])
        assert calls[0] == 1, "checked once while nothing left"
        files.delete([names[0]])  # the controller's own removal
        assert service._sized("p1", "s3")(names[0]) is None and calls[0] == 2
        files.path(names[2]).unlink()  # behind its back, seen by the next snapshot's watch
        assert service._sized("p1", "s4")(names[2]) is None
        assert service._sized("p1", "s4")(names[3]) == len(written[names[3]])
        service._sizes["p1"] = dict(service._sizes["p1"])  # the node's next state listed: its own check
        before = calls[0]
        service._sized("p1", "s4")
        assert calls[0] == before + 1
    finally:
        writer.close()


def test_a_listed_report_s_sizes_are_not_checked_by_the_node_s_next_report_unless_a_block_went(tmp_path, monkeypatch):
    """D10 on the report path: a report of a state too large to join (BF6) leaves its sizes taken
    as checked (each of its names found held or written by it); the node's next report then makes
    no pass over them, until a block file is removed."""
    import random

    from snapmesh.protocol import statedigest
    from snapmesh.protocol.controller.blockforms import BlockForms
    from snapmesh.services.controller import servicer
    from snapmesh.services.node.sentblocks import SentBlocks
    from snapmesh.v1 import snapmesh_pb2 as pb

    monkeypatch.setattr(servicer, "JOINED_MAX_BYTES", 256 * 1024)
    store = SnapshotStore(tmp_path / "snapshots", tmp_path / "controller" / "snapshots")
    writer = StoreWriter(store, on_filed=lambda sid: None)
    forms = BlockForms()
    try:
        service = ControllerService(SimpleNamespace(writer=writer, machine=SimpleNamespace(  # type: ignore[arg-type]
            forms=forms)))
        calls = counting(store.blocks)
        node = SentBlocks()
        state = bytearray(random.Random(3).randbytes(64 * 8192))

        def report(sid: str, call: int) -> pb.FullState:
            said = statedigest.blocks_form(bytes(state))  # the node's digest: known sizes are taken unread (BF6)
            sent, names = node.form(pb.FullState(snapshot_id=sid, node_id="p1", state=bytes(state), app_name="kv",
                                                 app_version=1, state_digest=said))
            got = service._whole_report(sent, call)
            node.accepted(pb.ReportStateResponse(takes_blocks=True), names)
            return got

        first, names = node.form(pb.FullState(snapshot_id="s0", node_id="p1", state=bytes(state), app_name="kv",
                                              app_version=1))
        service._know(first, 0)
        node.accepted(pb.ReportStateResponse(takes_blocks=True), names)
        for sid, call in (("s1", 1), ("s2", 2)):
            state[call * 9000] ^= 1
            assert report(sid, call).HasField("state_blocks")
        before = calls[0]
        state[30 * 8192] ^= 1
        got = report("s3", 3)
        assert calls[0] == before, "no pass over the node's sizes: none went since they were checked"
        assert forms.of(got).size == len(state)
        store.blocks.delete([got.state_blocks.hashes[50]])  # a removal (of a block the next state no longer
        state[50 * 8192] ^= 1  # names): the next report checks its sizes again
        assert forms.of(report("s4", 4)).size == len(state)
        assert calls[0] > before
    finally:
        writer.close()
