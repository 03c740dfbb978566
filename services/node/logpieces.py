"""The transfer log's rounds as pieces of text, written without a copy of a large line.

A round's lines are joined into pieces of at most PIECE_CHARS; a line over that (an
init, a checkpoint or a restore holding a state) is a piece of its own, and its state's
base64 (wal.Packed) is made a slice at a time as it is written: at a GiB a node, the
base64 as a str and the line around it were 2.7 states held at once.
"""

from __future__ import annotations

import os
from typing import Any

from snapmesh.protocol import wal


Text = tuple["str | wal.Packed", ...]  # a round's lines as pieces: each encoded as it is written (write_all)
PIECE_CHARS = 8 * 1024 * 1024  # a piece of lines joined, and the slice a large line is encoded by


def line(text: str | wal.Line) -> str | wal.Line:
    """A record's line as the buffer keeps it: a `Line` (a state's base64 not yet made,
    wal.Packed) only when it is a piece of its own (over PIECE_CHARS); else its text."""
    return text if isinstance(text, str) or len(text) > PIECE_CHARS else text.text()


def pieces(text: str | wal.Line) -> Text:
    """A line as pieces to write."""
    return (text,) if isinstance(text, str) else text.parts


def chunks(items: list) -> list[tuple[Text, Any]]:
    """The buffer (lines, and the log's seals among them) as (the text to append, the
    seal that follows it or None). Small lines are joined into pieces; a line over
    PIECE_CHARS (a state of a GiB, base64, in an init, a checkpoint or a restore) is a
    piece of its own, never copied: joined, then encoded whole, it was held three
    times at once; its state's base64 is made as it is written."""
    out: list[tuple[Text, Any]] = []
    parts: list[str | wal.Packed] = []
    lines: list[str] = []
    joined = 0
    for item in items:
        seal = not isinstance(item, (str, wal.Line))
        if seal or len(item) > PIECE_CHARS or joined + len(item) > PIECE_CHARS:
            if lines:
                parts.append("".join(lines))
            lines, joined = [], 0
        if seal:
            out.append((tuple(parts), item))
            parts = []
        elif len(item) > PIECE_CHARS:
            parts += pieces(item)
        else:
            lines.append(item)
            joined += len(item)
    if lines:
        parts.append("".join(lines))
    if parts or not out:
        out.append((tuple(parts), None))
    return out


def size(text: Text) -> int:
    """Its length (in bytes for ASCII, as a log's lines nearly always are: what the round's choices need)."""
    return sum(map(len, text))


def write_all(fd: int, data: Text) -> None:
    """Append `data`: each piece encoded a slice at a time."""
    for piece in data:
        if type(piece) is wal.Packed:  # a state's base64, made a slice at a time (no str of it whole)
            for text in piece.slices(PIECE_CHARS):
                _write_bytes(fd, text)
            continue
        for at in range(0, len(piece), PIECE_CHARS):  # a slice encoded at a time: no copy of a large line
            _write_bytes(fd, piece[at : at + PIECE_CHARS].encode())  # type: ignore[union-attr]


def _write_bytes(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
