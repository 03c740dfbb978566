"""A node's log files' names: its active segment's and its sealed ones' (the format: wal.py)."""

from __future__ import annotations

import re

ACTIVE_SUFFIX = ".log.jsonl"
_SEALED = re.compile(r"^(?P<node>.+)\.log\.(?P<first>\d{12})\.jsonl$")


def active_name(node_id: str) -> str:
    return f"{node_id}{ACTIVE_SUFFIX}"


def sealed_name(node_id: str, first_lsn: int) -> str:
    return f"{node_id}.log.{first_lsn:012d}.jsonl"


def sealed_first_lsn(name: str, node_id: str) -> int | None:
    """The first lsn of a sealed segment of `node_id` named `name`, else None."""
    match = _SEALED.match(name)
    if match is None or match["node"] != node_id:
        return None
    return int(match["first"])


def log_file_node(name: str) -> str | None:
    """The node whose log file (active or sealed segment) is named `name`, else None."""
    match = _SEALED.match(name)
    if match is not None:
        return match["node"]
    return name[: -len(ACTIVE_SUFFIX)] if name.endswith(ACTIVE_SUFFIX) and len(name) > len(ACTIVE_SUFFIX) else None


def segment_order(names: list[str], node_id: str) -> list[str]:
    """Of the file names in a data dir, `node_id`'s segments in lsn order: the
    sealed ones by first lsn, then the active one (if present)."""
    sealed = sorted((first, name) for name in names if (first := sealed_first_lsn(name, node_id)) is not None)
    active = [active_name(node_id)] if active_name(node_id) in names else []
    return [name for _, name in sealed] + active
