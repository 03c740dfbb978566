"""A payload run taken as one (`Node.received_payloads` while nothing records and the run is
the channel's next seqs: its admit and passed checked once, applied at its end) is its
messages one by one: the same app state, records and acks, with an app that sends on some
messages and raises on one, and acks made at every durable point inside a run.
"""

from __future__ import annotations

import pytest

from snapmesh.app import App, Context, NodeInfo
from snapmesh.protocol import wal
from snapmesh.protocol.node import core, link
from snapmesh.protocol.node.effects import Ack, Append
from snapmesh.protocol.node.machine import Node
from snapmesh.protocol.node.recovery import fresh


class Echo:
    """Keeps every payload; b"s..." is sent back to its sender; b"boom" raises."""

    def __init__(self, info: NodeInfo) -> None:
        self.got: list[bytes] = []

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        return b""

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        if payload == b"boom":
            raise ValueError("boom")
        self.got.append(payload)
        if payload.startswith(b"s"):
            ctx.send(src, payload)

    def snapshot(self) -> bytes:
        return b"|".join(self.got)

    def restore(self, state: bytes) -> None:
        self.got = state.split(b"|") if state else []


def _node() -> Node:
    node = Node(node_id="b", incoming=("a",), outgoing=("a",), app=App(name="echo", new=Echo),
                recovered=fresh(incoming=("a",), outgoing=("a",)))
    node.opened("a", 1)
    node.connect("a", 1)
    node.durable(node.last_lsn)
    node.drain()
    return node


def _one_by_one(node: Node, first: int, payloads: list[bytes]) -> None:
    try:
        for seq, payload in enumerate(payloads, first):
            node.received("a", 1, seq, payload=payload)
    finally:
        node.end_frame()


def _as_run(node: Node, first: int, payloads: list[bytes]) -> None:
    try:
        node.received_payloads("a", 1, first, payloads)
    finally:
        node.end_frame()


def _durable_step_by_step(one: Node, other: Node) -> list:
    """Both made durable one lsn at a time from where they were: the acks at every point agree."""
    assert one.last_lsn == other.last_lsn
    seen = []
    logged = {e.record.seq: e.record.lsn for e in one._out if type(e) is Append and type(e.record) is wal.Recv}
    for lsn in range(min(one.durable_lsn, other.durable_lsn) + 1, one.last_lsn + 1):
        one.durable(lsn)
        other.durable(lsn)
        effects = one.drain()
        assert effects == other.drain(), lsn
        # An ack names only messages whose records are durable (link L2), and the newest of them.
        assert all(logged[e.seq] <= lsn < logged.get(e.seq + 1, lsn + 1) for e in effects if type(e) is Ack), lsn
        seen += effects
    assert one.host.snapshot() == other.host.snapshot()  # type: ignore[union-attr]
    assert one.receivers["a"].last_seq == other.receivers["a"].last_seq
    return seen


def test_a_quiet_run_is_its_messages_one_by_one_acks_at_every_durable_point() -> None:
    one, other = _node(), _node()
    frames = [(1, [b"x", b"s1", b"y"]), (4, [b"s2", b"s3"]), (6, [b"z"] * 5), (11, [b"s4", b"w"])]
    acks = []
    for first, payloads in frames:
        _one_by_one(one, first, payloads)
        _as_run(other, first, payloads)
        acks += [e.seq for e in _durable_step_by_step(one, other) if type(e) is Ack]
    assert other.host.machine.got[-2:] == [b"s4", b"w"]  # type: ignore[union-attr]
    assert acks == sorted(set(acks)) and acks[-1] == 12 and len(acks) > len(frames)  # acks inside runs too


def test_an_app_that_raises_mid_run_keeps_what_came_before_it() -> None:
    one, other = _node(), _node()
    for node, apply in ((one, _one_by_one), (other, _as_run)):
        apply(node, 1, [b"a"])
        with pytest.raises(core.AppFailed, match="boom"):
            apply(node, 2, [b"s1", b"b", b"boom", b"c"])
    assert one.receivers["a"].last_seq == other.receivers["a"].last_seq == 3
    assert len([e for e in one._out if type(e) is Append]) == len([e for e in other._out if type(e) is Append]) == 4
    assert _durable_step_by_step(one, other)
    assert other.host.machine.got == [b"a", b"s1", b"b"]  # type: ignore[union-attr]
    with pytest.raises(link.GapError):  # the run after it starts where the applied ones end
        _as_run(other, 6, [b"d"])


def test_a_run_that_is_not_the_next_seqs_takes_the_checked_path() -> None:
    one, other = _node(), _node()
    for node, apply in ((one, _one_by_one), (other, _as_run)):
        apply(node, 1, [b"a", b"b"])
        apply(node, 2, [b"b", b"c"])  # a duplicate, then the next
    _durable_step_by_step(one, other)
    assert one.receivers["a"].duplicates == other.receivers["a"].duplicates == 1
