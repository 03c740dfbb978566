"""blockdir.py D12, blockwrites.py BW1-BW5: the files of the blocks a report's record carries are
written after the report is answered, by one thread; every reader meanwhile gets them from
memory or waits for their write, and a deletion never races the write."""

import random
import threading

from snapmesh.protocol import blocks
from snapmesh.services.controller import blockdir
from snapmesh.services.controller.blockdir import BlockDir
from snapmesh.v1 import snapmesh_pb2 as pb
from support.report_service import report_service

B = blocks.BLOCK_BYTES


class Gate:
    """The block writer's thread held at its next batch until `open` (the write under way: `entered`)."""

    def __init__(self, files: BlockDir) -> None:
        self.entered, self._open = threading.Event(), threading.Event()
        real = files._later._write

        def write(batch):
            self.entered.set()
            assert self._open.wait(30), "the gate was never opened"
            real(batch)

        files._later._write = write

    def open(self) -> None:
        self._open.set()


def changed_report(tmp_path):
    """A report service, and its node's second report as blocks (one block changed) taken with the writer held."""
    c = report_service(tmp_path)
    state = bytearray(random.Random(5).randbytes(16 * B))
    node = c.first_report(bytes(state))
    state[3 * B] ^= 1
    sent, _ = node.form(pb.FullState(snapshot_id="s2", node_id="p1", state=bytes(state), app_name="blob",
                                     app_version=1))
    gate = Gate(c.store.blocks)
    c.service._whole_report(sent, 2)
    changed = blocks.block_hash(bytes(state[3 * B:4 * B]))
    return c, gate, changed, bytes(state[3 * B:4 * B])


def in_thread(call) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_a_report_s_carried_block_is_held_and_read_from_memory_before_its_file_is_written(tmp_path):
    c, gate, changed, block = changed_report(tmp_path)
    files = c.store.blocks
    assert not files.path(changed).exists()  # not on the report's path
    assert files.holds(changed) and files.read(changed) == block and not files.lacking([changed])  # BW2
    assert files.unsynced == 1  # a report answered without a record of its own settles it (servicer.py)
    gate.open()
    files.settle()
    assert files.path(changed).read_bytes() == block and files.unsynced == 0
    c.writer.close()


def test_settle_waits_for_the_pending_write_then_syncs_it(tmp_path, monkeypatch):
    c, gate, changed, block = changed_report(tmp_path)
    synced = []
    real = blockdir.sync_renamed
    monkeypatch.setattr(blockdir, "sync_renamed", lambda d, paths: (synced.append({p.name for p in paths}), real(d, paths)))
    settling = in_thread(c.store.blocks.settle)
    assert gate.entered.wait(30)
    settling.join(0.2)
    assert settling.is_alive() and synced == []  # BW5: not before the file is written
    gate.open()
    settling.join(30)
    assert synced == [{changed.hex()}] and c.store.blocks.path(changed).read_bytes() == block
    c.writer.close()


def test_a_deletion_waits_for_the_batch_writing_its_block_and_leaves_no_file(tmp_path):
    c, gate, changed, _ = changed_report(tmp_path)
    assert gate.entered.wait(30)  # the batch holding the block is being written
    deleting = in_thread(lambda: c.store.unpin("s2", 2))  # refused after all: its new block goes (BW4)
    deleting.join(0.2)
    assert deleting.is_alive()
    gate.open()
    deleting.join(30)
    c.store.blocks.settle()
    assert not c.store.blocks.path(changed).exists() and not c.store.blocks.holds(changed)
    c.writer.close()


def test_a_deletion_drops_a_queued_block_that_is_then_never_written(tmp_path):
    c, gate, changed, block = changed_report(tmp_path)
    assert gate.entered.wait(30)
    c.store.blocks.write_later({b"\0" * 32: b"x"})  # queued behind the batch held at the gate
    c.store.blocks.delete([b"\0" * 32])
    gate.open()
    c.store.blocks.settle()
    assert not c.store.blocks.path(b"\0" * 32).exists()
    assert c.store.blocks.path(changed).read_bytes() == block
    c.writer.close()


def test_the_controller_s_orderly_stop_writes_every_pending_block(tmp_path):
    c, gate, changed, block = changed_report(tmp_path)
    closing = in_thread(c.writer.close)  # SIGTERM: process.py closes the store's writer (BW5)
    closing.join(0.2)
    assert closing.is_alive()
    gate.open()
    closing.join(30)
    assert c.store.blocks.path(changed).read_bytes() == block


def test_a_durable_write_of_a_pending_block_waits_for_it_and_no_unsynced_rename_follows(tmp_path):
    c, gate, changed, block = changed_report(tmp_path)
    files = c.store.blocks
    assert gate.entered.wait(30)
    writing = in_thread(lambda: files.write({changed: block}))  # a filing's (BW5)
    writing.join(0.2)
    assert writing.is_alive()
    gate.open()
    writing.join(30)
    files._later.flush()
    assert files.unsynced == 0  # its file durable, not renamed over unsynced after the durable write
    assert files.path(changed).read_bytes() == block
    c.writer.close()
