"""Reading a data dir's transfer logs for `snapmesh trace`: every node's
records in lsn order (sealed segments too, a torn last line skipped), by the
one log reader, `snapmesh.checking.node_logs`. Kinds are not checked here: the trace
ignores the ones it does not know.

`read_around(data_dir, snapshot_id)` reads only what the picture of one cut
needs (the page draws it): per node, the lines from `margin` before its first
line naming the snapshot to `margin` after its last one. Files are read one at a
time, newest first, and only the lines of that window are parsed, so the memory
it takes does not grow with the length of the run.
"""

from __future__ import annotations

from pathlib import Path

import json

from snapmesh.checking.node_logs import LogReadError as LogError
from snapmesh.checking.node_logs import LeftOut, log_files, log_nodes, read_logs
from snapmesh.protocol import wal

__all__ = ["LeftOut", "LogError", "read_around", "read_data_dir"]

MARGIN = 400  # lines kept either side of a node's lines naming the snapshot


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


def read_around(data_dir: str | Path, snapshot_id: str, margin: int = MARGIN) -> dict[str, list[dict]]:
    """node -> the records around its part in `snapshot_id` (its cut and markers),
    in lsn order, for every node with a log in `data_dir` that names it; LogError
    when none does."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise LogError(f"{data_dir}: no such directory")
    needle = f'"{snapshot_id}"'.encode()
    found = {}
    for node in log_nodes(data_dir):
        lines = _window(log_files(data_dir, node), node, needle, margin)
        if lines:
            found[node] = [_record(where, raw) for where, raw in lines]
    if not found:
        raise LogError(f"{data_dir}: no log names snapshot {snapshot_id!r}")
    return found


def _window(files: list[Path], node: str, needle: bytes, margin: int) -> list[tuple[str, bytes]]:
    """The lines of `files` (one node's, in lsn order) from `margin` before the first
    line holding `needle` to `margin` after the last one; [] when none does."""
    chunks: list[list[tuple[str, bytes]]] = []  # newest file first
    hit = False
    for path in reversed(files):
        data = path.read_bytes()
        if path.name == wal.active_name(node):
            data = data[: data.rfind(b"\n") + 1]  # a torn last line: a node still writing
        if needle in data:
            hit = True
            chunks.append(wal.split_lines(data, str(path))[0])
        elif hit:
            chunks.append(_tail(data, path, margin))  # the file before the part: its last lines
            break
        else:
            chunks = [_head(data, path, margin)]  # a file after the part: its first lines, the oldest one only
    if not hit:
        return []
    lines = [line for chunk in reversed(chunks) for line in chunk]
    marks = [i for i, (_, raw) in enumerate(lines) if needle in raw]
    return lines[max(0, marks[0] - margin) : marks[-1] + margin + 1]


def _head(data: bytes, path: Path, count: int) -> list[tuple[str, bytes]]:
    """The first `count` complete lines of `data` (without splitting the rest)."""
    parts = data.split(b"\n", count)
    lines = parts[:count] if len(parts) > count else parts[:-1]  # data ends with a newline: its last part is b""
    return [(f"{path}:{n}", raw) for n, raw in enumerate(lines, start=1)]


def _tail(data: bytes, path: Path, count: int) -> list[tuple[str, bytes]]:
    """The last `count` complete lines of `data` (which ends with a newline)."""
    if count <= 0 or not data:
        return []
    lines = data[:-1].rsplit(b"\n", count)[-count:]
    first = data.count(b"\n") - len(lines) + 1
    return [(f"{path}:{first + i}", raw) for i, raw in enumerate(lines)]


def _record(where: str, raw: bytes) -> dict:
    try:
        record = json.loads(raw)
        record["lsn"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise LogError(f"{where}: not a log record: {raw[:80].decode('utf-8', errors='replace')!r}") from None
    return record
