"""Reading a data dir's transfer logs for `snapmesh trace`: every node's
records in lsn order (sealed segments too, a torn last line skipped), by the
one log reader, `snapmesh.checking.node_logs`. Kinds are not checked here: the trace
ignores the ones it does not know.
"""

from __future__ import annotations

from pathlib import Path

from snapmesh.checking.node_logs import LogReadError as LogError
from snapmesh.checking.node_logs import log_nodes, read_logs

__all__ = ["LogError", "read_data_dir"]


def read_data_dir(data_dir: str | Path) -> dict[str, list[dict]]:
    """node -> records in lsn order, for every node with a log in `data_dir`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise LogError(f"{data_dir}: no such directory")
    nodes = log_nodes(data_dir)
    if not nodes:
        raise LogError(f"{data_dir}: no transfer logs (<node>.log.jsonl)")
    return read_logs(data_dir, nodes)
