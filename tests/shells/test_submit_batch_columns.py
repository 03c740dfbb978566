"""SubmitBatch's edge over a scripted engine: its fast paths answer as the per-item rules say.

The edge (edge.py `answers`) takes a step whose every command ran, and a batch
whose every item ran and none was taken back, as columns; the servicer sets a
result's fields one by one. Each batch here mixes what sends an item off those
paths (a refusal, a retry's replayed answer, a restore's take-back, a command
over the size limit, items in several engine steps) and the response must be,
byte for byte, the one the rules give item by item (E2-E4): the reference below
is written from them, not from the code.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

import grpc
import pytest

from snapmesh.protocol.node import core
from snapmesh.protocol.node.effects import ReplyBatch, Submitted
from snapmesh.services.node import edge as edge_module
from snapmesh.services.node.edge import MAX_COMMAND_BYTES, Edge
from snapmesh.services.node.servicer import NodeServicer
from snapmesh.v1 import snapmesh_pb2 as pb


class _Counter:
    def inc(self) -> None:
        pass


class _Metrics:
    def command_refused(self, code: str) -> _Counter:
        return _Counter()


class ScriptedEngine:
    """An engine whose node answers each command as its bytes say: b"refuse", b"replayed" or a reply."""

    node_id = "p1"
    metrics = _Metrics()

    class log:  # noqa: N801
        writer_pending = staticmethod(contextlib.nullcontext)

    def __init__(self, taken_back: set[bytes]) -> None:
        self.taken_back = taken_back
        self.steps: list[int] = []

    def refusal(self, rpc: str) -> str:
        return ""

    def submit_batch(self, items):
        self.steps.append(len(items))
        return [self._answer(command) for _, command, _ in items]

    @staticmethod
    def _answer(command: bytes) -> Submitted | core.LocalProtocolError:
        if command.startswith(b"refuse"):
            return core.AppRefusal(f"no to {command!r}", core.Refusal.APP_REFUSED, "FAILED_PRECONDITION")
        if command.startswith(b"replayed"):
            return Submitted(b"first " + command, 7, True, 3, (), 2, 0)
        return Submitted(b"re " + command, 7, False, 3, ("p2",), 0, 1)

    def reply_batch(self, done):
        waiting = asyncio.get_running_loop().create_future()
        marks = tuple("snap-9" if a.reply.removeprefix(b"re ") in self.taken_back else "" for a in done)
        waiting.set_result(ReplyBatch(waiting, marks))
        return waiting

    async def wait_for_room(self, destinations, timeout) -> None:
        pass

    async def replied(self, waiting):
        return waiting.result()


def _expected(commands: list[bytes], taken_back: set[bytes]) -> bytes:
    """The response the rules give, item by item."""
    response = pb.SubmitBatchResponse()
    for command in commands:
        if len(command) > MAX_COMMAND_BYTES:
            code, text = "INVALID_ARGUMENT", f"a command holds at most {MAX_COMMAND_BYTES} bytes, got {len(command)}"
        elif command.startswith(b"refuse"):
            code, text = "FAILED_PRECONDITION", f"no to {command!r}"
        elif command.startswith(b"replayed"):
            response.results.add(reply=b"first " + command, replayed=True, epoch=2)
            continue
        elif command in taken_back:
            code, text = "ABORTED", edge_module.taken_back_text("p1", "snap-9", "not done")
        else:
            response.results.add(reply=b"re " + command, epoch=3)
            continue
        response.results.add(code=grpc.StatusCode[code].value[0], message=text)
    return response.SerializeToString()


def _batches() -> list[tuple[str, list[bytes], set[bytes]]]:
    rng = random.Random(5)
    plain = [b"c%d" % i for i in range(250)]
    cases = [
        ("all ran", plain[:40], set()),
        ("all ran, three steps", plain, set()),
        ("a refusal in the last step only", [*plain[:230], b"refuse-1", *plain[230:]], set()),
        ("a replayed retry", [b"c1", b"replayed-1", b"c2"], set()),
        ("one taken back", plain[:10], {b"c4"}),
        ("a command too long", [b"c1", b"x" * (MAX_COMMAND_BYTES + 1), b"c2"], set()),
    ]
    for n in range(12):  # random mixes
        commands = []
        for i in range(rng.choice((1, 5, 99, 100, 101, 230))):
            kind = rng.random()
            commands.append(b"refuse-%d" % i if kind < 0.05 else b"replayed-%d" % i if kind < 0.1 else b"c%d" % i)
        back = {c for c in commands if c.startswith(b"c") and rng.random() < (0.05 if n % 2 else 0)}
        cases.append((f"mix {n}", commands, back))
    return cases


@pytest.mark.parametrize(("name", "commands", "taken_back"), _batches(), ids=[c[0] for c in _batches()])
def test_a_batch_answers_as_its_items_rules_say(name: str, commands: list[bytes], taken_back: set[bytes]) -> None:
    engine = ScriptedEngine(taken_back)
    servicer = NodeServicer.__new__(NodeServicer)
    servicer._edge = Edge(engine)  # type: ignore[arg-type]
    request = pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=c) for c in commands])
    response = asyncio.run(servicer.SubmitBatch(request, None))  # type: ignore[arg-type]
    assert response.SerializeToString() == _expected(commands, taken_back)
    runnable = sum(len(c) <= MAX_COMMAND_BYTES for c in commands)
    assert sum(engine.steps) == runnable and all(n <= edge_module.COMMANDS_PER_STEP for n in engine.steps)


def test_submit_many_of_pairs_answers_as_of_triples() -> None:
    """An embedding program's (request_id, command) pairs take _checked's other path: the same answers."""
    commands = [b"c1", b"refuse-2", b"replayed-3", b"c4"]

    async def both() -> tuple[list, list]:
        pairs = await Edge(ScriptedEngine(set())).submit_many([("", c) for c in commands])  # type: ignore[arg-type]
        triples = await Edge(ScriptedEngine(set())).submit_many([("", c, 0) for c in commands])  # type: ignore[arg-type]
        return pairs, triples

    pairs, triples = (list(map(repr, answers)) for answers in asyncio.run(both()))  # a Refused has no __eq__
    assert pairs == triples and [a.split("(")[0] for a in pairs] == ["Reply", "Refused", "Reply", "Reply"]
