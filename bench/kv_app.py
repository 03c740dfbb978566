"""kvshard holding about `mib` MiB of keys per node ([app] mib): `bench state`'s second subject.

services/app/kvshard's machine and app, unchanged but for the opening state:
each node holds keys `<node>/k<8 digits>` it created itself (K1), each a value of
VALUE_BYTES hex characters drawn from the key's name (no two alike, so no two
blocks are), as many as make its state (snapshot()) about `mib` MiB, to within a
key. Filling through Submit would first write every key to the node's log (4 GiB
at 1 GiB per node), which is not what the bench measures. The keys are made when
first used, as the blob app's bytes are: a restore, which makes a new machine and
then restores it, does not pay for the keys it replaces.

A key's update (`put`) gives it a value of the same length, so it changes the
blocks the key's entry falls in and no other (snapmesh/app A8: kvshard's parts
are its keys in ranges, each cut into blocks of 8 KiB).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from snapmesh.app import NodeInfo
from snapmesh.services.app import kvshard
from snapmesh.services.app.kvshard import KVShard, encode

MIB = 1024 * 1024
VALUE_BYTES = 1024  # a record of YCSB's default size (10 fields of 100 bytes), in round numbers


def key(node_id: str, i: int) -> str:
    return f"{node_id}/k{i:08d}"


def value(name: str) -> str:
    """A key's opening value: VALUE_BYTES hex characters drawn from its name."""
    return hashlib.shake_256(name.encode()).hexdigest(VALUE_BYTES // 2)


def key_count(node_id: str, params: Any) -> int:
    """The keys that make the node's state about `mib` MiB: each costs its entry
    in "keys" and its name in "created", with their commas."""
    name = encode(key(node_id, 0))
    entry = len(name) + 1 + len(encode({"created_at": node_id, "value": value("")})) + 1
    return max(1, round(float(params.get("mib", 1)) * MIB / (entry + len(name) + 1)))


def put(name: str, new_value: str) -> bytes:
    """The command that updates key `name` (a value of VALUE_BYTES characters keeps its length)."""
    return encode({"op": "put", "key": name, "value": new_value})


class FilledKV(KVShard):
    """A kvshard node whose keys and the names it created are filled on first use."""

    def __init__(self, info: NodeInfo) -> None:
        self._due: NodeInfo | None = None
        super().__init__(info)  # its empty keys and names, through the setters below
        self._due = info

    def _fill(self) -> None:
        if self._due is not None:
            info, self._due = self._due, None
            names = [key(info.node_id, i) for i in range(key_count(info.node_id, info.params))]
            self._keys = {name: {"value": value(name), "created_at": info.node_id} for name in names}
            self._created = set(names)

    @property
    def keys(self) -> dict[str, dict[str, Any]]:
        self._fill()
        return self._keys

    @keys.setter
    def keys(self, keys: dict[str, dict[str, Any]]) -> None:  # a restore's, which replaces the fill
        self._due = None
        self._keys = keys

    @property
    def created(self) -> set[str]:
        self._fill()
        return self._created

    @created.setter
    def created(self, created: set[str]) -> None:
        self._due = None
        self._created = created


app = dataclasses.replace(kvshard.app, new=FilledKV)
