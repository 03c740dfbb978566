"""Reading a data dir's transfer logs for `snapmesh trace`: every node's
records in lsn order (sealed segments too, a torn last line skipped), by the
one log reader, `snapmesh.checking.node_logs`. Kinds are not checked here: the trace
ignores the ones it does not know.

`read_around(data_dir, snapshot_id)` reads only what the picture of one cut
needs (the page draws it): per node, the lines from `margin` before its first
line naming the snapshot to `margin` after its last one, and of those no more
than `window_bytes` of log: half of it before the first line naming the
snapshot, the rest after (a part longer than that is cut short at its end).
The files are searched for the snapshot a block at a time, newest first, and
only the window is read and parsed, so the memory it takes is a block and the
window, whatever the length of the run or the size of a segment. `lines_naming`
is the same search for the records that name a snapshot (a stuck one's page).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from snapmesh.checking.node_logs import LogReadError as LogError
from snapmesh.checking.node_logs import LeftOut, log_files, log_nodes, read_logs

__all__ = ["LeftOut", "LogError", "lines_naming", "read_around", "read_data_dir"]

MARGIN = 400  # lines kept either side of a node's lines naming the snapshot
WINDOW_BYTES = 4 * 1024 * 1024  # bytes of one node's log read around its part in a snapshot (`snapmesh ui --window-bytes`)
BLOCK_BYTES = 1024 * 1024  # what the search for a snapshot's lines holds of a file at a time


def read_data_dir(data_dir: str | Path, left_out: list[LeftOut] | None = None) -> dict[str, list[dict]]:
    """node -> records in lsn order, for every node with a log in `data_dir`; each
    torn last line left out is added to `left_out`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise LogError(f"{data_dir}: no such directory")
    nodes = log_nodes(data_dir)
    if not nodes:
        raise LogError(f"{data_dir}: no transfer logs (<node>.log.jsonl)")
    return read_logs(data_dir, nodes, left_out)


def read_around(
    data_dir: str | Path, snapshot_id: str, margin: int = MARGIN, window_bytes: int = WINDOW_BYTES
) -> dict[str, list[dict]]:
    """node -> the records around its part in `snapshot_id` (its cut and markers),
    in lsn order, for every node with a log in `data_dir` that names it; LogError
    when none does. At most `margin` lines either side and `window_bytes` bytes
    per node (the module doc)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise LogError(f"{data_dir}: no such directory")
    needle = f'"{snapshot_id}"'.encode()
    found = {}
    for node in log_nodes(data_dir):
        lines = _window(log_files(data_dir, node), needle, margin, window_bytes)
        if lines:
            found[node] = [_record(where, raw) for where, raw in lines]
    if not found:
        raise LogError(f"{data_dir}: no log names snapshot {snapshot_id!r}")
    return found


def lines_naming(path: Path, needle: bytes) -> Iterator[bytes]:
    """The complete lines of the file at `path` that hold `needle`, read a block
    at a time (a torn last line is not complete: left out)."""
    rest = b""
    with open(path, "rb") as file:
        while block := file.read(BLOCK_BYTES):
            data = rest + block
            end = data.rfind(b"\n") + 1
            data, rest = data[:end], data[end:]
            at = data.find(needle)
            while at >= 0:
                start, stop = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
                yield data[start:stop]
                at = data.find(needle, stop)


def _window(files: list[Path], needle: bytes, margin: int, window_bytes: int) -> list[tuple[str, bytes]]:
    """The lines of `files` (one node's, in lsn order) from `margin` before the first
    line holding `needle` to `margin` after the last one, within `window_bytes`
    (the module doc); [] when none does. Files farther than one from a file that
    holds `needle` are not opened."""
    hits: dict[int, tuple[int, int]] = {}  # file index -> (first, last) offset of `needle` in it
    for index in reversed(range(len(files))):  # newest first: a snapshot the page asks about is a recent one
        found = _find(files[index], needle)
        if found is not None:
            hits[index] = found
        elif hits:
            break
    if not hits:
        return []
    near = range(max(0, min(hits) - 1), min(len(files), max(hits) + 2))  # one file either side, as `margin` may need
    starts, total = {}, 0
    for index in near:
        starts[index] = total
        total += files[index].stat().st_size
    first = starts[min(hits)] + hits[min(hits)][0]
    last = starts[max(hits)] + hits[max(hits)][1]
    low = max(0, first - window_bytes // 2)
    high = min(total, low + window_bytes, last + window_bytes // 2)
    lines = [line for index in near for line in _lines_between(files[index], low - starts[index], high - starts[index])]
    marks = [i for i, (_, raw) in enumerate(lines) if needle in raw]
    if not marks:  # pragma: no cover  (the window starts before the first line naming it)
        return []
    return lines[max(0, marks[0] - margin) : marks[-1] + margin + 1]


def _find(path: Path, needle: bytes) -> tuple[int, int] | None:
    """The offsets of the first and the last `needle` in the file, read a block at a time; None: none."""
    first = last = None
    overlap = len(needle) - 1
    with open(path, "rb") as file:
        offset, carry = 0, b""  # the file offset of `carry + block`'s first byte
        while block := file.read(BLOCK_BYTES):
            data = carry + block
            at = data.find(needle)
            if at >= 0 and first is None:
                first = offset + at
            at = data.rfind(needle)
            if at >= 0:
                last = offset + at
            keep = min(overlap, len(data))
            offset += len(data) - keep
            carry = data[len(data) - keep :] if keep else b""
    return None if first is None else (first, last)


def _lines_between(path: Path, low: int, high: int) -> list[tuple[str, bytes]]:
    """The complete lines of the file that lie within bytes [low, high) of it
    (either may fall outside the file); each as (`file@offset`, bytes)."""
    size = path.stat().st_size
    low, high = max(0, low), min(size, high)
    if low >= high:
        return []
    with open(path, "rb") as file:
        file.seek(max(0, low - 1))
        data = file.read(high - max(0, low - 1))
    start = 0
    if low > 0:  # the byte before the window: a newline says the window starts on a line's first byte
        start = data.find(b"\n") + 1 if data[:1] != b"\n" else 1
        if start == 0:
            return []
    end = data.rfind(b"\n") + 1  # a line the window cuts (or a torn last line) is left out
    base = max(0, low - 1)
    lines, at = [], start
    while at < end:
        stop = data.index(b"\n", at)
        lines.append((f"{path}@{base + at}", data[at:stop]))
        at = stop + 1
    return lines


def _record(where: str, raw: bytes) -> dict:
    try:
        record = json.loads(raw)
        record["lsn"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise LogError(f"{where}: not a log record: {raw[:80].decode('utf-8', errors='replace')!r}") from None
    return record
