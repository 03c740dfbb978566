"""A batch's commands through `Node.submit_many` are exactly `Node.submit` of each, in order.

Two nodes start alike; one takes each item by `submit` (a refusal caught as the
engine did), the other the whole list by `submit_many`. They must give the same
answers and refusals, hand out the same effects (records, seals) and end in the
same state, over generated batches that mix request ids (new and retried),
commands with no, one and several sends, refusals by the app, an app that raises,
replies over max_reply_bytes, a full channel and segment seals.
"""

from __future__ import annotations

import random

import pytest

from snapmesh.app import App, Context, NodeInfo
from snapmesh.protocol.node import core
from snapmesh.protocol.node.effects import Submitted
from snapmesh.protocol.node.machine import Node
from snapmesh.protocol.node.recovery import fresh

PEERS = ("b", "c")


class Scripted:
    """A command says what to do: b"s:b,c" sends to b then c, b"r" refuses, b"x" raises,
    b"L" answers 64 bytes, anything else answers itself; the state is every command taken."""

    def __init__(self, info: NodeInfo) -> None:
        self.taken: list[bytes] = []

    def on_command(self, command: bytes, ctx: Context) -> bytes:
        if command == b"r":
            ctx.refuse("FAILED_PRECONDITION", "refused by the app")
        if command == b"x":
            raise RuntimeError("the app raised")
        self.taken.append(command)
        if command.startswith(b"s:"):
            for dst in command[2:].split(b","):
                ctx.send(dst.decode(), command)
            return b"sent"
        return b"L" * 64 if command == b"L" else command

    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        self.taken.append(payload)

    def snapshot(self) -> bytes:
        return b"|".join(self.taken)

    def restore(self, state: bytes) -> None:
        self.taken = state.split(b"|") if state else []


APP = App(name="scripted", new=Scripted)
COMMANDS = (b"s:b", b"s:c", b"s:b,c", b"s:b,b", b"", b"plain", b"r", b"x", b"L")


def _node() -> Node:
    node = Node(node_id="a", incoming=PEERS, outgoing=PEERS, app=APP, recovered=fresh(incoming=PEERS, outgoing=PEERS),
                bound=6, segment_records=7, max_reply_bytes=32, wall=1000.0)
    for peer in PEERS:
        node.opened(peer, 1)
        node.connect(peer, 1)
    node.durable(node.last_lsn)
    node.drain()
    return node


def _outcome(result: object) -> object:
    if isinstance(result, core.LocalProtocolError):
        return type(result).__name__, str(result), result.kind
    return result


def _state(node: Node) -> object:
    return (node.last_lsn, node.last_command, node.host.snapshot(), node.messages_sent,
            {d: (s.next_seq, list(s.outbox)) for d, s in node.senders.items()},
            node._requests.as_dict(node.wall))


@pytest.mark.parametrize("seed", range(60))
def test_submit_many_is_submit_of_each_item_in_order(seed: int) -> None:
    _compare(seed)


def _compare(seed: int) -> set[object]:
    """Four batches of `seed`'s items through both nodes; the kinds of answer they got."""
    rng = random.Random(seed)
    one, many = _node(), _node()
    used: list[str] = []
    seen: set[object] = set()
    for _ in range(4):
        items = []
        ids: set[str] = set()
        for _ in range(rng.randint(1, 12)):
            request_id = ""
            if rng.random() < 0.4:
                request_id = rng.choice(used) if used and rng.random() < 0.5 else f"id-{len(used)}"
                if request_id in ids:
                    request_id = ""
                else:
                    ids.add(request_id)
                    used.append(request_id)
            items.append((request_id, rng.choice(COMMANDS), 0))
        wall = 1000.0 + rng.random()
        expected = []
        for request_id, command, first in items:
            try:
                expected.append(one.submit(command, request_id, wall=wall, first_sent_unix_ms=first) if request_id
                                else one.submit(command))
            except core.LocalProtocolError as exc:
                expected.append(exc)
        got = many.submit_many(items, wall)
        assert [_outcome(r) for r in got] == [_outcome(r) for r in expected]
        seen.update(r.kind if isinstance(r, core.LocalProtocolError) else len(r.sent_to) for r in got)
        assert many.drain() == one.drain()
        assert _state(many) == _state(one)
        if rng.random() < 0.5:  # the peers take what was sent: room on the channels again
            for peer in PEERS:
                for node in (one, many):
                    node.durable(node.last_lsn)
                    node.acked(peer, 1, node.senders[peer].next_seq - 1)
            assert many.drain() == one.drain()
    return seen


def test_the_batches_reach_every_kind_of_answer() -> None:
    """The generated batches are worth comparing: they hold each refusal, and steps with 0, 1 and 2 channels."""
    seen: set[object] = set()
    for seed in range(60):
        seen |= _compare(seed)
    assert {0, 1, 2, core.Refusal.APP_REFUSED, core.Refusal.APP_FAILED, core.Refusal.REPLY_TOO_LARGE,
            core.Refusal.CHANNEL_FULL} <= seen


def test_a_channel_at_its_bound_refuses_the_next_command_and_takes_it_back() -> None:
    """The common step's room check (one send): `bound` unacknowledged messages pass, the next is
    refused as channel full with the app as it was, and an ack makes room again."""
    node = _node()  # bound 6 on each channel
    answers = node.submit_many([("", b"s:b", 0)] * 7, 1000.0)
    assert [type(a).__name__ for a in answers] == ["Submitted"] * 6 + ["ChannelFull"]
    assert answers[6].kind == core.Refusal.CHANNEL_FULL and "holds 6 unacknowledged messages (bound 6)" in str(answers[6])
    assert node.host.snapshot() == b"|".join([b"s:b"] * 6) and node.senders["b"].next_seq == 7
    node.durable(node.last_lsn)
    node.acked("b", 1, 1)
    assert type(node.submit_many([("", b"s:b", 0)], 1000.0)[0]) is Submitted
