"""A node's simulated data dir: durable segments, a buffer, and crashes that tear the last write.

The node machine asks for records to be appended (`node.Append`) and segments
to be sealed (`node.Seal`); they wait in `pending` until the simulator makes a
prefix of them durable. A crash loses what is still pending, except that part
of the write in progress may reach the disk, its last line torn. A restart
reads the active segment back through `wal`, a torn tail cut off, as the real
node does.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from snapmesh.protocol.node import machine as node_mod
from snapmesh.protocol import wal


@dataclass(slots=True)
class Disk:
    """One node's data dir: durable segments (lines) and what is buffered."""

    node_id: str
    segments: list[list[str]] = field(default_factory=lambda: [[]])
    torn: str = ""  # a partial last line of the active segment
    pending: deque = field(default_factory=deque)  # wal.Record or node.Seal, in order
    durable_lsn: int = 0
    encoder: wal.Encoder | None = None

    def flush(self, count: int) -> None:
        """Make the first `count` buffered items durable (a Seal takes its checkpoint with it)."""
        if self.encoder is None:
            self.encoder = wal.Encoder(self.node_id)
        encode = self.encoder.record
        while count > 0 and self.pending:
            item = self.pending.popleft()
            if isinstance(item, node_mod.Seal):
                self.segments.append([])
                item = self.pending.popleft()  # its checkpoint (queued after it, counted as one write), atomically
            self.segments[-1].append(encode(item))
            self.durable_lsn = item.lsn
            count -= 1

    def crash(self, rng: random.Random) -> bool:
        """The process dies: part of what was being written may reach the disk, the
        last record torn mid-line (True when it was); the rest of the buffer is lost."""
        self.flush(rng.randint(0, len(self.pending)))
        torn = False
        if self.pending and rng.random() < 0.5:
            item = self.pending[0]
            if isinstance(item, wal.Record):
                line = wal.encode(item, self.node_id)
                self.torn = line[: rng.randint(1, len(line) - 1)]
                torn = True
        self.pending.clear()
        return torn

    def read_active(self) -> list[tuple[str, wal.Record]]:
        """What a restart reads: the active segment, a torn tail cut off."""
        path = f"{self.node_id}.log.jsonl"
        data = ("".join(self.segments[-1]) + self.torn).encode()
        lines, torn_at = wal.split_lines(data, path)
        if torn_at is not None:
            self.torn = ""
        return [(where, wal.parse(raw, where, node_id=self.node_id)) for where, raw in lines]
