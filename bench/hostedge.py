"""The generic command's Python around the app, in process: µs per command, this tree against another.

    python -m bench.hostedge                     # this tree's figures
    python -m bench.hostedge --against /work/main   # and another tree's, alternating, with the ratios

Three parts, each best of --rounds repetitions (the machine is shared and noisy):
  - host: the bank app's common command through `apphost.Host.command` (with an
    admit, as the node's) plus the message it sends through `Host.message` at the
    receiver: the app host's two steps per command, the bank's own code included;
    `app` is the same two calls on the machine with one Context, the app's share;
  - edge: `NodeServicer.SubmitBatch` of a 1,000-command request over an engine that
    answers at once (every command `Submitted`, nothing taken back, no log): the item
    list, the edge's checks and columns, the results;
  - client: what the exactly-once load generator pays per command beside gRPC: its
    request made (snapmesh/load/generator.py `_request`, with request ids), the response
    parsed, its refusals counted (the bench's generator sends pre-made requests instead).
With --against, the other tree's files of these parts (apphost.py, undo.py, bank.py, edge.py,
servicer.py, generator.py) are loaded beside this tree's and each round measures both in
turn, so both see the same load; only APIs both trees have are used. No cluster, no disk.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import time
from pathlib import Path
from types import ModuleType

BATCH = 1000


def _best(fn, rounds: int, n: int) -> float:
    """µs per item of `fn(n)`, best of `rounds`."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn(n)
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def _host_parts(apphost, bank):
    from snapmesh.app import Context

    def host() -> apphost.Host:
        return apphost.Host(bank.app, node_id="p1", incoming=("p2",), outgoing=("p2",),
                            params={"initial_balance": 10**15})

    def admit(reply: bytes, sends: list) -> None:  # the node's checks, at their cheapest
        if len(reply) > 1 << 20 or len(sends) != 1:
            raise AssertionError(reply)

    def steps(n: int) -> None:
        h = host()
        command, message = h.command, h.message
        for _ in range(n):
            command(b"1 p2", admit)
            message("p2", b"1")

    def app(n: int) -> None:
        machine = host().machine
        on_command, on_message, peers = machine.on_command, machine.on_message, frozenset(("p2",))
        ctx = Context("p1", peers)
        for _ in range(n):
            ctx.sends = []
            on_command(b"1 p2", ctx)
            on_message("p2", b"1", ctx)

    return steps, app


def _edge_part(edge, servicer_module):
    from snapmesh.protocol.node.effects import ReplyBatch, Submitted
    from snapmesh.v1 import snapmesh_pb2 as pb

    class Engine:
        """What the edge asks of an engine, answering at once."""

        node_id = "p1"

        class log:  # noqa: N801  (the engine's `log`: a batch's steps after the first tell it a writer is pending)
            writer_pending = staticmethod(contextlib.nullcontext)

        def refusal(self, rpc: str) -> str:
            return ""

        def __init__(self) -> None:
            self.answers: dict[int, list[Submitted]] = {}  # made once: the node's cost is not the edge's

        def submit_batch(self, items):
            answers = self.answers.get(len(items))
            if answers is None:
                answers = self.answers[len(items)] = [Submitted(b"%d" % i, i, False, 1, ("p2",), 0, i)
                                                      for i in range(len(items))]
            return list(answers)

        def reply_batch(self, done):
            waiting = asyncio.get_running_loop().create_future()
            waiting.set_result(ReplyBatch(waiting, ("",) * len(done)))
            return waiting

        async def wait_for_room(self, destinations, timeout) -> None:
            pass

        async def replied(self, waiting):
            return waiting.result()

    servicer = servicer_module.NodeServicer.__new__(servicer_module.NodeServicer)
    servicer._edge = edge.Edge(Engine())
    data = pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=b"1 p2") for _ in range(BATCH)]).SerializeToString()

    def edge(n: int) -> None:
        async def calls() -> None:
            for _ in range(n // BATCH):
                request = pb.SubmitBatchRequest.FromString(data)  # the server's parse is gRPC's, before the handler
                response = await servicer.SubmitBatch(request, None)  # type: ignore[arg-type]
                if len(response.results) != BATCH:
                    raise AssertionError(response)
        asyncio.run(calls())

    return edge


def _client_part(generator):
    from snapmesh.v1 import snapmesh_pb2 as pb

    items = [(f"gen-1-s-{i}", b"1 p2") for i in range(BATCH)]
    answer = pb.SubmitBatchResponse(results=[pb.SubmitResult(reply=b"%d" % i, epoch=1) for i in range(BATCH)])
    wire = answer.SerializeToString()

    def client(n: int) -> None:
        for _ in range(n // BATCH):
            generator._request(items)
            response = pb.SubmitBatchResponse.FromString(wire)
            sum(1 for r in response.results if r.code)

    return client


def _parts(modules: dict[str, ModuleType]) -> dict[str, object]:
    steps, app = _host_parts(modules["apphost"], modules["bank"])
    return {"host": steps, "app": app, "edge": _edge_part(modules["edge"], modules["servicer"]),
            "client": _client_part(modules["generator"])}


def _this() -> dict[str, ModuleType]:
    from snapmesh.load import generator
    from snapmesh.protocol.node import apphost
    from snapmesh.services.app import bank
    from snapmesh.services.node import edge, servicer

    return {"apphost": apphost, "bank": bank, "edge": edge, "servicer": servicer, "generator": generator}


def _other(tree: Path) -> dict[str, ModuleType]:
    """`tree`'s modules of the parts, loaded from its files beside this tree's (their imports
    of anything else are this tree's: the parts' own code is what is compared)."""
    def load(path: str, name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"_other_{name}", tree / path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module

    apphost = load("snapmesh/protocol/node/apphost.py", "apphost")
    apphost.UndoLog = load("snapmesh/protocol/node/undo.py", "undo").UndoLog  # its undo log, not this tree's
    return {"apphost": apphost, "bank": load("services/app/bank.py", "bank"), "edge": load("services/node/edge.py", "edge"),
            "servicer": load("services/node/servicer.py", "servicer"),
            "generator": load("snapmesh/load/generator.py", "generator")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="repetitions, the best kept (default 15)")
    parser.add_argument("--commands", type=int, default=20_000, help="commands per repetition (default 20000)")
    parser.add_argument("--against", metavar="TREE", help="another checkout, measured in turn (default: none)")
    args = parser.parse_args()
    sides = {"this": _parts(_this())}
    if args.against:
        sides["other"] = _parts(_other(Path(args.against)))
    best: dict[str, dict[str, float]] = {side: {} for side in sides}
    for _ in range(args.rounds):  # in turn: both sides see the same load
        for side, parts in sides.items():
            for part, fn in parts.items():
                best[side][part] = min(best[side].get(part, float("inf")), _best(fn, 1, args.commands))
    if not args.against:
        print("\n".join(f"{part:<7} {value:7.3f} µs/command" for part, value in best["this"].items()))
        return 0
    print(f"{'part':<7} {'this':>8} {'other':>8} {'this/other':>10}   (µs per command, best of {args.rounds})")
    for part in best["this"]:
        this, other = best["this"][part], best["other"][part]
        print(f"{part:<7} {this:8.3f} {other:8.3f} {this / other:10.2f}")
    own = {side: best[side]["host"] - best[side]["app"] for side in sides}
    print(f"the host's own (host - app): {own['this']:.3f} against {own['other']:.3f}, {own['this'] / own['other']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
