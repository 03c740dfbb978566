"""An app's state in a log record, its base64 made as the line is written."""

from __future__ import annotations

import binascii
from collections.abc import Iterator

_b2a = binascii.b2a_base64


class Packed:
    """An app's state (init, checkpoint, restore) as a log field, ``wal.pack(data)``, not yet made .

    At a GiB a node, the state's base64 as a str and the line joined around it were
    2.7 states held at once on top of the state itself. A record holds this instead:
    the bytes the node holds anyway, encoded a slice at a time as the line is written
    (`slices`). It reads as the str it stands for: equal to it, `len` its length, and
    `wal.unpack` gives the bytes back without a round trip."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __len__(self) -> int:
        return 4 * ((len(self.data) + 2) // 3)

    def __bool__(self) -> bool:
        return bool(self.data)

    def text(self) -> str:
        return _b2a(bytes(self.data), newline=False).decode()  # a BlockState joined (blockstate.py BST3)

    def slices(self, chars: int) -> Iterator[bytes]:
        """The base64, in slices of at most `chars` (a multiple of 4: each slice of data a multiple of 3)."""
        step = max(3, chars // 4 * 3)
        if not isinstance(self.data, bytes | bytearray | memoryview):  # held as its blocks (blockstate.py): a run at a time
            for run in self.data.runs(step):
                yield _b2a(run, newline=False)
            return
        view = memoryview(self.data)
        for at in range(0, len(view), step):
            yield _b2a(view[at : at + step], newline=False)

    def __eq__(self, other: object) -> bool:
        if type(other) is Packed:
            return self.data == other.data
        return isinstance(other, str) and len(other) == len(self) and other == self.text()

    def __hash__(self) -> int:
        return hash(bytes(self.data))

    def __repr__(self) -> str:
        return f"Packed({len(self.data)} bytes)"
