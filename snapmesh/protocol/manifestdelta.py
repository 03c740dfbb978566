"""A report's manifest sent as its change from an earlier one of the same node, pure.

A report as blocks (blocks.py B4) named every block of the node's state: 8,192
names (262 KB) at 64 MiB, encoded by the node, parsed, checked, pinned and
journaled by the controller at every snapshot, where a steady state changes a
few of them. Sent as its change from a manifest both ends hold, the names on the
report's path are the changed ones.

The rules (the node's services/node/sentblocks.py and the controller's
services/controller/servicer.py carry them out):
MD1. A change names its base (the snapshot of an earlier report of the same
    node, and how many names that manifest has), the new manifest's length, and
    each position whose name differs from the base's there or lies past the base's
    end, strictly increasing, with its name. `applied` to the base's manifest it
    gives the new manifest, name for name (`change` and `applied` are inverses).
MD2. A change that does not fit its base (positions not increasing, one at or past
    the new length, a name not 32 bytes, not as many names as positions, a position
    past the base's end not listed, a base of another length) is the sender's
    error: refused INVALID_ARGUMENT naming what, and nothing changes.
MD3. The node's base is the last report the controller answered takes_changes,
    and only that answer makes it one: a report refused, lost or answered by a
    controller before changes leaves the node with no base, and its next manifest
    goes in full. A change whose base the controller does not hold (it restarted,
    the base went out of its memory, another controller answers) is refused
    FAILED_PRECONDITION "missing base: ..." (MISSING_BASE), changing nothing; the
    node drops its base and sends the same report's full manifest: a round lost,
    never a wrong or lost report.
MD4. The controller holds, per node, the manifests of the last BASES_KEPT reports
    it took from it (ManifestBases), keyed by their snapshot: a node may have
    formed a report against a base the controller has since moved past (reports
    in flight together).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import ne

from snapmesh.v1 import snapmesh_pb2 as pb

MISSING_BASE = "missing base"  # how a refused change's details start (MD3)
HASH_BYTES = 32


class BadChange(ValueError):
    """A change that does not fit its base (MD2): the sender's error."""

    code = "INVALID_ARGUMENT"


class MissingBase(Exception):
    """A change whose base the controller does not hold (MD3): the node sends the full manifest."""

    code = "FAILED_PRECONDITION"


def change(base_snapshot_id: str, base: Sequence[bytes], names: Sequence[bytes]) -> pb.StateChange:
    """`names` as its change from `base`, the manifest of `base_snapshot_id` (MD1).
    The compare is of name objects in C (mostly the very objects: unchanged blocks
    keep their hash object, blocks.py B5), not a step in Python a name."""
    common = min(len(base), len(names))
    positions = list(compress(range(common), map(ne, names[:common], base[:common])))
    positions.extend(range(common, len(names)))
    out = pb.StateChange(base_snapshot_id=base_snapshot_id, base_count=len(base), block_count=len(names))
    out.positions.extend(positions)
    out.hashes.extend(names[i] for i in positions)
    return out


def applied(delta: pb.StateChange, base: Sequence[bytes]) -> list[bytes]:
    """The manifest `delta` makes of `base` (MD1), or BadChange naming what does not fit (MD2)."""
    where = f"the change from the manifest of snapshot {delta.base_snapshot_id!r}"
    count, positions, names = delta.block_count, list(delta.positions), list(delta.hashes)
    if delta.base_count != len(base):
        raise BadChange(f"{where} says its base has {delta.base_count} names; the base held has {len(base)}")
    if len(positions) != len(names):
        raise BadChange(f"{where} has {len(positions)} positions and {len(names)} names")
    if positions and positions[-1] >= count:
        raise BadChange(f"{where} has position {positions[-1]} in a manifest of {count} names")
    if any(map(int.__ge__, positions, positions[1:])):
        raise BadChange(f"{where}: its positions are not strictly increasing")
    if any(len(name) != HASH_BYTES for name in names):
        raise BadChange(f"{where} has a name that is not {HASH_BYTES} bytes")
    grown = max(0, count - len(base))
    if grown and positions[-grown:] != list(range(len(base), count)):
        raise BadChange(f"{where} grows the manifest to {count} names without naming each past {len(base)}")
    out = list(base[:count])
    out.extend(names[len(names) - grown:] if grown else ())
    for at, name in zip(positions[: len(positions) - grown], names, strict=False):
        out[at] = name
    return out


def missing_base(report: pb.FullState) -> MissingBase:
    delta = report.state_change
    return MissingBase(
        f"{MISSING_BASE}: the manifest of node {report.node_id}'s report of snapshot {delta.base_snapshot_id!r} "
        f"is not held here (snapshot {report.snapshot_id}); send the full manifest")
