"""The controller's blocks are made durable with a constant number of syncs per
filing, whatever their count, and still no manifest names a block that is not
durable (services/controller/blockdir.py D1-D4): checked by the order of the
calls, by a crash injected at each step followed by a power loss (every file not
synced loses its content), and by a filing process killed with SIGKILL."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from snapmesh.checking import snapshot_file
from snapmesh.protocol import blocks
from snapmesh.serving import durable
from snapmesh.services.controller import blockdir, store as store_module
from snapmesh.services.controller.store import SnapshotStore
from snapmesh.v1 import snapmesh_pb2 as pb
from support.polling import wait_for

B = blocks.BLOCK_BYTES
REPO = Path(__file__).resolve().parents[2]


class Crash(BaseException):
    """The process stops here (not an OSError: nothing cleans up after it)."""


def snapshot(sid: str, seed: int, blocks_per_node: int) -> pb.Snapshot:
    out = pb.Snapshot(snapshot_id=sid, status=pb.Snapshot.COMPLETE, initiator="p1")
    for i in range(2):
        set_state(out.nodes.add(node_id=f"p{i + 1}", app_name="blob", app_version=1),
                  random.Random(f"{seed}-{i}").randbytes(blocks_per_node * B))
    out.app.status = pb.AppCheck.UNCHECKED
    return out


def set_state(node: pb.NodeBalance, state: bytes) -> None:
    node.state = state
    node.state_digest = snapshot_file.PREFIX + hashlib.sha256(state).hexdigest()


def new_store(root: Path) -> SnapshotStore:
    return SnapshotStore(root / "snapshots", root / "controller" / "snapshots")


def power_loss(root: Path, synced: set[Path]) -> None:
    """What a power loss after a crash leaves: each block file written since its
    last sync holds nothing (its content was never on disk)."""
    for path in (root / "controller" / "blocks").iterdir():
        if path not in synced:
            path.write_bytes(b"")


def restart_and_check(root: Path, kept: list[str]) -> None:
    restarted = new_store(root)
    loaded, warnings = restarted.load_all()
    assert warnings == [] and [s.snapshot_id for s in loaded] == kept
    restarted.sweep()
    assert not [p for p in (root / "controller" / "blocks").iterdir() if p.name.startswith(".")]
    for sid in kept:
        verdict = snapshot_file.check(restarted.compact_path(sid))
        assert verdict.ok, [c.detail for c in verdict.failed()]


def test_a_first_snapshot_pays_the_same_few_syncs_at_any_block_count(tmp_path, monkeypatch):
    calls = {"fsync": 0, "sync_files": 0}
    real_fsync, real_sync_files = os.fsync, blockdir.sync_files

    def counting_fsync(fd):
        calls["fsync"] += 1
        real_fsync(fd)

    def counting_sync_files(directory, paths):
        calls["sync_files"] += 1
        return real_sync_files(directory, paths)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    monkeypatch.setattr(blockdir, "sync_files", counting_sync_files)
    seen = []
    for sid, count in (("s1", 8), ("s2", 256)):
        calls.update(fsync=0, sync_files=0)
        new_store(tmp_path).save_compact(snapshot(sid, int(sid[1]), count))
        seen.append(dict(calls))
    assert seen[0] == seen[1], f"the syncs grew with the blocks: {seen}"
    assert seen[0]["sync_files"] == 1 and seen[0]["fsync"] <= 3  # blocks dir; the manifest and its dir


def test_every_block_a_manifest_names_is_synced_and_named_durably_before_the_manifest(tmp_path, monkeypatch):
    events: list[tuple[str, object]] = []
    real_sync_files, real_replace, real_fsync_dir = blockdir.sync_files, os.replace, blockdir.fsync_dir
    real_write_atomically = store_module.write_atomically

    def sync_files(directory, paths):
        events.append(("sync", {Path(p) for p in paths}))
        return real_sync_files(directory, paths)

    def replace(src, dst):
        events.append(("rename", (Path(src), Path(dst))))
        real_replace(src, dst)

    def fsync_dir(path):
        events.append(("fsync_dir", Path(path)))
        real_fsync_dir(path)

    def write_atomically(path, data):
        events.append(("manifest", Path(path)))
        return real_write_atomically(path, data)

    monkeypatch.setattr(blockdir, "sync_files", sync_files)
    monkeypatch.setattr(blockdir.os, "replace", replace)
    monkeypatch.setattr(blockdir, "fsync_dir", fsync_dir)
    monkeypatch.setattr(store_module, "write_atomically", write_atomically)
    store = new_store(tmp_path)
    store.save_compact(snapshot("s1", 1, 16))
    store.save_compact(snapshot("s2", 2, 16))
    synced: set[Path] = set()
    renamed: dict[Path, Path] = {}  # a block's name -> its temporary file, renamed and not yet fsynced in its dir
    durable: set[Path] = set()
    manifests = 0
    for kind, what in events:
        if kind == "sync":
            synced |= what
        elif kind == "rename" and what[1].parent == store.blocks.directory:
            assert what[0] in synced, f"{what[1].name} named before its content was synced"
            renamed[what[1]] = what[0]
        elif kind == "fsync_dir" and what == store.blocks.directory:
            durable |= set(renamed)
            renamed.clear()
        elif kind == "manifest" and what.parent == store.compact_directory:
            manifests += 1
            stored = snapshot_file.read_stored(what)[0] if what.exists() else None
            names = {store.blocks.path(n) for n in blocks.hashes(stored)} if stored else set()
            assert names <= durable, f"{what.name} names {len(names - durable)} blocks not yet durable"
    assert manifests == 2 and len(durable) == 64


@pytest.mark.parametrize("step", ["write", "sync", "rename", "manifest"])
def test_a_crash_at_any_step_of_a_filing_then_a_power_loss_leaves_every_stored_snapshot_whole(tmp_path, monkeypatch,
                                                                                                   step):
    store = new_store(tmp_path)
    store.save_compact(snapshot("s1", 1, 16))
    synced = set(store.blocks.directory.iterdir())  # the first filing's blocks are on disk
    real_write, real_replace = blockdir.os.write, blockdir.os.replace
    writes = 0

    def crash_at(name):
        if name == step:
            raise Crash(step)

    def write(fd, data):
        nonlocal writes
        writes += 1
        if writes == 5:
            crash_at("write")
        return real_write(fd, data)

    def replace(src, dst):
        crash_at("rename")
        real_replace(src, dst)

    def sync_files(directory, paths):
        crash_at("sync")
        return len(paths)  # a sync that is not reached in a crash syncs nothing; below, the paths are lost

    def write_atomically(path, data):
        crash_at("manifest")
        raise AssertionError("the crash comes first")

    monkeypatch.setattr(blockdir.os, "write", write)
    monkeypatch.setattr(blockdir.os, "replace", replace)
    monkeypatch.setattr(blockdir, "sync_files", sync_files)
    monkeypatch.setattr(store_module, "write_atomically", write_atomically)
    # s2 shares p1's state with s1, so a crash must not touch the blocks s1 holds
    crashed = snapshot("s2", 2, 16)
    set_state(crashed.nodes[0], snapshot("s1", 1, 16).nodes[0].state)
    with pytest.raises(Crash):
        store.save_compact(crashed)
    monkeypatch.undo()
    power_loss(tmp_path, synced)
    restart_and_check(tmp_path, ["s1"])


KILLED_WRITER = """
import hashlib, random, sys
from snapmesh.checking import snapshot_file
from pathlib import Path
from snapmesh.services.controller.store import SnapshotStore
from snapmesh.v1 import snapmesh_pb2 as pb
root = Path(sys.argv[1])
store = SnapshotStore(root / "snapshots", root / "controller" / "snapshots")
for i in range(1000):
    s = pb.Snapshot(snapshot_id=f"s{i:04d}", status=pb.Snapshot.COMPLETE, initiator="p1")
    state = random.Random(i).randbytes(64 * 8192)
    s.nodes.add(node_id="p1", state=state, app_name="blob", app_version=1,
                state_digest=snapshot_file.PREFIX + hashlib.sha256(state).hexdigest())
    s.app.status = pb.AppCheck.UNCHECKED
    store.save_compact(s)
"""


def test_a_filing_process_killed_mid_write_leaves_only_whole_snapshots(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=REPO,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        manifests = tmp_path / "controller" / "snapshots"
        wait_for(lambda: manifests.is_dir() and len(list(manifests.glob("*.pb"))) >= 3, timeout=60,
                 what="three snapshots filed")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    kept = sorted(p.stem for p in manifests.glob("*.pb"))
    restart_and_check(tmp_path, kept)
    restarted = new_store(tmp_path)
    restarted.load_all()
    named = {n for sid in kept for n in blocks.hashes(snapshot_file.read_stored(restarted.compact_path(sid))[0])}
    assert restarted.blocks.names() == named, "after the sweep, only the blocks a manifest names"


def test_without_syncfs_or_when_it_fails_each_file_is_fsynced(tmp_path, monkeypatch):
    paths = [tmp_path / f"f{i}" for i in range(3)]
    for path in paths:
        path.write_bytes(b"x")
    fsynced = []
    real_fsync = os.fsync

    def counting_fsync(fd):
        fsynced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    assert durable.sync_files(tmp_path, []) == 0
    if durable._SYNCFS is not None:
        assert durable.sync_files(tmp_path, paths) == 1 and fsynced == []
    monkeypatch.setattr(durable, "_SYNCFS", lambda fd: -1)  # refused (e.g. by a sandbox)
    assert durable.sync_files(tmp_path, paths) == 3 and len(fsynced) == 3
    monkeypatch.setattr(durable, "_SYNCFS", None)  # not there
    assert durable.sync_files(tmp_path, paths) == 3 and len(fsynced) == 6
    with pytest.raises(FileNotFoundError):
        durable.sync_files(tmp_path, [tmp_path / "gone"])
