"""What real nodes' transfer logs say, read independently of the node's code.

- `read_logs(data_dir, nodes)`: every node's records in lsn order, from its
  sealed segments `<node>.log.<first lsn, 12 digits>.jsonl` and its active
  `<node>.log.jsonl`. A torn last line of the active file (the bytes after its
  last newline: a node still writing, or one that crashed mid-write) is left
  out, and said so: a `LeftOut` per file, whose `notice` names the file and the
  bytes (`snapmesh trace` and `snapmesh reconcile` print it); anything else
  unreadable fails naming file and line.
- `log_events(logs, app)`: the records as the trace events `snapmesh.checking.trace` checks
  (kinds it does not know, such as `restart` and `abort`, are skipped), each value
  (a node's state, a message's content) as the app's part reads it from its record.
- What the values add up to (the bank's: sends against receives, each log's replay)
  is the app's: the bank's is `snapmesh.bank.logs`.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapmesh.protocol import wal


class LogReadError(AssertionError):
    """A log file cannot be read as the format says (file:line: problem)."""


@dataclass(frozen=True, slots=True)
class LeftOut:
    """The torn last line of a node's active file, left out of what was read."""

    file: str
    offset: int  # where the torn bytes start
    size: int  # how many there are

    @property
    def notice(self) -> str:
        return (f"{self.file}: left out its last {self.size} bytes (from byte {self.offset}): a line cut short, "
                "with no newline after it (a node still writing, or one that crashed mid-write)")


def log_files(data_dir: Path, node: str) -> list[Path]:
    """A node's files in lsn order: sealed segments by first lsn, then the active file."""
    names = [path.name for path in Path(data_dir).glob(f"{glob.escape(node)}.log*.jsonl")]
    return [Path(data_dir) / name for name in wal.segment_order(names, node)]


def log_nodes(data_dir: Path) -> list[str]:
    """Every node with a log file in `data_dir`."""
    return sorted({node for path in Path(data_dir).glob("*.jsonl") if (node := wal.log_file_node(path.name))})


def read_logs(
    data_dir: Path, nodes: Iterable[str] | None = None, left_out: list[LeftOut] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every node's records, in lsn order (default: every node with a log file);
    each torn last line left out is added to `left_out`."""
    return {node: read_node_log(data_dir, node, left_out) for node in (log_nodes(data_dir) if nodes is None else nodes)}


def read_node_log(data_dir: Path, node: str, left_out: list[LeftOut] | None = None) -> list[dict[str, Any]]:
    """A node's records in lsn order. A torn last line is what `wal.split_lines`
    says it is, as for the node's own recovery and `snapmesh reconcile`: the bytes
    after the last newline of the active file (a write cut short), left out (and
    added to `left_out`). Any other line that is not a record, the last complete
    one too, is an error."""
    files = log_files(data_dir, node)
    records: list[dict[str, Any]] = []
    for path in files:
        data = path.read_bytes()
        lines, torn_at = wal.split_lines(data, str(path))
        if torn_at is not None and path.name != f"{node}.log.jsonl":
            raise LogReadError(f"{path}:{len(lines) + 1}: a sealed segment ends in a line cut short")
        if torn_at is not None and left_out is not None:
            left_out.append(LeftOut(file=str(path), offset=torn_at, size=len(data) - torn_at))
        for where, raw in lines:
            try:
                record = json.loads(raw)
                lsn = record["lsn"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                text = raw.decode("utf-8", errors="replace")
                raise LogReadError(f"{where}: not a log record: {text[:80]!r}") from None
            if records and lsn <= records[-1]["lsn"]:
                raise LogReadError(f"{where}: lsn {lsn} after {records[-1]['lsn']}")
            if _lacks_a_field(record):
                try:
                    wal.from_dict(record, where)  # the format's own word on it (an app's record may leave some out)
                except wal.CorruptRecord as exc:
                    raise LogReadError(str(exc)) from None
            records.append(record)
    return records


_REQUIRED = {kind: tuple(key for key, _, required in spec if required) for kind, spec in wal.SPEC.items()}


def _lacks_a_field(record: dict[str, Any]) -> bool:
    """Whether a record of a kind the format knows lacks one of its required fields."""
    return any(key not in record for key in _REQUIRED.get(record.get("kind"), ()))  # type: ignore[arg-type]


def log_events(logs: Mapping[str, list[dict[str, Any]]], app: Any) -> list[dict[str, Any]]:
    """The logs as trace events for `trace.check_trace` (position = lsn). `app`: the app's part, which
    names its events' keys (`state_key`, `content_key`) and reads a record's value (`value(record, where)`:
    an init's or a cut's state, a send's or a receive's content; wal.CorruptRecord for a record without it,
    raised here as LogReadError)."""
    state, content = app.state_key, app.content_key
    events: list[dict[str, Any]] = []
    for node, records in logs.items():
        for r in records:
            kind = r.get("kind")
            if kind == "init":
                events.append({"event": "node", "node": node, state: _value(app, node, r)})
            elif kind == "send":
                events.append({"event": "send", "node": node, "pos": r["lsn"], "dst": r["dst"], "msg": r["msg_id"],
                               content: _value(app, node, r)})
            elif kind == "recv":
                events.append({"event": "receive", "node": node, "pos": r["lsn"], "src": r["src"],
                               "msg": r["msg_id"], content: _value(app, node, r)})
            elif kind == "marker_sent":
                events.append({"event": "marker_sent", "node": node, "pos": r["lsn"], "dst": r["dst"],
                               "snapshot": r["snapshot_id"]})
            elif kind == "marker_recv":
                events.append({"event": "marker_received", "node": node, "pos": r["lsn"], "src": r["src"],
                               "snapshot": r["snapshot_id"]})
            elif kind == "cut":
                events.append({"event": "cut", "node": node, "pos": r["lsn"], "snapshot": r["snapshot_id"],
                               state: _value(app, node, r)})
    return events


def _value(app: Any, node: str, record: Mapping[str, Any]) -> Any:
    try:
        return app.value(record, f"{node}'s log, lsn {record.get('lsn')}")
    except wal.CorruptRecord as exc:
        raise LogReadError(str(exc)) from None
