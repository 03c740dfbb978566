"""What a node takes its controller to hold of its state's blocks, so that a report sends only the others.

The reporter (reporter.py) asks `form` what to send for a report: the report
itself until the controller has said it takes blocks
(ReportStateResponse.takes_blocks) and a report of this node's was accepted;
then the state as blocks, sending the contents of only those not in that
accepted report (snapmesh/protocol/blocks.py B4). A controller that lacks a
block it was sent a reference to refuses the report (blocks.MISSING); the
reporter then sends it whole (`refused`), and the next one is whole too.
The hashes of the last state formed are kept with that state (a reference to
the bytes the report holds, or to the app's own blocks the cut kept, blocks.py B8:
not a copy), so the next state's blocks that did not change are compared rather
than hashed again (blocks.py B5), or, named at the cut, taken as they are.
A report's carried blocks can be handed back apart from its message (`form`
`carried`), as the state's own blocks: in the message, each is a copy.
Once the controller answered a report takes_changes, that report's manifest is
the base, and the next report's manifest goes as its change from it
(snapmesh/protocol/manifestdelta.py MD1, MD3); a refusal naming the base
(MISSING_BASE) drops it, and the report goes again with its full manifest.
"""

from __future__ import annotations

from collections.abc import Callable

from snapmesh.protocol import blocks, manifestdelta
from snapmesh.v1 import snapmesh_pb2 as pb


class SentBlocks:
    def __init__(self, carry_over: int | None = None) -> None:
        # A state over this many bytes goes as blocks even when none is held, each carried:
        # the controller writes them as its stream brings them (carriedblocks.py), where a
        # state sent whole is held whole, and refused past chunking.MAX_STATE_BYTES. The
        # reporter's is chunking.WRITE_WINDOW_BYTES: a smaller state whole is held no longer
        # than a window of carried blocks, and is hashed once, not written and read back.
        self.carry_over = carry_over
        self._takes_blocks = False  # the controller said so in an answer
        self._held: set[bytes] = set()  # the blocks of the last report it accepted
        self._last: blocks.Named | None = None  # the last state formed, cut, and its blocks' hashes
        self.hashed = 0  # blocks hashed in all (the others' hashes were reused)
        self.on_formed: Callable[[blocks.Named], None] | None = None  # heldblocks.py: a copy kept on disk
        self._base: tuple[str, list[bytes]] | None = None  # the last report answered takes_changes (MD3)
        self._formed: dict[str, list[bytes]] = {}  # snapshot -> the manifest formed for it, the last few

    @property
    def last(self) -> blocks.Named | None:
        """The last state formed, cut, and its blocks' hashes (a restore as blocks reads it too)."""
        return self._last

    def form(
        self, report: pb.FullState, named: blocks.Named | None = None, carried: list[bytes] | None = None,
    ) -> tuple[pb.FullState, set[bytes]]:
        """What to send for `report` (it, or it as blocks), and its state's blocks (for
        `accepted`). `named`: its state cut and named already (a pending report's save).
        `carried`: the blocks to carry go there, not into the message (blocks.referenced_report)."""
        if named is not None:  # not read again (a read is a copy), not compared again
            self._last = named
            if self.on_formed is not None:  # heldblocks.py: kept on disk whichever way it was cut
                self.on_formed(named)
            return self._sent(report, named, carried)
        known = None
        state = report.state if report.HasField("state") else b""  # read once: each read is a copy
        if state:
            known, hashed = blocks.names(state, report.state_parts, self._last)
            self._last = known  # one assignment: a form in another thread sees a whole one
            self.hashed += hashed
            if self.on_formed is not None:
                self.on_formed(known)
        return self._sent(report, known, carried)

    def _sent(
        self, report: pb.FullState, known: blocks.Named | None, carried: list[bytes] | None,
    ) -> tuple[pb.FullState, set[bytes]]:
        sent, names = blocks.referenced_report(report, self._held if self._takes_blocks else set(), known,
                                               carry_all=self.carries(known), carried=carried)
        if known is not None:
            self._formed = {**dict(list(self._formed.items())[-3:]), report.snapshot_id: known.names}
        if sent is not None and known is not None and (base := self._base) is not None:  # MD1
            sent.ClearField("state_blocks")
            sent.state_change.CopyFrom(manifestdelta.change(base[0], base[1], known.names))
        return (report if sent is None else sent), names

    def carries(self, named: blocks.Named | None) -> bool:
        """Whether a state so named goes as blocks, each carried, even when none is held."""
        return self.carry_over is not None and named is not None and len(named.state) > self.carry_over

    def accepted(self, answer: pb.ReportStateResponse, names: set[bytes], snapshot_id: str = "") -> None:
        """The controller took the report of `snapshot_id` whose state's blocks are `names`
        (`form`'s set: kept, not copied); answered takes_changes, its manifest is the base (MD3)."""
        self._takes_blocks = answer.takes_blocks
        formed = self._formed.get(snapshot_id) if answer.takes_changes else None
        self._base = (snapshot_id, formed) if formed is not None else None
        # `form`'s set, made for this report and handed over: taken as it is (a copy is 8192 entries at 64 MiB)
        self._held = names if answer.takes_blocks else set()

    def refused(self, details: str) -> bool:
        """Whether a refusal with `details` asks for the state whole (and nothing is taken as held now)."""
        if details.startswith(blocks.MISSING):
            self._held = set()
            return True
        if details.startswith(manifestdelta.MISSING_BASE):  # MD3: the full manifest now, the blocks held still
            self._base = None
            return True
        return False
