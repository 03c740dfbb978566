"""A local cluster file for another node count (`snapmesh cluster rescale`), pure but for the ports it is given.

The controller keeps its entry (host, ports, data dir), so clients and its
journal stay put. The first N nodes of the file keep theirs (id, host, ports:
each keeps its data dir and its log, which ends in the stop snapshot); nodes
past N are removed; new nodes are named p1, p2, ... (the first ids not taken)
on the ports given. The new cluster is a full mesh (`channels` left out), the
topology the launcher writes for `--nodes N`. Every other key stays.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

MIN_NODES = 2  # a snapshot needs a channel


class RescaleError(ValueError):
    """A rescale the file cannot take: one line saying why."""


def rescaled(document: Mapping[str, Any], nodes: int, ports: Sequence[int]) -> dict[str, Any]:
    """`document` (a cluster file's TOML) for `nodes` nodes; `ports`: 2 per new node (port, metrics port)."""
    if nodes < MIN_NODES:
        raise RescaleError(f"--nodes must be at least {MIN_NODES} (a snapshot needs a channel), got {nodes}")
    old = list(document.get("nodes", []))
    kept = [dict(node) for node in old[:nodes]]
    added = nodes - len(kept)
    if len(ports) < 2 * added:
        raise RescaleError(f"{added} new nodes need {2 * added} ports, got {len(ports)}")
    host = kept[0].get("host", "127.0.0.1") if kept else "127.0.0.1"
    names = _new_ids({str(node["id"]) for node in old})
    for index in range(added):
        kept.append({"id": next(names), "host": host, "port": ports[2 * index], "metrics_port": ports[2 * index + 1]})
    out = {key: value for key, value in document.items() if key not in ("nodes", "channels")}
    out["nodes"] = kept
    return out


def added(document: Mapping[str, Any], nodes: int) -> int:
    """How many nodes a rescale of `document` to `nodes` adds."""
    return max(0, nodes - len(document.get("nodes", [])))


def _new_ids(taken: set[str]) -> Iterator[str]:
    index = 1
    while True:
        name = f"p{index}"
        if name not in taken:
            taken.add(name)
            yield name
        index += 1
