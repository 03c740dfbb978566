"""An app's state digest in its two forms, pure: which bytes a node's state was.

A node's cut record, its report (`FullState.state_digest`), a snapshot's entry
(`NodeBalance.state_digest`) and a restore (`RestoreStateRequest.state_digest`)
say which bytes an app's state was by a digest. Hashing the whole state at every
cut cost a node tens of milliseconds at 64 MiB for a state of which 0.1% changed;
the blocks form costs what changed.

Rules
-----
SD1. Two forms, told apart by their prefix, neither ever read as the other:
     "sha256:<hex>"         the SHA-256 of the state's bytes (the whole form);
     "sha256-blocks:<hex>"  the SHA-256 of its blocks' SHA-256s (32 bytes each),
                            in order, the state cut into blocks of BLOCK_BYTES
                            from its start, the last one shorter (the grid; no
                            block for b""). The blocks fix the bytes as the whole
                            form does: two states with one digest are one state.
SD2. Every reader accepts both: it hashes the bytes it holds in the form the digest
     it checks names (`of(state, like=...)`, `Hasher.like`), and a digest in
     neither form matches nothing.
SD3. A node records a state of more than BLOCKS_FORM_BYTES in the blocks form and
     a smaller one in the whole form (`canonical`), so the checkers that compare a
     state's digest with a cut record's as text (snapmesh/checking/cut.py) get the
     form the node wrote. A blocks-form digest over a block the node hashed before
     takes that block's hash (snapmesh/protocol/node/cutnames.py): its cost follows
     what changed. GetState's `app_state_digest` and the v1 answers keep the whole
     form (they hash on request, not at every cut).
SD4. A cut record holds the whole form as bare hex (as it always did) and the
     blocks form with its prefix (`record_text`, `from_record`): an older record
     reads as the whole form, and a bare hex is never a blocks form.
SD5. `whole` and `grid_names` take a state held as its blocks (blockstate.BlockState,
     a node's cut of node/apphost.py H8) as well as bytes: hashed a block (or a grid
     slice) at a time, never joined whole.

Why the grid and not the report's cut (the app's parts, blocks.py B6): a reader
that holds the bytes can check the digest without knowing the parts (a snapshot
entry does not carry them), and a node whose parts are whole blocks (an app's
snapshot_blocks() of BLOCK_BYTES parts) gets the grid's hashes from its parts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from snapmesh.app import BLOCK_BYTES  # not blocks.py: a Spark executor reads this without protobuf

WHOLE = "sha256:"
BLOCKS = "sha256-blocks:"
BLOCKS_FORM_BYTES = 64 * 1024  # above: a node records the blocks form (SD3)


def whole(state: bytes) -> str:
    """The whole form (SD1). A state held as its blocks (a BlockState, SD5) is hashed a block at a time."""
    if isinstance(state, bytes | bytearray | memoryview):
        return WHOLE + hashlib.sha256(state).hexdigest()
    digest = hashlib.sha256()
    for block in state.blocks:
        digest.update(block)
    return WHOLE + digest.hexdigest()


def of_names(names: Iterable[bytes]) -> str:
    """The blocks form of the state whose grid blocks are named `names`, in order (SD1)."""
    return BLOCKS + hashlib.sha256(b"".join(names)).hexdigest()


def grid_names(state: bytes) -> list[bytes]:
    """The SHA-256 of each grid block of `state` (SD1); a BlockState's read by its slices (SD5)."""
    view = memoryview(state) if isinstance(state, bytes | bytearray | memoryview) else state
    return [hashlib.sha256(view[i : i + BLOCK_BYTES]).digest() for i in range(0, len(state), BLOCK_BYTES)]


def blocks_form(state: bytes) -> str:
    """The blocks form, every block hashed (a reader's; the node reuses its hashes, SD3)."""
    return of_names(grid_names(state))


def canonical(state: bytes) -> str:
    """The form a node records for `state` (SD3)."""
    return blocks_form(state) if len(state) > BLOCKS_FORM_BYTES else whole(state)


def is_blocks(digest: str) -> bool:
    return digest.startswith(BLOCKS)


def of(state: bytes, like: str = WHOLE) -> str:
    """The digest of `state` in the form of the digest `like` (SD2): the blocks form
    when `like` is one, else the whole form."""
    return blocks_form(state) if is_blocks(like) else whole(state)


def matches(digest: str, state: bytes) -> bool:
    """Whether `digest` (either form, SD2) is `state`'s."""
    return of(state, like=digest) == digest


def record_text(digest: str) -> str:
    """`digest` as a cut record holds it (SD4)."""
    return digest[len(WHOLE):] if digest.startswith(WHOLE) else digest


def from_record(text: str) -> str:
    """A cut record's digest in its prefixed form (SD4; "" stays "")."""
    return text if not text or ":" in text else WHOLE + text


class Hasher:
    """A state's digest fed in pieces of any size, in one form (SD1): a reader that
    streams a state's blocks hashes it as it goes."""

    def __init__(self, *, blocks: bool = False) -> None:
        self._whole = None if blocks else hashlib.sha256()
        self._names = hashlib.sha256() if blocks else None
        self._buffer = bytearray()

    @classmethod
    def like(cls, digest: str) -> Hasher:
        """A hasher in the form of `digest` (SD2)."""
        return cls(blocks=is_blocks(digest))

    def update(self, data: bytes, name: bytes | None = None) -> None:
        """Feed `data`; `name`: its SHA-256 when the caller has it, taken for a piece
        that is exactly one grid block (checked against its content by the caller)."""
        if self._whole is not None:
            self._whole.update(data)
            return
        assert self._names is not None
        if not self._buffer and len(data) == BLOCK_BYTES:
            self._names.update(name if name is not None else hashlib.sha256(data).digest())
            return
        self._buffer.extend(data)
        while len(self._buffer) >= BLOCK_BYTES:
            self._names.update(hashlib.sha256(self._buffer[:BLOCK_BYTES]).digest())
            del self._buffer[:BLOCK_BYTES]

    def text(self) -> str:
        """The digest of all that was fed."""
        if self._whole is not None:
            return WHOLE + self._whole.hexdigest()
        assert self._names is not None
        names = self._names.copy()
        if self._buffer:
            names.update(hashlib.sha256(self._buffer).digest())
        return BLOCKS + names.hexdigest()
