"""A restore's state as blocks: the manifest and only the blocks the node lacks, pure.

A restore sends each node its recorded state (restoreplan.py R3). A node that
reported recently holds most of that state's blocks already (its last report's
state, blocks.py B4-B5), so the controller sends it the state as blocks:

RB1. Only to a node whose last accepted report said it holds blocks
     (FullState.holds_blocks): a node from before never sets it and gets its
     state whole, as it always did; a controller from before never sends blocks.
RB2. `referenced_restore`: the request with `state` replaced by its manifest,
     the contents of only the blocks not in `held` (the names of that report's
     state), and the state's digest. The state is cut as that report's was
     (its parts, when they add up to the state's size; else the plain grid),
     so that an unchanged block has the name the node knows it by. A cut that
     differs sends more blocks, never a wrong state.
RB3. `whole_restore`: the node rebuilds the state from the blocks carried
     (each hashed) and the blocks it holds (each checked against its name
     when it was kept), then checks the whole against `state_digest`. A block
     found in neither, or a digest that does not match, is named, and nothing
     is rebuilt: the node refuses (FAILED_PRECONDITION, blocks.MISSING) before
     anything changes, and the controller sends the state whole (one round
     more, never a wrong state: a node that lost its blocks holds nothing).
RB4. A node keeps a copy of the blocks it holds on disk (services/node/blockshelf.py),
     so a node that restarted still holds them; each is checked against its name
     when read, and one that does not match is not held (RB3 then refuses).
RB5. The controller's knowledge of what a node holds is a belief, never trusted
     for correctness: after a controller restart it is rebuilt from the newest
     stored manifests of that node's state (services/controller/heldseed.py), and a
     wrong belief costs the refusal of RB3 and one round more, never a wrong or
     incomplete state (every block is carried or held and checked, and the whole
     is checked against `state_digest`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from snapmesh.protocol import blocks, statedigest
from snapmesh.protocol.appstate import digest
from snapmesh.v1 import snapmesh_pb2 as pb


def referenced_restore(
    request: pb.RestoreStateRequest, held: frozenset[bytes] | set[bytes], parts: Sequence[int] = (),
) -> tuple[pb.RestoreStateRequest | None, list[bytes]]:
    """`request` (not changed) with its state as blocks (RB2), and the state's
    blocks' names; None in place of the request when it has no state or none of
    its blocks is in `held` (then it goes whole)."""
    state = request.state if request.HasField("state") else b""  # read once: each read is a copy
    if not state:
        return None, []
    named = blocks.names(state, parts)[0]
    if held.isdisjoint(named.names):
        return None, named.names
    sent = pb.RestoreStateRequest()
    sent.CopyFrom(request)
    sent.ClearField("state")
    sent.state_blocks.hashes.extend(named.names)
    sent.state_digest = digest(state)
    new: set[bytes] = set()
    for (start, end), name in zip(named.bounds, named.names, strict=True):
        if name not in held and name not in new:
            new.add(name)
            sent.blocks.append(state[start:end])
    return sent, named.names


def whole_restore(
    request: pb.RestoreStateRequest, held: Callable[[bytes], bytes | None],
) -> tuple[blocks.Named | None, str]:
    """The state `request` carries as blocks (RB3): each from those it carries or
    else `held(hash)` (a block the node checked against its name when it kept it;
    None: it holds none), cut as the manifest cuts it; or None and why not."""
    carried = {blocks.block_hash(block): block for block in request.blocks}
    found: list[bytes] = []
    missing: list[bytes] = []
    for name in request.state_blocks.hashes:
        block = carried.get(name)
        if block is None:
            block = held(name)
        if block is None:
            missing.append(name)
        else:
            found.append(block)
    if missing:
        shown = ", ".join(f"sha256:{name.hex()}" for name in missing[:3]) + (" ..." if len(missing) > 3 else "")
        return None, (f"{blocks.MISSING}: {len(missing)} of the state of snapshot {request.snapshot_id} are neither "
                      f"sent nor held here ({shown}); send the state whole")
    state = b"".join(found)
    if request.HasField("state_digest") and (got := statedigest.of(state, like=request.state_digest)) != request.state_digest:
        return None, (f"{blocks.MISSING}: none, but the state of snapshot {request.snapshot_id} rebuilt from them is "
                      f"{got}, not {request.state_digest}; send the state whole")
    cut, start = [], 0
    for block in found:
        cut.append((start, start + len(block)))
        start += len(block)
    return blocks.Named(state, cut, list(request.state_blocks.hashes), {}), ""


def reader(
    *states: blocks.Named | None, shelf: Callable[[bytes], bytes | None] | None = None,
) -> Callable[[bytes], bytes | None]:
    """`held` for `whole_restore`: a block of any of `states` (each cut and named, checked), by name;
    else `shelf`'s (RB4: a block kept on disk, checked against its name as it is read)."""
    where = [(named.state, dict(zip(named.names, named.bounds, strict=True))) for named in states if named is not None]

    def get(name: bytes) -> bytes | None:
        for state, bounds in where:
            if (at := bounds.get(name)) is not None:
                return state[at[0] : at[1]]
        return shelf(name) if shelf is not None else None

    return get
