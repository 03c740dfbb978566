"""blockdir.py D9 and dirwatch.py W1-W2: the blocks directory is listed for a snapshot only
when its watch cannot say what was removed; a file removed behind the controller's back is
still noticed by the next snapshot, and one written again since is not taken as gone."""

from __future__ import annotations

import os

from snapmesh.protocol.blocks import block_hash
from snapmesh.services.controller import dirwatch
from snapmesh.services.controller.blockdir import BlockDir


def blocks(count: int, seed: int = 0) -> dict[bytes, bytes]:
    contents = [os.urandom(64) + bytes([seed, i]) for i in range(count)]
    return {block_hash(c): c for c in contents}


def counted(files: BlockDir) -> list[int]:
    listings = [0]
    original = files.names

    def names():
        listings[0] += 1
        return original()

    files.names = names  # type: ignore[method-assign]
    return listings


def test_a_snapshot_after_the_first_lists_nothing_when_the_watch_says_what_went(tmp_path):
    files = BlockDir(tmp_path / "blocks")
    written = blocks(20)
    files.write(written)
    listings = counted(files)
    files.listed_for("s1")  # the first: listed, the watch started
    files.write(blocks(5, seed=1))
    files.delete(list(written)[:3])  # the controller's own deletion
    for sid in ("s2", "s3", "s4"):
        files.listed_for(sid)
    assert listings[0] == 1, "one listing, then the watch's removals"
    assert files.lacking(written) == set(list(written)[:3])


def test_a_block_file_removed_behind_the_controller_s_back_is_noticed_by_the_next_snapshot(tmp_path):
    files = BlockDir(tmp_path / "blocks")
    written = blocks(10)
    files.write(written)
    files.listed_for("s1")
    lost, kept_again = list(written)[:2]
    files.path(lost).unlink()  # behind its back
    files.path(kept_again).unlink()
    files.write({kept_again: written[kept_again]}, durable=True)  # gone and written again since: still here
    listings = counted(files)
    files.listed_for("s2")
    assert listings[0] == 0
    assert files.lacking(written) == {lost} and not files.holds(lost) and files.holds(kept_again)


def test_an_overflowed_or_lost_watch_makes_the_snapshot_list_the_directory(tmp_path, monkeypatch):
    files = BlockDir(tmp_path / "blocks")
    written = blocks(6)
    files.write(written)
    files.listed_for("s1")
    listings = counted(files)
    monkeypatch.setattr(files._watch, "removed", lambda: None)  # an overflow, no inotify: W1 says so
    lost = next(iter(written))
    files.path(lost).unlink()
    files.listed_for("s2")
    assert listings[0] == 1 and not files.holds(lost)


def test_the_watch_reports_removals_and_a_directory_that_went(tmp_path):
    directory = tmp_path / "d"
    directory.mkdir()
    watch = dirwatch.DirWatch(directory)
    assert watch.removed() is None, "nothing watched before the first reset"
    watch.reset()
    if not watch.watching:  # no inotify here (another kernel): the caller lists every time
        assert watch.removed() is None
        return
    for name in ("a", "b", "c"):
        (directory / name).write_bytes(b"x")
    (directory / "a").unlink()
    os.replace(directory / "b", tmp_path / "moved")
    assert watch.removed() == ["a", "b"]
    assert watch.removed() == []
    for entry in directory.iterdir():
        entry.unlink()
    directory.rmdir()
    assert watch.removed() is None, "the directory went: list it"
    directory.mkdir()
    watch.reset()  # watched afresh
    (directory / "d").write_bytes(b"x")
    (directory / "d").unlink()
    assert watch.removed() == ["d"]
    watch.close()
    assert not watch.watching and watch.removed() is None
