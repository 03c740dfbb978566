"""Hybrid snapshot mode (`snapshot_mode = "hybrid"`): classic first, overtaking after a timeout, pure.

Flink's `execution.checkpointing.aligned-checkpoint-timeout`: a checkpoint starts
aligned (barriers in their FIFO place) and a channel whose barrier has not got
through within the timeout switches to unaligned (the barrier overtakes the
buffered data, which goes into the checkpoint). Classic mode keeps a snapshot's
channel state small, but under backpressure a marker waits behind a full queue;
overtake mode bounds the wait but always carries positions and outboxes. Hybrid
takes classic's order while it is quick and overtaking once it is not.

Rules
-----
H1. A hybrid node is an overtake node (node N9, overtake.py O1-O5) whose early
    marker copies are held back `align_timeout` seconds after the cut (link L9).
    Its reports are overtake reports (positions and outboxes): the controller
    assembles every channel by O3 whichever copy closed it, so the tracker runs
    in "overtake" (`wire_mode`).
H2. Per channel and per snapshot: if the FIFO marker is acknowledged before the
    timeout the early copy is dropped, never sent, and the channel closed in
    classic order; otherwise the early copy overtakes, exactly as in overtake
    mode. O3's proof does not depend on when (or whether) the early copy
    leaves, so every mix of the two in one snapshot is consistent.
H3. Time is an argument: a held copy's timeout starts at the first `tick(now)`
    after its cut, and `next_timer` asks for that tick at once, so the shell's one
    re-armed timer drives it; the simulator ticks it like every node timer.
H4. A report carries no outbox entry the receiver already holds. A transfer
    the receiver acknowledged before the channel's early copy left was applied
    before either copy of the marker reached it (the early one had not left,
    the FIFO one comes after it), so while the channel was open: it is at or
    below the receiver's position P, or in its recording. O3 takes it from
    there, and the outbox copy would be a duplicate. So at its part's finish a
    node leaves out of each outbox the entries acknowledged by the time that
    channel's copy was released to overtake, or by now while it is still held
    (or was dropped). Where the cluster keeps up, a hybrid report is then
    about a classic one (positions aside); every report keeps its positions.
"""

from __future__ import annotations

import bisect
import dataclasses
from types import MappingProxyType
from typing import Any

from snapmesh.protocol.node.core import LocalProtocolError
from snapmesh.protocol.node.machine import Node

MODES = ("classic", "overtake", "hybrid")  # every snapshot_mode a node runs
DEFAULT_ALIGN_TIMEOUT_S = 0.05  # Flink has no default (off); ours is a few log rounds on loopback


def wire_mode(mode: str) -> str:
    """The snapshot_mode of a node's reports and of the controller's tracker (H1)."""
    return "overtake" if mode == "hybrid" else mode


def check_align_timeout(align_timeout: float) -> float:
    """`align_timeout` in seconds, refused when it is not a number >= 0."""
    if isinstance(align_timeout, bool) or not isinstance(align_timeout, (int, float)) or not align_timeout >= 0:
        raise LocalProtocolError(f"align timeout must be a number of seconds >= 0, got {align_timeout!r}")
    return float(align_timeout)


class HybridNode(Node):
    """A node in hybrid mode (H1-H4); every other argument as `Node`'s."""

    def __init__(self, *, align_timeout: float = DEFAULT_ALIGN_TIMEOUT_S, **kwargs: Any) -> None:
        self.align_timeout = check_align_timeout(align_timeout)  # before Node builds the links (_links reads it)
        mode = kwargs.pop("snapshot_mode", "hybrid")
        if mode != "hybrid":
            raise LocalProtocolError(f"a HybridNode runs snapshot_mode 'hybrid', not {mode!r}")
        self.early_sent = self.early_dropped = 0  # held copies that overtook / that their FIFO copy made needless
        self._released: dict[tuple[str, str], int] = {}  # (snapshot id, dst) -> dst's ack when its copy overtook (H4)
        super().__init__(snapshot_mode="overtake", **kwargs)
        self.snapshot_mode = "hybrid"

    def _links(self, incoming, outgoing, recovered) -> None:  # noqa: ANN001 - as Node's
        super()._links(incoming, outgoing, recovered)  # again at a restore (N8): the new links hold too
        for sender in self.senders.values():
            sender.hold = self.align_timeout

    def tick(self, now: float, wall: float | None = None) -> None:
        super().tick(now, wall)
        for sender in self.senders.values():
            overtaking, dropped = sender.release(now)
            self.early_sent += overtaking
            self.early_dropped += dropped
            if overtaking:
                for entry in sender.notices[-overtaking:]:  # release appends the copies it lets overtake
                    if entry.snapshot_id in self._at_cut:  # its part not finished yet (H4)
                        self._released[(entry.snapshot_id, sender.dst)] = sender.acked
                self._transmit(sender)

    def _with_cut(self, state):  # noqa: ANN001, ANN202 - as Node's
        """Node's, with each outbox past what its receiver acknowledged before the early copy left (H4)."""
        state = super()._with_cut(state)
        sid = state.snapshot_id
        outbox = {}
        for dst, entries in state.outbox.items():
            acked = self._released.pop((sid, dst), self.senders[dst].acked)
            outbox[dst] = entries[bisect.bisect_right([e.seq for e in entries], acked):]
        if self._released:  # those of parts aborted meanwhile
            self._released = {key: a for key, a in self._released.items() if key[0] in self._at_cut}
        return dataclasses.replace(state, outbox=MappingProxyType(outbox))

    def next_timer(self) -> float | None:
        due = [t for t in (super().next_timer(), *(s.next_release(self.now) for s in self.senders.values()))
               if t is not None]
        return min(due, default=None)

    @property
    def held_markers(self) -> int:
        """Early marker copies held back now (a gauge for the shell)."""
        return sum(len(s.held) for s in self.senders.values())
