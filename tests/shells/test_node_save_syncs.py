"""A node's save of a large state syncs its one pending-report file and that file's
directory, never the whole file system (snapmesh/protocol/savedblocks.py SV1,
services/node/reportblocks.py RK1): the same few syncs however many blocks changed,
and none that waits for another process's writes. Its carried blocks are written
whole however the kernel splits the write (serving/durable.py `write_pieces_durably`)."""

from __future__ import annotations

import os
import random

import pytest

from snapmesh.protocol import blocks
from snapmesh.serving import durable
from snapmesh.services.node.pendingreports import PendingReports
from snapmesh.v1 import snapmesh_pb2 as pb

B = blocks.BLOCK_BYTES


def report(sid: str) -> pb.FullState:
    return pb.FullState(snapshot_id=sid, node_id="p1", app_name="blob", app_version=1)


@pytest.mark.parametrize("changed", [1, 40])
def test_a_save_syncs_its_file_and_directory_only_whatever_changed(tmp_path, monkeypatch, changed):
    pending = PendingReports(tmp_path / "p1.reports")
    state = bytearray(random.Random(changed).randbytes(64 * B))
    pending.save_unsynced(report("s1"), 1, bytes(state), None)
    pending.blocks.collect()
    pending.remove("s1")
    for i in range(changed):
        state[i * B] ^= 1
    calls: list[tuple[str, str]] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, name=name, real=real: calls.append(
            (name, os.readlink(f"/proc/self/fd/{fd}"))) or real(fd))
    monkeypatch.setattr(durable, "_SYNCFS", lambda fd: calls.append(("syncfs", "")) or 0)
    assert pending.save_unsynced(report("s2"), 2, bytes(state)) == [], "nothing left for the round to sync"
    [file] = pending.directory.glob("*" + PendingReports.SUFFIX)
    assert calls == [("fdatasync", str(file)), ("fsync", str(pending.directory))]
    calls.clear()
    pending.blocks.collect()  # off the report's path: the carried blocks synced into their directory
    assert ("syncfs", "") in calls or len(calls) == changed + 1
    assert {m.snapshot_id: m.state for m, _ in PendingReports(tmp_path / "p1.reports").load()} == {"s2": bytes(state)}


def test_the_pieces_are_written_whole_however_the_kernel_splits_the_write(tmp_path, monkeypatch):
    pieces = [random.Random(n).randbytes(n * 37 + 1) for n in range(2000)]  # more than one writev can take
    real = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, views: real(fd, views[:3]) if len(views) > 3 else
                        real(fd, [memoryview(views[0])[:max(1, len(views[0]) // 2)]]))  # short writes
    path = durable.write_pieces_durably(tmp_path / "out", pieces)
    assert path.read_bytes() == b"".join(pieces)
    assert [p.name for p in tmp_path.iterdir()] == ["out"], "no temporary file left"
