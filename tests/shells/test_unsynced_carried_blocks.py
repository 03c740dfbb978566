"""The blocks a report's journal record carries are written unsynced, and settled before anything
could leave them without that record (services/controller/blockdir.py D8, journalblocks.py JB1,
JB3): a report as blocks costs no sync of its blocks (its record's fdatasync covers them); a
filing settles them before its manifest names them; a journal rewrite settles them before it may
drop their record; a durable write that finds one settles it; and the replay's write-back finds
the blocks the live records carry (those of filed snapshots left out)."""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path

from snapmesh.protocol import blocks
from snapmesh.protocol.controller import journal as R
from snapmesh.protocol.controller import journalblocks
from snapmesh.services.controller import blockdir
from snapmesh.services.controller import journal as J
from snapmesh.services.controller import store as store_module
from snapmesh.services.controller.blockdir import BlockDir
from snapmesh.v1 import snapmesh_pb2 as pb
from support.controller_fakes import CallContext, blob_controller
from support.report_service import report_service

B = blocks.BLOCK_BYTES


def recording(monkeypatch) -> list[tuple[str, object]]:
    """Every sync the block store and the store make, and each manifest written, in order."""
    events: list[tuple[str, object]] = []
    real = {name: getattr(blockdir, name) for name in ("sync_files", "sync_renamed", "fsync_dir")}
    real_write_atomically = store_module.write_atomically

    def wrap(name):
        def call(directory, *args):
            events.append((name, {Path(p).name for p in (args[0] if args else [])}))
            return real[name](directory, *args)
        return call

    for name in real:
        monkeypatch.setattr(blockdir, name, wrap(name))

    def write_atomically(path, data):
        events.append(("manifest", Path(path).name))
        return real_write_atomically(path, data)

    monkeypatch.setattr(store_module, "write_atomically", write_atomically)
    return events


def test_a_report_s_carried_blocks_cost_no_sync_and_its_filing_settles_them_before_its_manifest(tmp_path, monkeypatch):
    c = report_service(tmp_path)
    service, forms, store, writer = c.service, c.forms, c.store, c.writer
    state = bytearray(random.Random(3).randbytes(16 * B))
    node = c.first_report(bytes(state))
    assert store.blocks.unsynced == 0  # whole: its record carries no block, so they are written durably (JB4)
    state[5 * B] ^= 1
    sent, _ = node.form(pb.FullState(snapshot_id="s2", node_id="p1", state=bytes(state), app_name="blob",
                                     app_version=1))
    changed = blocks.block_hash(bytes(state[5 * B:6 * B]))
    assert [blocks.block_hash(block) for block in sent.blocks] == [changed]
    events = recording(monkeypatch)
    listed = service._whole_report(sent, 2)
    assert events == [], "a report as blocks synced: its record's fdatasync is what makes its blocks durable"
    assert store.blocks.read(changed) == bytes(state[5 * B:6 * B])  # held at once (its file later: D12)
    assert store.blocks.unsynced == 1

    snapshot = pb.Snapshot(snapshot_id="s2", status=pb.Snapshot.COMPLETE, initiator="p1")
    entry = snapshot.nodes.add(node_id="p1", app_name="blob", app_version=1)
    noted = forms.of(listed)
    assert noted is not None
    forms.fill(entry, noted)
    entry.state_digest = "sha256:" + hashlib.sha256(bytes(state)).hexdigest()
    snapshot.app.status = pb.AppCheck.UNCHECKED
    store.file_compact(snapshot)
    writer.close()
    kinds = [kind for kind, _ in events]
    assert "manifest" in kinds and ("sync_renamed", {changed.hex()}) in events, events
    assert kinds.index("sync_renamed") < kinds.index("manifest"), "the manifest named a block not yet settled"
    assert store.blocks.unsynced == 0


def test_a_durable_write_that_finds_an_unsynced_block_settles_it(tmp_path, monkeypatch):
    files = BlockDir(tmp_path / "blocks")
    block = random.Random(1).randbytes(B)
    name = blocks.block_hash(block)
    files.write({name: block}, durable=False)
    events = recording(monkeypatch)
    assert files.write({name: block}) == (0, 0)  # there already: not written again
    assert events == [("sync_renamed", {name.hex()})] and files.unsynced == 0


def test_a_deleted_unsynced_block_needs_no_settle(tmp_path, monkeypatch):
    files = BlockDir(tmp_path / "blocks")
    block = random.Random(2).randbytes(B)
    name = blocks.block_hash(block)
    files.write({name: block}, durable=False)
    files.delete([name])
    events = recording(monkeypatch)
    assert files.settle() == 0 and events == []


def test_a_journal_rewrite_settles_the_blocks_first(tmp_path) -> None:
    asyncio.run(_rewrite_settles(tmp_path))


async def _rewrite_settles(tmp_path) -> None:
    files = BlockDir(tmp_path / "blocks")
    block = random.Random(4).randbytes(B)
    files.write({blocks.block_hash(block): block}, durable=False)
    path = tmp_path / "journal"
    seen: list[tuple[int, bool]] = []
    journal = J.Journal(path, rotate_bytes=1,
                        before_rewrite=lambda: seen.append((files.settle(), path.read_bytes().count(b"s1") > 0)))
    journal.open()
    await journal.append(R.Started(snapshot_id="s1", initiator="a", wall=1.0))
    await journal.append(R.Finished(snapshot_id="s1", status=pb.Snapshot.FAILED, reason="x", wall=1.5))
    journal.forget("s1")  # dead, past the (tiny) bound: the next round sets off a rewrite that drops it
    await journal.append(R.Started(snapshot_id="s2", initiator="a", wall=2.0))
    await journal.barrier()
    await journal.close()
    assert seen == [(1, True)], "the rewrite dropped its records before the blocks were settled"
    assert files.unsynced == 0 and b"s1" not in path.read_bytes()


def test_the_replay_writes_back_the_blocks_live_records_carry_only(tmp_path):
    carried = [random.Random(i).randbytes(B) for i in range(3)]
    names = [blocks.block_hash(block) for block in carried]

    def report(sid: str, carries: list[bytes], extra: bytes = b"") -> R.Reported:
        sent = pb.FullState(snapshot_id=sid, node_id="p1")
        sent.state_blocks.hashes.extend([blocks.block_hash(block) for block in carries])
        sent.blocks.extend([*carries, *([extra] if extra else [])])
        return R.Reported(state=sent, wall=1.0, sent=sent)

    stray = random.Random(9).randbytes(B)  # carried, not named by its manifest: never written (JB1)
    records = [R.Started(snapshot_id="s1", initiator="a", wall=1.0), report("s1", carried[:1]),
               report("s2", carried[1:], stray), R.Reported(state=pb.FullState(snapshot_id="s2", node_id="p2"), wall=1.0)]
    assert journalblocks.carried(records) == dict(zip(names, carried, strict=True))
    assert journalblocks.carried(records, skip={"s1"}) == dict(zip(names[1:], carried[1:], strict=True))

    files = BlockDir(tmp_path / "blocks")
    files.write(dict(zip(names, carried, strict=True)), durable=False)
    files.path(names[0]).write_bytes(b"")  # what an OS crash may leave of a block renamed unsynced
    files.path(names[1]).unlink()
    restarted = BlockDir(tmp_path / "blocks")  # at start, as the controller's process does (JB3)
    assert restarted.write(journalblocks.carried(records)) == (2, 2 * B)
    assert all(restarted.path(name).read_bytes() == block for name, block in zip(names, carried, strict=True))


def test_a_held_report_its_snapshot_s_failure_dropped_is_answered_only_once_its_blocks_are_settled(tmp_path):
    """held.py H2: at FAILED a held report's record is dropped, never journaled, and the call is
    answered OK, so the node takes its blocks as held: no record carries them, so they are
    settled before the answer (blockdir.py D8; the filing, which would settle them too, is off)."""
    asyncio.run(_held_and_failed(tmp_path))


async def _held_and_failed(tmp_path) -> None:
    c = blob_controller(tmp_path, deadline_s=2.0)
    c.writer.submit = lambda *args, **kwargs: None  # type: ignore[method-assign]
    sid = (await c.engine.trigger("a")).snapshot_id
    state = random.Random(6).randbytes(12 * B)
    whole = pb.FullState(snapshot_id=sid, node_id="a", state=state, app_name="blob", app_version=1,
                         channels=[pb.ChannelState(src="b", dst="a")])
    sent, _ = blocks.referenced_report(whole, set(), carry_all=True)
    assert sent is not None and len(sent.blocks) == 12
    written = asyncio.create_task(c.service.ReportState(sent, CallContext()))
    while c.store.blocks.unsynced < 12 and not written.done():  # held (H1), its blocks written unsynced
        await asyncio.sleep(0.01)
    assert not written.done(), "answered before the deadline: the test proves nothing"
    answer = await asyncio.wait_for(written, 10)  # b never reports: the deadline fails it
    assert c.tracker._finished[sid].status == pb.Snapshot.FAILED and answer.takes_blocks
    assert c.store.blocks.unsynced == 0, "answered with its blocks neither settled nor carried by a record"
    await c.engine.close()
    await c.journal.close()
