"""An app's optional snapshot_blocks() (snapmesh/app A8): the host takes the state
from it (the parts joined, their sizes kept for the report, blocks.py B6), and
kvshard's parts are its keys in ranges, so that a put changes one block."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from snapmesh.app import App, Context
from snapmesh.protocol import blocks
from snapmesh.protocol.node.apphost import Host
from snapmesh.protocol.node.core import AppFailed, FullState
from snapmesh.protocol.reports import report_message
from snapmesh.services.app import kvshard


class Parted:
    def __init__(self, info) -> None:
        self.parts = [b"head", b"", bytearray(b"body")]

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        return b""

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        pass

    def snapshot(self) -> bytes:
        return b"".join(self.parts)

    def snapshot_blocks(self):
        return iter(self.parts)

    def restore(self, state: bytes) -> None:
        pass


def host(app: App) -> Host:
    return Host(app, node_id="p1", incoming=("p2",), outgoing=("p2",))


def test_the_host_takes_the_state_from_the_parts_and_the_report_says_how_it_was_cut():
    state = host(App(name="parted", new=Parted)).snapshot()
    assert state == b"headbody" and state.parts == (4, 4)  # an empty part is no block
    message = report_message(FullState(node_id="p1", snapshot_id="s", channels={}, state=state, app="parted"))
    assert message.state == b"headbody" and list(message.state_parts) == [4, 4]
    plain = report_message(FullState(node_id="p1", snapshot_id="s", channels={}, state=b"x", app="a"))
    assert list(plain.state_parts) == []


def test_a_part_that_is_not_bytes_fails_the_app_naming_it():
    class Wrong(Parted):
        def snapshot_blocks(self):
            return [b"ok", "text"]

    with pytest.raises(AppFailed, match=r"snapshot_blocks\(\) gave a str, not bytes"):
        host(App(name="wrong", new=Wrong)).snapshot()


@pytest.mark.parametrize("falsy", [None, 0, ""])
def test_a_falsy_part_that_is_not_bytes_fails_the_app_too(falsy):
    """The empty parts are dropped before the types are read (apphost `_taken`, one pass each):
    a part dropped that was not bytes is still named."""
    class Wrong(Parted):
        def snapshot_blocks(self):
            return [b"ok", falsy, b""]

    with pytest.raises(AppFailed, match=rf"snapshot_blocks\(\) gave a {type(falsy).__name__}, not bytes"):
        host(App(name="wrong", new=Wrong)).snapshot()


def test_a_large_cut_holds_the_apps_bytes_parts_as_they_are_and_copies_the_others():
    """H8 and blockstate.BST4: the cut's BlockState is over the parts' tuple itself; a part
    that is not `bytes` itself (a bytearray, a bytes subclass) is copied to bytes first."""
    class Sub(bytes):
        pass

    big = [bytes([i]) * 8192 for i in range(16)]

    class Large(Parted):
        def __init__(self, info) -> None:
            self.parts = list(big)

        def snapshot_blocks(self):
            return self.parts

    machine = host(App(name="large", new=Large))
    state, parts = machine.cut()
    assert state.blocks is parts and all(a is b for a, b in zip(parts, big, strict=True))
    machine.machine.parts[3] = bytearray(big[3])
    machine.machine.parts[5] = Sub(big[5])
    machine.machine.parts.insert(7, b"")
    state, parts = machine.cut()
    assert len(parts) == 16 and state.blocks is parts and all(type(part) is bytes for part in parts)
    assert parts[3] == big[3] and parts[3] is not machine.machine.parts[3] and parts[4] is big[4]
    assert bytes(state) == b"".join(big)


def kv(keys: int, seed: int = 0):
    from snapmesh.app import NodeInfo

    node = kvshard.KVShard(NodeInfo(node_id="p1", peers_out=("p2",), peers_in=("p2",)))
    rng = random.Random(seed)
    for i in range(keys):
        node.keys[f"p1/key-{i:06d}"] = {"value": rng.randbytes(40).hex(), "created_at": "p1"}
    node.created = set(node.keys) | {"p1/gone"}
    node.deleted = {"p1/gone"}
    node.moved = {"p1/away": "p2"}
    return node


@pytest.mark.parametrize("keys", [0, 1, 3, 5000])
def test_kvshards_parts_join_to_its_snapshot(keys):
    node = kv(keys)
    assert b"".join(node.snapshot_blocks()) == node.snapshot()
    json.loads(node.snapshot())


def test_a_put_to_one_kvshard_key_changes_one_block_where_the_plain_grid_moves_every_later_one():
    node = kv(20000)
    before = named(node)
    put(node, "p1/key-012345", "changed, and longer than it was")
    after, hashed = blocks.names(*cut(node), last=before)
    assert hashed == 1 and len(set(after.names) - set(before.names)) == 1
    grid_before, _ = blocks.names(node.snapshot())
    put(node, "p1/key-000100", "longer " * 10)
    _, hashed_grid = blocks.names(node.snapshot(), last=grid_before)  # with snapshot() alone
    assert hashed_grid > 100
    state, parts = cut(node)
    _, hashed = blocks.names(state, parts, last=after)
    touched = next(i for i, n in enumerate(itertools.accumulate(parts)) if n > state.index(b'"p1/key-000100":'))
    assert hashed == -(-parts[touched] // blocks.BLOCK_BYTES) <= 2  # that range's blocks: one or two


def put(node, key: str, value: str) -> None:
    """Through the command, as a node changes its state: kvshard keeps its parts' encodings
    between snapshots (kvranges), so a change made to its dicts from outside is not seen."""
    node.on_command(kvshard.encode({"op": "put", "key": key, "value": value}), Context("p1", ("p2",)))


def cut(node) -> tuple[bytes, tuple[int, ...]]:
    state = blocks.PartedState.of(node.snapshot_blocks())
    return state, state.parts


def named(node) -> blocks.Named:
    state, parts = cut(node)
    return blocks.names(state, parts=parts)[0]


def test_a_subclass_that_changes_snapshot_is_snapshotted_by_it_not_by_its_bases_parts():
    # A new version of an app (another encoding in snapshot()) that keeps its base's
    # snapshot_blocks must not be stored in the base's encoding (A8).
    class Versioned(Parted):
        def snapshot(self) -> bytes:
            return b"v2:" + super().snapshot()

    class Wrapper:  # the parts of an inner machine, reached through __getattr__, are not the wrapper's
        def __init__(self, info) -> None:
            self.inner = Parted(info)

        def snapshot(self) -> bytes:
            return b"w:" + self.inner.snapshot()

        def __getattr__(self, name):
            return getattr(self.inner, name)

    assert host(App(name="versioned", new=Versioned)).snapshot() == b"v2:headbody"
    assert host(App(name="wrapped", new=Wrapper)).snapshot() == b"w:headbody"

    class Both(Versioned):  # parts defined again, below the new snapshot(): they are used
        def snapshot_blocks(self):
            return [b"v2:", *self.parts]

    state = host(App(name="both", new=Both)).snapshot()
    assert state == b"v2:headbody" and state.parts == (3, 4, 4)
