"""A latency model for the simulator at scale: per-link delays, per-message and per-log-round costs.

Pure: no clock is read and no randomness is its own. The caller passes in a
`random.Random` (seeded), and the times it gets back are offsets in simulated
seconds that it adds to its own clock (snapmesh/sim/scale.py advances that clock
from event to event). Same seed, same draws, same run.

Placement: node i sits on rack i // rack_size, and racks are dealt round-robin
to `regions` regions, so neighbours in id order share a rack and a ring crosses
regions at every rack boundary. A link's one-way delay is drawn per message
from a uniform distribution by how far apart its ends are:

  same rack       rack_ms    (default 1-5 ms)
  same region     zone_ms    (default 5-20 ms: racks of one region)
  other region    region_ms  (default 20-80 ms)

A channel stays FIFO whatever the draw: the caller delivers a message no earlier
than the one before it on the same channel (the model the algorithm assumes).

Costs, charged to the node that does the work (its CPU is busy meanwhile, so a
node's sends queue up behind each other):

  send_ms       per message sent (serialize, syscall): a marker fan-out of K
                channels costs K of them
  log_round_ms  per log round (one group commit: write + fsync) before a node's
                part is durable and may be reported
"""

from __future__ import annotations

import random
from dataclasses import dataclass

Range = tuple[float, float]


class LatencyError(ValueError):
    """A latency model that cannot be used (a negative or inverted range, a rack of 0 nodes)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LatencyModel:
    rack_size: int = 20
    regions: int = 3
    rack_ms: Range = (1.0, 5.0)
    zone_ms: Range = (5.0, 20.0)
    region_ms: Range = (20.0, 80.0)
    send_ms: float = 0.02
    log_round_ms: float = 2.0

    def __post_init__(self) -> None:
        if self.rack_size < 1 or self.regions < 1:
            raise LatencyError(f"rack_size and regions must be at least 1, got {self.rack_size} and {self.regions}")
        for name in ("rack_ms", "zone_ms", "region_ms"):
            low, high = getattr(self, name)
            if low < 0 or high < low:
                raise LatencyError(f"{name} must be 0 <= low <= high, got {low:g}-{high:g}")
        if self.send_ms < 0 or self.log_round_ms < 0:
            raise LatencyError(f"costs must not be negative, got send {self.send_ms} ms, log round {self.log_round_ms} ms")

    def rack(self, index: int) -> int:
        return index // self.rack_size

    def region(self, index: int) -> int:
        return self.rack(index) % self.regions

    def span(self, a: int, b: int) -> str:
        """How far apart nodes `a` and `b` (by index) are: "rack", "zone" or "region"."""
        if self.rack(a) == self.rack(b):
            return "rack"
        return "zone" if self.region(a) == self.region(b) else "region"

    def delay(self, a: int, b: int, rng: random.Random) -> float:
        """One message's one-way delay from node `a` to node `b`, in seconds."""
        low, high = {"rack": self.rack_ms, "zone": self.zone_ms, "region": self.region_ms}[self.span(a, b)]
        return rng.uniform(low, high) / 1000.0

    @property
    def send_s(self) -> float:
        return self.send_ms / 1000.0

    @property
    def log_round_s(self) -> float:
        return self.log_round_ms / 1000.0

    def describe(self) -> str:
        return (
            f"rack {self.rack_size} nodes {self.rack_ms[0]:g}-{self.rack_ms[1]:g} ms, "
            f"{self.regions} regions (in-region {self.zone_ms[0]:g}-{self.zone_ms[1]:g} ms, "
            f"across {self.region_ms[0]:g}-{self.region_ms[1]:g} ms), "
            f"send {self.send_ms:g} ms/message, log round {self.log_round_ms:g} ms"
        )
