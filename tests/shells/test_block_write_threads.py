"""Two threads writing the same blocks at once each write to a temporary file of their own
(services/controller/blockdir.py D1): neither renames the other's half-written file under the
block's name, nor finds its own taken from under it; `sweep` still removes what a crash leaves."""

from __future__ import annotations

import random
import threading

from snapmesh.protocol import blocks
from snapmesh.services.controller.blockdir import BlockDir

B = blocks.BLOCK_BYTES


def at_once(files: BlockDir, named: dict[bytes, bytes], durable: tuple[bool, bool]) -> list[BaseException]:
    """`files.write(named)` from two threads started together; what each raised."""
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def write(durable: bool) -> None:
        start.wait()
        try:
            files.write(named, durable=durable)
        except BaseException as error:  # noqa: BLE001 (the test reports it)
            errors.append(error)

    threads = [threading.Thread(target=write, args=(each,)) for each in durable]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_two_threads_writing_the_same_blocks_at_once_leave_each_block_whole(tmp_path):
    contents = [random.Random(i).randbytes(B) for i in range(64)]
    named = {blocks.block_hash(block): block for block in contents}
    for round_ in range(20):  # the race is a matter of timing: enough rounds that it shows
        files = BlockDir(tmp_path / f"blocks{round_}")
        errors = at_once(files, named, (False, round_ % 2 == 1))  # unsynced (D8) beside unsynced or durable
        assert errors == [], f"round {round_}: a write failed: {errors[0]!r}"
        damaged = [name.hex() for name, block in named.items() if files.path(name).read_bytes() != block]
        assert damaged == [], f"round {round_}: {len(damaged)} block file(s) not whole, e.g. {damaged[0]}"
        assert sorted(p.name for p in files.directory.iterdir()) == sorted(name.hex() for name in named)


def test_the_sweep_removes_every_temporary_file_a_crash_left(tmp_path):
    files = BlockDir(tmp_path / "blocks")
    block = random.Random(1).randbytes(B)
    name = blocks.block_hash(block)
    files.write({name: block})
    for left in (f".{name.hex()}.tmp", f".{'ab' * 32}.7.tmp", f".{'cd' * 32}.1a2b-3.tmp"):
        (files.directory / left).write_bytes(b"half")
    assert BlockDir(files.directory).sweep({name}) == 0
    assert [p.name for p in files.directory.iterdir()] == [name.hex()]
