"""Reading a data dir's transfer logs for `snapmesh trace`.

A node's log is `<data_dir>/<node>.log.jsonl`; sealed segments
`<data_dir>/<node>.log.<first_lsn, 12 digits>.jsonl` may sit beside it. All of a
node's files are read and their records put in lsn order. A torn last line of a
node's newest file is what a crash leaves (the node drops it on restart) and is
skipped; any other line that is not a JSON object with `node`, `lsn` and `kind`
is a `LogError` naming the file and line. Kinds are not checked here: the trace
ignores the ones it does not know.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_ACTIVE = re.compile(r"^(?P<node>.+)\.log\.jsonl$")
_SEGMENT = re.compile(r"^(?P<node>.+)\.log\.(?P<first>\d{12})\.jsonl$")


class LogError(ValueError):
    """A log file cannot be read as records; the message names the file and line."""


def log_files(data_dir: Path) -> dict[str, list[Path]]:
    """node -> its log files, sealed segments first (by first lsn), the active file last."""
    found: dict[str, list[tuple[int, Path]]] = {}
    for path in data_dir.iterdir():
        if not path.is_file():
            continue
        segment = _SEGMENT.match(path.name)
        if segment:
            found.setdefault(segment["node"], []).append((int(segment["first"]), path))
            continue
        active = _ACTIVE.match(path.name)
        if active:
            found.setdefault(active["node"], []).append((1 << 62, path))
    return {node: [path for _, path in sorted(files)] for node, files in sorted(found.items())}


def parse_lines(lines: list[str], *, where: str, last_file: bool) -> list[dict]:
    """Records from one file's lines; `where` names the file in errors."""
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if last_file and number == len(lines):
                break  # a torn tail: the crash happened mid-write
            raise LogError(f"{where}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("lsn"), int) or not isinstance(record.get("kind"), str):
            raise LogError(f"{where}:{number}: not a log record (needs integer lsn and string kind)")
        records.append(record)
    return records


def read_node(node: str, files: list[Path]) -> list[dict]:
    """Every record of one node, in lsn order, duplicates across files removed."""
    by_lsn: dict[int, dict] = {}
    for index, path in enumerate(files):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise LogError(f"{path}: cannot read: {exc}") from None
        for record in parse_lines(text.splitlines(), where=str(path), last_file=index == len(files) - 1):
            if record.get("node", node) != node:
                raise LogError(f"{path}: record lsn {record['lsn']} is from node {record['node']!r}, not {node!r}")
            by_lsn.setdefault(record["lsn"], record)
    return [by_lsn[lsn] for lsn in sorted(by_lsn)]


def read_data_dir(data_dir: str | Path) -> dict[str, list[dict]]:
    """node -> records in lsn order, for every node with a log in `data_dir`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise LogError(f"{data_dir}: no such directory")
    files = log_files(data_dir)
    if not files:
        raise LogError(f"{data_dir}: no transfer logs (<node>.log.jsonl)")
    return {node: read_node(node, paths) for node, paths in files.items()}
