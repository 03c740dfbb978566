"""A report's encoded size, without encoding its state again, pure.

A snapshot's `state_size_bytes` (T5) is the sum of its reports' encoded sizes, and
protobuf computes a message's size by encoding it: 64 MiB encoded per node, on the
controller's loop, for a number. The tracker reads each state once anyway (T6);
`state_and_size` reads it once for both, and measures the rest of the report,
which is small beside it, by encoding that; `listed_size` measures a report held
as its block list (blockforms.py) as the report it stands for.
"""

from __future__ import annotations

from snapmesh.v1 import snapmesh_pb2 as pb

_STATE = pb.FullState.DESCRIPTOR.fields_by_name["state"].number


def varint_size(value: int) -> int:
    """The bytes of `value` (>= 0) as a protobuf varint."""
    return max(1, (value.bit_length() + 6) // 7)


def state_and_size(report: pb.FullState) -> tuple[bytes, int]:
    """The state of `report` (which has one) and the report's encoded size, equal to `report.ByteSize()`."""
    fields = {field.name: value for field, value in report.ListFields()}
    state = fields.pop("state")
    rest = pb.FullState(**fields).ByteSize()
    return state, rest + varint_size(_STATE << 3) + varint_size(len(state)) + len(state)


def listed_size(report: pb.FullState, state_bytes: int) -> int:
    """The encoded size of the report a listed `report` stands for (blockforms.py:
    its manifest in place of a state of `state_bytes`), equal to that report's `ByteSize()`."""
    fields = {field.name: value for field, value in report.ListFields() if field.name not in ("state_blocks", "blocks")}
    rest = pb.FullState(**fields).ByteSize()
    return rest + varint_size(_STATE << 3) + varint_size(state_bytes) + state_bytes
