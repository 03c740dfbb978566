"""A payload run applied in one call (`Node.received_payloads`) is exactly its messages applied one by one.

Two receivers start alike; one is handed each app message by `received(...,
payload=...)`, the other each run by `received_payloads`. After every frame
they hold the same app state and hand out the same effects (records, acks,
finished parts): with nothing recording, while a snapshot records the channel,
for duplicates and a stale connection (dropped), and at a gap (refused, what
came before it applied).
"""

from __future__ import annotations

import pytest

from snapmesh.app import App, Context, NodeInfo
from snapmesh.protocol.node import link
from snapmesh.protocol.node.effects import Append
from snapmesh.protocol.node.machine import Node
from snapmesh.protocol.node.recovery import fresh


class Keep:
    """Keeps every payload it receives, in order; a command is sent on as it is."""

    def __init__(self, info: NodeInfo) -> None:
        self.peer = info.peers_out[0]
        self.got: list[bytes] = []

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        ctx.send(self.peer, command)
        return b""

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        self.got.append(payload)

    def snapshot(self) -> bytes:
        return b"|".join(self.got)

    def restore(self, state: bytes) -> None:
        self.got = state.split(b"|") if state else []


APP = App(name="keep", new=Keep)


def _node(me: str, peer: str) -> Node:
    return Node(node_id=me, incoming=(peer,), outgoing=(peer,), app=APP,
                recovered=fresh(incoming=(peer,), outgoing=(peer,)))


def _pair() -> tuple[Node, Node]:
    one, other = _node("b", "a"), _node("b", "a")
    for node in (one, other):
        node.opened("a", 1)
        node.durable(node.last_lsn)
        node.drain()
    return one, other


def _one_by_one(node: Node, conn_no: int, first: int, payloads: list[bytes]) -> None:
    try:
        for seq, payload in enumerate(payloads, first):
            node.received("a", conn_no, seq, payload=payload)
    finally:
        node.end_frame()


def _as_run(node: Node, conn_no: int, first: int, payloads: list[bytes]) -> None:
    try:
        node.received_payloads("a", conn_no, first, payloads)
    finally:
        node.end_frame()


def _same(one: Node, other: Node) -> list:
    for node in (one, other):
        node.durable(node.last_lsn)
    effects = one.drain()
    assert effects == other.drain()
    assert one.host.snapshot() == other.host.snapshot()  # type: ignore[union-attr]
    return effects


def test_a_run_is_its_messages_one_by_one_recording_or_not_duplicates_and_stale_frames_dropped() -> None:
    one, other = _pair()
    frames = [
        (1, 1, [b"x", b"", b"\x00\xff"]),
        (1, 2, [b"dup", b"dup", b"new"]),  # seqs 2 and 3 again: duplicates, then 4
        (7, 5, [b"stale"]),  # a connection that is not the current one
        (1, 5, [b"y" * 300, b"z"]),
    ]
    for conn_no, first, payloads in frames:
        _one_by_one(one, conn_no, first, payloads)
        _as_run(other, conn_no, first, payloads)
        effects = _same(one, other)
        if conn_no == 7:
            assert not [e for e in effects if type(e) is Append]
    assert one.host.machine.got == [b"x", b"", b"\x00\xff", b"new", b"y" * 300, b"z"]  # type: ignore[union-attr]
    for node in (one, other):
        node.start_snapshot("s1")
    _same(one, other)
    for node, apply in ((one, _one_by_one), (other, _as_run)):
        apply(node, 1, 7, [b"in", b"flight"])  # recorded as the channel's state in s1
        node.received("a", 1, 9, snapshot_id="s1")
        node.end_frame()
    finished = [e for e in _same(one, other) if type(e).__name__ == "Finished"]
    assert [t.payload for t in finished[0].state.channels["a"]] == [b"in", b"flight"]


def test_at_a_gap_both_refuse_and_keep_what_came_before_it() -> None:
    one, other = _pair()
    for node, apply in ((one, _one_by_one), (other, _as_run)):
        apply(node, 1, 1, [b"a", b"b", b"c"])
        with pytest.raises(link.GapError, match="channel a->b: got seq 5 after 3"):
            apply(node, 1, 5, [b"d", b"e"])
    assert len([e for e in _same(one, other) if type(e) is Append]) == 3
    assert other.host.machine.got == [b"a", b"b", b"c"]  # type: ignore[union-attr]
