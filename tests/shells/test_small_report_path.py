"""A report whose state came whole and is at most one block is taken with no thread hand-off
and no sync before it (servicer.py KEPT_MIN_BYTES): its record holds the state whole, its
filing writes the block later. It is answered takes_blocks=False, so the node's next report
comes whole too. A state of more than one block is still cut, kept and written before its
record, and answered takes_blocks=True.

An in-process engine and servicer on a real journal and store (support/controller_fakes.py);
the syncs (fsync, fdatasync, syncfs) and the loop's executor hand-offs are counted from the
call's start to the engine taking the report.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from snapmesh.protocol import blocks
from snapmesh.serving import durable
from snapmesh.v1 import snapmesh_pb2 as pb
from support.controller_fakes import CallContext, blob_controller

pytestmark = [pytest.mark.timeout(60)]


def report(sid: str, node: str, state: bytes) -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id=node, state=state, app_name="blob", app_version=1,
                        channels=[pb.ChannelState(src="b" if node == "a" else "a", dst=node)])


@pytest.mark.parametrize("size, kept", [(200, False), (blocks.BLOCK_BYTES, False), (3 * blocks.BLOCK_BYTES, True)])
def test_a_small_whole_state_is_taken_with_no_hand_off_and_no_sync(tmp_path, monkeypatch, size: int,
                                                                   kept: bool) -> None:
    counts = {"syncs": 0, "hand_offs": 0}
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, real=real: (counts.__setitem__("syncs", counts["syncs"] + 1),
                                                             real(fd))[1])
    real_syncfs = durable._syncfs
    monkeypatch.setattr(durable, "_syncfs", lambda d: (counts.__setitem__("syncs", counts["syncs"] + 1),
                                                       real_syncfs(d))[1])
    asyncio.run(_taken(tmp_path, size, kept, counts))


async def _taken(tmp_path, size: int, kept: bool, counts: dict[str, int]) -> None:
    c = blob_controller(tmp_path)
    loop = asyncio.get_running_loop()
    run_in_executor = loop.run_in_executor

    def counted(*args, **kwargs):
        counts["hand_offs"] += 1
        return run_in_executor(*args, **kwargs)

    loop.run_in_executor = counted  # type: ignore[method-assign]
    sid = (await c.engine.trigger("a")).snapshot_id
    before: dict[str, int] = {}
    # The blocks held as each report is taken: the filing, which writes a small state's
    # block, may already have run once the snapshot is COMPLETE, so that is read here.
    held_when_taken: list[set] = []
    engine_report = c.engine.report

    async def taken(state, sent=None):
        before.update(counts)
        held_when_taken.append(set(c.store.blocks.names()))
        return await engine_report(state, sent=sent)

    c.engine.report = taken  # type: ignore[method-assign]
    start = dict(counts)
    rng = random.Random(size)
    answers = await asyncio.wait_for(asyncio.gather(
        *(c.service.ReportState(report(sid, node, rng.randbytes(size)), CallContext()) for node in ("a", "b"))), 10)
    assert c.engine.machine.get(sid).status == pb.Snapshot.COMPLETE
    held = c.store.blocks.names()
    if kept:
        assert before["hand_offs"] > start["hand_offs"] and held, "a state of several blocks was not kept"
        assert all(answer.takes_blocks for answer in answers)
    else:
        assert before == start, f"before the report was taken: {before['syncs'] - start['syncs']} syncs, " \
                                f"{before['hand_offs'] - start['hand_offs']} thread hand-offs"
        assert len(held_when_taken) == 2 and not any(held_when_taken), \
            "a block of a small state was written before its report was taken"
        assert not any(answer.takes_blocks for answer in answers), "the node is told its next may go as blocks"
    c.writer.close()
    await c.engine.close()
    await c.journal.close()
