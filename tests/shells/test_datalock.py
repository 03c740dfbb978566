"""A server's start holds its data-dir lock (snapmesh.serving.datalock.serve_holding):
it serves only while it holds the lock, and a dir another holder has, or one that
cannot be made, is one line on stderr and exit status 2 with nothing served.
The whole servers on real processes are in test_data_safety.py and test_node_failure_modes.py."""

from __future__ import annotations

import asyncio

from snapmesh.serving.datalock import CONTROLLER, DataDirLock, DataDirLocked, serve_holding


def start(data_dir, name, served: list[str]) -> int:
    async def serve() -> int:
        served.append(name)
        # While it serves, the lock is held: a second taker is refused.
        try:
            DataDirLock.acquire(data_dir, name).release()
        except DataDirLocked as exc:
            served.append(type(exc).__name__)
        return 0

    return asyncio.run(serve_holding(data_dir, name, "snapmesh test", serve))


def test_it_serves_holding_the_lock_and_releases_it_after(tmp_path):
    served: list[str] = []
    assert start(tmp_path / "data", "p1", served) == 0
    assert served == ["p1", "DataDirLocked"]
    DataDirLock.acquire(tmp_path / "data", "p1").release()  # released once serving ended


def test_a_held_lock_is_exit_2_naming_the_dir_and_nothing_is_served(tmp_path, capsys):
    held = DataDirLock.acquire(tmp_path, CONTROLLER)
    try:
        served: list[str] = []
        assert start(tmp_path, CONTROLLER, served) == 2
    finally:
        held.release()
    assert served == []
    err = capsys.readouterr().err
    assert err.startswith("snapmesh test: data dir ") and str(tmp_path) in err and err.count("\n") == 1


def test_a_data_dir_that_cannot_be_made_is_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("not a dir")
    served: list[str] = []
    assert start(tmp_path / "file" / "data", "p1", served) == 2
    assert served == []
    assert capsys.readouterr().err.startswith("snapmesh test: cannot lock data dir ")
