"""A data dir as app nodes write it, without a cluster: production node machines over in-memory links.

`record(app, nodes, commands, ...)` runs one `snapmesh.protocol.node.machine.Node`
per node (full mesh), feeds them the app's commands and delivers every frame in
a seeded order; `write(directory)` then leaves each node's log segments in a
directory as the node writes them (`<node>.log.<first lsn>.jsonl` sealed, then
`<node>.log.jsonl`), so the offline tools (`snapmesh replay`) read it as a real one.
Each node's finished snapshot parts are kept too (`finished`), as its engine would report them.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

from snapmesh.app import App
from snapmesh.protocol import wal
from snapmesh.protocol.node import core, recovery
from snapmesh.protocol.node.effects import Ack, Append, Finished, Seal, Transmit
from snapmesh.protocol.node.machine import Node


class AppLogs:
    def __init__(self, app: App, nodes: Iterable[str], *, seed: int = 1, segment_records: int = 10**6) -> None:
        self.ids = tuple(nodes)
        self.rng = random.Random(seed)
        self.segments: dict[str, list[list[wal.Record]]] = {n: [[]] for n in self.ids}
        self.wires: dict[tuple[str, str], list] = {(s, d): [] for s in self.ids for d in self.ids if s != d}
        self.finished: dict[tuple[str, str], Finished] = {}  # (snapshot id, node): its part, as reported
        self.nodes: dict[str, Node] = {}
        for me in self.ids:
            peers = tuple(n for n in self.ids if n != me)
            self.nodes[me] = Node(node_id=me, incoming=peers, outgoing=peers, app=app, segment_records=segment_records,
                                  recovered=recovery.fresh(incoming=peers, outgoing=peers))
            for dst in peers:
                self.nodes[me].connect(dst, 1)
        for me in self.ids:
            self.route(me)

    def route(self, me: str) -> None:
        node = self.nodes[me]
        while effects := node.drain():
            for effect in effects:
                if isinstance(effect, Append):
                    self.segments[me][-1].append(effect.record)
                    node.durable(effect.record.lsn)
                elif isinstance(effect, Seal):
                    self.segments[me].append([effect.checkpoint])
                    node.durable(effect.checkpoint.lsn)
                elif isinstance(effect, Transmit):
                    self.wires[(me, effect.dst)].append(effect.entries)
                elif isinstance(effect, Finished):
                    self.finished[(effect.state.snapshot_id, me)] = effect
                elif isinstance(effect, Ack):
                    self.nodes[effect.src].acked(me, effect.conn_no, effect.seq)
                    self.route(effect.src)

    def command(self, me: str, command: bytes) -> None:
        try:
            self.nodes[me].submit(command)
        except core.AppRefusal:
            return
        self.route(me)

    def snapshot(self, sid: str) -> None:
        node = self.nodes[self.rng.choice(self.ids)]
        node.start_snapshot(sid)
        self.route(node.node_id)

    def deliver(self) -> bool:
        busy = [k for k, frames in self.wires.items() if frames]
        if not busy:
            return False
        src, dst = self.rng.choice(busy)
        node = self.nodes[dst]
        node.opened(src, 1)
        for e in self.wires[(src, dst)].pop(0):
            node.received(src, 1, e.seq, last_seq=e.last_seq, snapshot_id=e.snapshot_id, payload=e.payload)
        node.end_frame()
        self.route(dst)
        return True

    def records(self, me: str) -> list[wal.Record]:
        """Every record `me` has written, its segments in order."""
        return [r for segment in self.segments[me] for r in segment]

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        for me, segments in self.segments.items():
            for k, segment in enumerate(segments):
                last = k == len(segments) - 1
                name = wal.active_name(me) if last else wal.sealed_name(me, segment[0].lsn)
                (directory / name).write_text("".join(wal.encode(r, me) for r in segment))
        return directory


def record(app: App, nodes: Iterable[str], commands: Iterable[tuple[str, bytes]], *, steps: int, seed: int = 1,
           segment_records: int = 10**6, snapshots: int = 0) -> AppLogs:
    """`steps` steps of a seeded schedule: commands (30%), a snapshot now and then, deliveries; then drained."""
    logs = AppLogs(app, nodes, seed=seed, segment_records=segment_records)
    commands = iter(commands)
    for step in range(steps):
        roll = logs.rng.random()
        if roll < 0.3:
            logs.command(*next(commands))
        elif roll < 0.3 + snapshots / steps:
            logs.snapshot(f"s{step}")
        else:
            logs.deliver()
    while logs.deliver():
        pass
    return logs
