"""A micro-driver of the pure per-transfer path, for instruction counts per transfer.

Two `snapmesh.protocol.node.machine.Node` machines, a -> b and b -> a, driven as the node's shell
drives them but with no I/O: client batches of BATCH transfers at a, every
Append encoded to its log line (`wal.Encoder`, as the transfer log does), the
log made durable once per batch, each Transmit delivered to b as one frame,
b's acks back to a, and the Prometheus counters updated as the engine does.
Deterministic (no clock, no randomness), so its instruction count under
`valgrind --tool=callgrind` is a per-event cost free of machine noise:

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p .venv/bin/python -m bench.microdriver 2000
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p .venv/bin/python -m bench.microdriver 22000

(instructions per transfer = the difference of the two totals / 20000; the
start-up cancels out). Without valgrind it prints µs per transfer.

`--frames messages` or `--frames runs` carries every Transmit as the wire
does: the channel's real encoder (`encode_frame`, one message per transfer or
packed runs), serialized and parsed, then the servicer's and the engine's real
decoding (`_receive`, `Engine.receive_batch` / `receive_runs`) on b. `--ab N`
alternates the two forms for N rounds in one process and prints the median
µs per transfer of each and their ratio (the machine's load cancels out).
"""

from __future__ import annotations

import statistics
import sys
import time

from prometheus_client import CollectorRegistry, Counter

from snapmesh.services.node.channels import encode_frame
from snapmesh.services.node.engine import Engine
from snapmesh.services.node.servicer import _receive
from snapmesh.protocol.node import machine
from snapmesh.protocol.node.fence import Fence
from snapmesh.protocol.node.recovery import fresh
from snapmesh.protocol.wal import Encoder
from snapmesh.v1 import snapmesh_pb2 as pb

BATCH = 200


class _Side:
    def __init__(self, me: str, peer: str) -> None:
        self.node = machine.Node(
            node_id=me, incoming=(peer,), outgoing=(peer,),
            recovered=fresh(initial_tally=10**12, incoming=(peer,), outgoing=(peer,)),
        )
        self.encoder = Encoder(me)
        self.lines: list[str] = []
        self.bytes = 0
        registry = CollectorRegistry()
        self.sent = Counter("sent_total", "", registry=registry)
        self.received = Counter("received_total", "", registry=registry)
        self._counted = 0


class _Shell:
    """The engine's frame methods on a bare Node: the driver drains the effects itself."""

    receive_batch = Engine.receive_batch
    receive_runs = Engine.receive_runs

    def __init__(self, node: machine.Node) -> None:
        self.node = node
        self.fence = Fence(node.node_id)  # never stopped: the frame methods ask it (fence.py F4)

    def _now(self) -> float:
        return 0.0

    def _run(self) -> None:
        pass


def _effects(side: _Side, peer: _Side, frames: list, acks: list) -> None:
    for effect in side.node.drain():
        kind = type(effect)
        if kind is machine.Append:
            side.lines.append(side.encoder.record(effect.record))
        elif kind is machine.Transmit:
            frames.append(effect)
        elif kind is machine.Ack:
            acks.append(effect)


def _commit(side: _Side) -> None:
    """The log's round: the buffered lines joined and 'written'; then durable."""
    data = "".join(side.lines).encode()
    side.bytes += len(data)
    side.lines.clear()
    side.node.durable(side.node.last_lsn)


def run(transfers: int, frames_as: str = "") -> int:
    """`frames_as`: "" hands b the entries; "messages" or "runs" goes through the wire form."""
    a, b = _Side("a", "b"), _Side("b", "a")
    shell = _Shell(b.node)
    frames: list = []
    acks: list = []
    a.node.connect("b", 1)
    b.node.opened("a", 1)
    for side in (a, b):
        _commit(side)
        side.node.drain()
    done = 0
    while done < transfers:
        n = min(BATCH, transfers - done)
        transfer = a.node.transfer
        for _ in range(n):
            transfer("b", 1)
        a.sent.inc(n)  # once per batch, as the engine's transfers_done
        _effects(a, b, frames, acks)
        _commit(a)
        _effects(a, b, frames, acks)
        while frames or acks:
            for frame in frames:
                if frames_as:
                    wire = encode_frame(frame.entries, runs=frames_as == "runs").SerializeToString()
                    _receive(shell, "a", "b", frame.conn_no, pb.ChannelFrame.FromString(wire).batch)  # type: ignore[arg-type]
                    continue
                received = b.node.received
                for entry in frame.entries:
                    received("a", frame.conn_no, entry.seq, tally=entry.tally)
                b.node.end_frame()
            frames.clear()
            b.received.inc(b.node.transfers_received - b._counted)
            b._counted = b.node.transfers_received
            _effects(b, a, frames, acks)
            _commit(b)
            _effects(b, a, frames, acks)
            for ack in acks:
                a.node.acked("b", ack.conn_no, ack.seq)
            acks.clear()
            _effects(a, b, frames, acks)
        done += n
    assert b.node.transfers_received == transfers, (b.node.transfers_received, transfers)
    return a.bytes + b.bytes


def _ab(rounds: int, transfers: int) -> None:
    took: dict[str, list[float]] = {"messages": [], "runs": []}
    for _ in range(rounds):
        for form, times in took.items():
            started = time.perf_counter()
            run(transfers, form)
            times.append((time.perf_counter() - started) * 1e6 / transfers)
    old, new = (statistics.median(took[f]) for f in ("messages", "runs"))
    print(f"{rounds} rounds of {transfers} transfers each, median µs per transfer (sender + receiver + frames):")
    print(f"  messages {old:.2f}  runs {new:.2f}  runs/messages {new / old:.3f}  saved {old - new:.2f} µs")


def main(argv: list[str]) -> int:
    args = list(argv)
    frames_as = ab = ""
    if "--frames" in args:
        at = args.index("--frames")
        frames_as = args[at + 1]
        del args[at : at + 2]
        if frames_as not in ("messages", "runs"):
            print("--frames: messages or runs", file=sys.stderr)
            return 2
    if "--ab" in args:
        at = args.index("--ab")
        ab = args[at + 1]
        del args[at : at + 2]
    transfers = int(args[0]) if args else 20_000
    if ab:
        _ab(int(ab), transfers)
        return 0
    started = time.perf_counter()
    nbytes = run(transfers, frames_as)
    elapsed = time.perf_counter() - started
    print(f"{transfers} transfers, {nbytes} log bytes, {elapsed * 1e6 / max(transfers, 1):.2f} µs per transfer")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
