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
