"""Every message sent is received exactly once: the logs' sends against their receives, by msg_id.

What the framework carries, whatever the app: a `send` and a `recv` record name one
message by its msg_id (snapmesh/protocol/wal.py); what its payload means is the app's,
and is not read here. So the bank's campaign and an app's wait on the same count
when they quiesce, and an app's is judged by it. Within one epoch of the logs
(msg ids start over after a restore: `logcheck.split_epochs`). Pure: records in,
msg ids out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Deliveries:
    """The msg ids of one epoch's logs that break "sent once, received once", each list sorted."""

    sent: int  # distinct msg ids sent
    sent_twice: list[str]
    duplicated: list[str]  # received more than once
    phantom: list[str]  # received, never sent
    unreceived: list[str]  # sent, not (yet) received: once the cluster settled, lost

    @classmethod
    def of(cls, logs: Mapping[str, list[Mapping[str, Any]]]) -> Deliveries:
        sends = Counter(r["msg_id"] for records in logs.values() for r in records if r.get("kind") == "send")
        recvs = Counter(r["msg_id"] for records in logs.values() for r in records if r.get("kind") == "recv")
        return cls(sent=len(sends),
                   sent_twice=sorted(m for m, n in sends.items() if n > 1),
                   duplicated=sorted(m for m, n in recvs.items() if n > 1),
                   phantom=sorted(m for m in recvs if m not in sends),
                   unreceived=sorted(m for m in sends if m not in recvs))

    def wrong(self, *, settled: bool = True) -> dict[str, list[str]]:
        """Each kind of wrong delivery found, by its name in a verdict (`settled`: a send not received is lost)."""
        found = {"sent twice": self.sent_twice, "received twice": self.duplicated,
                 "received, never sent": self.phantom, "lost (sent, never received)": self.unreceived if settled else []}
        return {kind: ids for kind, ids in found.items() if ids}
