"""A COMPLETE snapshot's channels, kept compact and listed in full (tracker rules T3, T8), pure.

The tracker keeps a COMPLETE snapshot compact: its `channels` are only those that
hold recorded messages, in topology order, and every other channel of the topology
is empty. Completing it then costs the nodes and those channels, not every channel
of the graph (a 300-node mesh has 89,700, of which a few hundred hold anything).

A v1 answer lists every channel: `ChannelList.expand` builds that list from the
compact snapshot. An empty channel is its src and dst alone (the assembly never
carries anything else into an empty one, whatever the report said of it), so the
expanded message is the one the tracker used to build, byte for byte. The empty
channels are encoded once per topology, as one block of `Snapshot.channels`
entries; an expansion splices the compact channels into it, in Python a step per
listed channel, and protobuf parses the whole list in C.
"""

from __future__ import annotations

from collections.abc import Iterable

from snapmesh.protocol.topology import Channel, Topology
from snapmesh.v1 import snapmesh_pb2 as pb


class ChannelList:
    """A topology's channels: their order, and every one of them, empty, encoded."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.places: dict[Channel, int] = {channel: i for i, channel in enumerate(topology.channels)}
        empty = pb.Snapshot()
        add = empty.channels.add
        for src, dst in topology.channels:
            add(src=src, dst=dst)
        self._empty = empty.SerializeToString()  # one Snapshot.channels entry per channel, in topology order
        # Where each channel's entry starts in _empty, and the end: 8 bytes a channel, not an int object.
        self._starts = starts = memoryview(bytearray(8 * (len(empty.channels) + 1))).cast("Q")
        for i, channel in enumerate(empty.channels):
            size = channel.ByteSize()
            starts[i + 1] = starts[i] + 1 + _varint_size(size) + size  # the field's tag, the length, the channel

    def in_order(self, channels: Iterable[Channel]) -> list[Channel]:
        """`channels` once each, in topology order; one the topology does not have is left out."""
        places = self.places
        return sorted({c for c in channels if c in places}, key=places.__getitem__)

    def expand(self, compact: pb.Snapshot) -> pb.Snapshot:
        """A new message: `compact` (its channels a subset of the topology's, in its
        order) with every channel of the topology listed, in its order."""
        full = pb.Snapshot()
        full.CopyFrom(compact)
        del full.channels[:]
        parts, done, starts = [], 0, self._starts
        for channel in compact.channels:
            place = self.places[(channel.src, channel.dst)]
            parts += [self._empty[starts[done]:starts[place]], _entry(channel)]
            done = place + 1
        parts.append(self._empty[starts[done]:])
        full.MergeFromString(b"".join(parts))
        return full


def _varint_size(n: int) -> int:
    """Bytes of `n` as a protobuf varint."""
    return max(1, (n.bit_length() + 6) // 7)


def _entry(channel: pb.ChannelState) -> bytes:
    """`channel` as one entry of `Snapshot.channels` on the wire."""
    return pb.Snapshot(channels=[channel]).SerializeToString()
