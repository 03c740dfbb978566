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

Its frames go to b as entries: the channel's wire carries an app's messages only
(services/node/channels.py), so the native runs this driver once also sent
through the encoder (`--frames`) are gone with them.
"""

from __future__ import annotations

import sys
import time

from prometheus_client import CollectorRegistry, Counter

from snapmesh.app import load_app
from snapmesh.protocol.node import machine
from snapmesh.protocol.node.recovery import fresh
from snapmesh.protocol.wal import Encoder

BATCH = 200
BANK = load_app("bank")


class _Side:
    def __init__(self, me: str, peer: str) -> None:
        self.node = machine.Node(
            node_id=me, incoming=(peer,), outgoing=(peer,),
            recovered=fresh(incoming=(peer,), outgoing=(peer,)),
            app=BANK, app_params={"initial_balance": 10**12},  # every node hosts an app (node rule N10)
        )
        self.encoder = Encoder(me)
        self.lines: list[str] = []
        self.bytes = 0
        registry = CollectorRegistry()
        self.sent = Counter("sent_total", "", registry=registry)
        self.received = Counter("received_total", "", registry=registry)
        self._counted = 0


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


def run(transfers: int) -> int:
    """The log bytes of `transfers` transfers a -> b, b handed each frame's entries."""
    a, b = _Side("a", "b"), _Side("b", "a")
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
        submit = a.node.submit
        for _ in range(n):
            submit(b"1 b")  # the bank app's compact command: pay 1 to b
        a.sent.inc(n)  # once per batch, as the engine's transfers_done
        _effects(a, b, frames, acks)
        _commit(a)
        _effects(a, b, frames, acks)
        while frames or acks:
            for frame in frames:
                received = b.node.received
                for entry in frame.entries:
                    received("a", frame.conn_no, entry.seq, payload=entry.payload)
                b.node.end_frame()
            frames.clear()
            b.received.inc(b.node.messages_received - b._counted)
            b._counted = b.node.messages_received
            _effects(b, a, frames, acks)
            _commit(b)
            _effects(b, a, frames, acks)
            for ack in acks:
                a.node.acked("b", ack.conn_no, ack.seq)
            acks.clear()
            _effects(a, b, frames, acks)
        done += n
    assert b.node.messages_received == transfers, (b.node.messages_received, transfers)
    return a.bytes + b.bytes


def main(argv: list[str]) -> int:
    transfers = int(argv[0]) if argv else 20_000
    started = time.perf_counter()
    nbytes = run(transfers)
    elapsed = time.perf_counter() - started
    print(f"{transfers} transfers, {nbytes} log bytes, {elapsed * 1e6 / max(transfers, 1):.2f} µs per transfer")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
