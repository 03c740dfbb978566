"""A node machine over an in-memory log hosting an app that changes its state first and
fails after (`Careless`): the undo tests and the query tests drive it (`Driver`)."""

from __future__ import annotations

import json

from snapmesh.app import App
from snapmesh.protocol import wal
from snapmesh.protocol.node import recovery
from snapmesh.protocol.node.effects import Append, Seal, Transmit
from snapmesh.protocol.node.machine import Node

ME, PEERS = "p1", ("p2", "p3")


class Careless:
    """A counter that mutates before it checks: `add`, `get`, `send:DST`, `big:N`,
    and the failures `add-then-raise`, `add-then-refuse`, `add-then-str`."""

    def __init__(self, info):
        self.n, self.heard = 0, []

    def on_command(self, command, ctx):
        verb, _, arg = command.decode().partition(":")
        if verb == "get":
            return str(self.n).encode()
        self.n += 1  # first, whatever follows
        if verb == "add":
            return str(self.n).encode()
        if verb == "send":
            ctx.send(arg, b"n=%d" % self.n)
            return str(self.n).encode()
        if verb == "big":
            return b"x" * int(arg)
        if verb == "add-then-raise":
            raise RuntimeError("half done")
        if verb == "add-then-refuse":
            ctx.refuse("FAILED_PRECONDITION", "changed my mind")
        if verb == "add-then-str":
            return "not bytes"
        ctx.refuse("INVALID_ARGUMENT", f"unknown {verb}")

    def on_message(self, src, payload, ctx):
        self.heard.append(f"{src}:{payload.decode()}")

    def snapshot(self):
        return json.dumps({"n": self.n, "heard": self.heard}).encode()

    def restore(self, state):
        saved = json.loads(state)
        self.n, self.heard = saved["n"], saved["heard"]


APP = App(name="careless", new=Careless)


class Driver:
    """p1 alone, its log in memory and durable at once; p2 acknowledges every frame, p3 is paused (never acks)."""

    def __init__(self, app: App = APP, **settings) -> None:
        self.log: list[wal.Record] = []
        self.app, self.settings = app, settings
        self.node = self._start(recovery.fresh(incoming=PEERS, outgoing=PEERS))

    def _start(self, recovered: recovery.Recovered) -> Node:
        node = Node(node_id=ME, incoming=PEERS, outgoing=PEERS, recovered=recovered, app=self.app, **self.settings)
        self.node = node
        self.route()
        for dst in PEERS:
            node.connect(dst, 1)
        self.route()
        return node

    def route(self) -> None:
        node = self.node
        while effects := node.drain():
            for effect in effects:
                if isinstance(effect, Append):
                    self.log.append(effect.record)
                    node.durable(effect.record.lsn)
                elif isinstance(effect, Seal):
                    self.log.append(effect.checkpoint)
                    node.durable(effect.checkpoint.lsn)
                elif isinstance(effect, Transmit) and effect.dst == "p2":
                    node.acked("p2", effect.conn_no, effect.entries[-1].seq)

    def command(self, command: bytes) -> bytes:
        try:
            return self.node.submit(command).reply
        finally:
            self.route()

    def state(self) -> dict:
        return json.loads(self.node.app_state())

    def restart(self) -> Node:
        """Recovery from the log, as after a kill -9: it must not find another history."""
        active = max(k for k, r in enumerate(self.log) if isinstance(r, wal.Init | wal.Checkpoint))  # its segment
        records = [(f"p1.log.jsonl:{n}", r) for n, r in enumerate(self.log[active:], 1)]
        recovered = recovery.recover(
            records, node_id=ME, incoming=PEERS, outgoing=PEERS, app=self.app
        )
        return self._start(recovered)

    def hear(self, src: str, seq: int, payload: bytes) -> None:
        self.node.opened(src, 1)
        self.node.received(src, 1, seq, payload=payload)
        self.node.end_frame()
        self.route()
