"""kvshard: a sharded key-value store whose keys migrate between nodes by handoff messages.

Every key lives at exactly one node, or in exactly one handoff on a channel, mid-move.
A snapshot must find each key once: a cut that loses one key and doubles another
passes a count but fails "every key exactly once".

Commands (JSON objects, one per Submit; replies are JSON objects):
  {"op": "put", "key": K, "value": V}   create K (K1) or update it here; forwarded if it moved on (K4)
  {"op": "get", "key": K}               its value, if K is here
  {"op": "move", "key": K, "to": N}     hand K, with its value, to N (K3)
  {"op": "delete", "key": K}            delete K here (K5)
Queries (on_query, the Query RPC: a read, not logged): {"op": "get", "key": K}, answered as the command.
Messages (JSON): {"type": "handoff", "key", "value", "created_at"} and {"type": "update", "key", "value"}.

Rules
K1. A node creates keys in its own namespace only: names that start with its id and
    "/" ("p1/apple" is created at p1). It lists the names it created ("created"), and
    never creates one of them again: a name exists once in the cluster's history.
K2. A key is in one place: a node's "keys", or one handoff on one channel.
K3. move: the key leaves this node's "keys" in the same step that sends its handoff,
    and the node keeps a pointer (key -> destination). A handoff that arrives clears
    the receiver's pointer for that key.
K4. A put of a key this node moved away follows the pointer as an "update" message on
    the same channel as the handoff, so FIFO delivers it after the handoff, at every
    hop. An update that finds neither the key, nor a pointer, nor a tombstone means
    the channel reordered messages: the node stops (on_message raises).
K5. delete (at the key's node) removes the key and leaves a tombstone ("deleted"); an
    update that arrives for it later is dropped. The name is never created again (K1).
Invariant: the names created minus the names deleted appear exactly once each in the
states plus the handoffs in flight, and nothing else appears. The state is sorted JSON,
taken in parts (`snapshot_blocks`): its keys in ranges, so a change sends one range.

Rescale (`rescale(view, nodes)`, onto another node set; the channels start empty)
KR1. Every live key, at a node or in a handoff in flight, lands exactly once, at its
     home in the new set: the node with the highest sha256(node id, key) (rendezvous
     hashing, stable: a key whose home survives a rescale stays where it is).
KR2. The messages in flight are absorbed first: each arrives as on the old
     channels (round robin over the channels in name order, a forwarded update at
     its channel's end), so a handoff lands and an update reaches its key (K3-K5).
KR3. A name's history goes with its namespace: the names a node created and the
     tombstones of those names are held by the node whose id the name starts with
     when it is in the new set, else by the home (KR1) of that id, so every name is
     listed once, and a node added again never creates a name twice (K1).
KR4. The pointers of moved keys are dropped: every key is at its home.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Any

from snapmesh.app import App, Context, NodeInfo, Refused, View
from snapmesh.services.app import kvscan
from snapmesh.services.app.kvcheck import BUCKETS, every_key_exactly_once  # noqa: F401  (kvshard's, re-exported)
from snapmesh.services.app.kvranges import Ranges

MAX_KEY = 200  # characters in a key's name
RANGE_KEYS = 64  # keys in a range of the state's parts, on average (snapshot_blocks)


# json.dumps with these options builds an encoder at each call: a third of a key's encoding.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def encode(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


class KVShard:
    """One node of the store (rules K1-K5 above)."""

    def __init__(self, info: NodeInfo):
        self.me = info.node_id
        self.peers_out = info.peers_out
        self.keys: dict[str, dict[str, Any]] = {}  # key -> {"value", "created_at"}
        self.moved: dict[str, str] = {}  # key -> the node it was handed to (K3)
        self.created: set[str] = set()  # names this node created (K1)
        self.deleted: set[str] = set()  # names deleted here: tombstones (K5)
        # snapshot_blocks' encodings kept between snapshots: each method below that
        # changes a key touches it, one that changes the names or pointers drops theirs.
        self._ranges = Ranges(_ends_range, _entry)
        self._head: tuple[set[str], set[str], bytes] | None = None  # (created, deleted, their part)
        self._pointers: tuple[dict[str, str], bytes] | None = None  # (moved, its encoding)
        self._tail: tuple[bytes, bytes, bytes] | None = None  # (last range, pointers, the part they make)

    # ---- commands
    def on_command(self, command: bytes, ctx: Context) -> bytes:
        request, key = _request(command, ("put", "get", "move", "delete"))
        op = request["op"]
        if op == "put":
            if "value" not in request:
                ctx.refuse("INVALID_ARGUMENT", "put needs a value")
            return encode(self._put(key, request["value"], ctx))
        if op == "move":
            dst = request.get("to")
            if dst not in self.peers_out:
                ctx.refuse("INVALID_ARGUMENT", f"to must be a node {self.me} sends to: {', '.join(self.peers_out)}")
        entry = self._here(key)
        if op == "get":
            return encode({"key": key, "value": entry["value"], "at": self.me})
        if op == "move":
            ctx.send(dst, encode({"type": "handoff", "key": key, **entry}))
            del self.keys[key]
            self.moved[key] = dst
            self._ranges.touch(key)
            self._pointers = None
            return encode({"key": key, "moved_to": dst})
        del self.keys[key]
        self.deleted.add(key)
        self._ranges.touch(key)
        self._head = None
        return encode({"key": key, "deleted_at": self.me})

    def on_query(self, query: bytes) -> bytes:
        """A read, not logged (snapmesh.app A7): {"op": "get", "key": K}, answered as the command."""
        _, key = _request(query, ("get",))
        return encode({"key": key, "value": self._here(key)["value"], "at": self.me})

    def _here(self, key: str) -> dict[str, Any]:
        """The key's entry if it is here; otherwise the refusal that says where it went."""
        if key in self.keys:
            return self.keys[key]
        if key in self.moved:
            raise Refused("FAILED_PRECONDITION", f"key {key} is not at {self.me}: it was moved to {self.moved[key]}")
        if key in self.deleted:
            raise Refused("NOT_FOUND", f"key {key} was deleted at {self.me}")
        raise Refused("NOT_FOUND", f"key {key} is not at {self.me}")

    def _put(self, key: str, value: Any, ctx: Context) -> dict[str, Any]:
        if key in self.keys:
            self.keys[key]["value"] = value
            self._ranges.touch(key)
            return {"key": key, "updated_at": self.me}
        if key in self.moved:  # K4: after the handoff, on the same channel
            ctx.send(self.moved[key], encode({"type": "update", "key": key, "value": value}))
            return {"key": key, "forwarded_to": self.moved[key]}
        if key in self.deleted or key in self.created:
            ctx.refuse("FAILED_PRECONDITION", f"key {key} was deleted; a name is not created twice")
        if not key.startswith(self.me + "/"):
            ctx.refuse("FAILED_PRECONDITION", f"key {key} is not at {self.me}, which creates only keys named {self.me}/...")
        self.keys[key] = {"value": value, "created_at": self.me}
        self.created.add(key)
        self._ranges.touch(key)
        self._head = None
        return {"key": key, "created_at": self.me}

    # ---- messages
    def on_message(self, src: str, payload: bytes, ctx: Context) -> None:
        message = json.loads(payload)
        key = message["key"]
        if message["type"] == "handoff":
            if key in self.keys or key in self.deleted:
                raise ValueError(f"{self.me}: a handoff of {key} from {src}, which is already here or deleted here")
            self.keys[key] = {"value": message["value"], "created_at": message["created_at"]}
            self.moved.pop(key, None)
            self._ranges.touch(key)
            self._pointers = None
        elif message["type"] == "update":
            if key in self.keys:
                self.keys[key]["value"] = message["value"]
                self._ranges.touch(key)
            elif key in self.moved:
                ctx.send(self.moved[key], payload)
            elif key not in self.deleted:
                raise ValueError(f"{self.me}: an update of {key} from {src} before its handoff: the channel reordered")
        else:
            raise ValueError(f"{self.me}: unknown message type {message['type']!r} from {src}")

    # ---- state
    def snapshot(self) -> bytes:
        return encode({"keys": self.keys, "moved": self.moved,
                       "created": sorted(self.created), "deleted": sorted(self.deleted)})

    def snapshot_blocks(self) -> list[bytes]:
        """snapshot()'s bytes in parts (snapmesh/app A8), the keys in ranges: a range
        ends after a key whose name's CRC-32 is 0 modulo RANGE_KEYS, so its bounds
        are the keys' own, and a put, a move or a delete changes one range's part
        (the lists of names created and deleted are a part of their own, so a new
        name changes that one too). Each part is kept until a change touches it
        (kvranges.Ranges), the last one with the pointers too, the very same object
        while neither changed (so a node hashes it no more: cutnames.py CN1), so a
        snapshot's cost follows what changed, not the state: the bytes are those of
        snapshot(), which encodes afresh."""
        if self._head is None or self._head[0] is not self.created or self._head[1] is not self.deleted:
            self._head = (self.created, self.deleted, b'{"created":' + encode(sorted(self.created))
                          + b',"deleted":' + encode(sorted(self.deleted)) + b',"keys":{')
        if self._pointers is None or self._pointers[0] is not self.moved:
            self._pointers = (self.moved, encode(self.moved))
        ranges = self._ranges.encoded(self.keys)
        last, pointers = ranges[-1], self._pointers[1]
        if self._tail is None or self._tail[0] is not last or self._tail[1] is not pointers:
            self._tail = (last, pointers, last + b'},"moved":' + pointers + b"}")
        ranges[-1] = self._tail[2]
        return [self._head[2], *ranges]

    def restore(self, state: bytes) -> None:
        decoded = json.loads(state)
        self.keys, self.moved = decoded["keys"], decoded["moved"]
        self.created, self.deleted = set(decoded["created"]), set(decoded["deleted"])
        self._head = self._pointers = None  # and the ranges, of the new keys (kvranges R3)


def _ends_range(key: str) -> bool:
    """Whether a range of snapshot_blocks ends after `key`: its name's CRC-32 is 0 modulo RANGE_KEYS."""
    return zlib.crc32(key.encode()) % RANGE_KEYS == 0


def _entry(key: str, entry: dict[str, Any]) -> bytes:
    """`"key":{entry}`, as in the keys' object: that object of one key, without its braces (one call, not two)."""
    return _ENCODER.encode({key: entry}).encode()[1:-1]


def _request(data: bytes, ops: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    """A command's or query's JSON object and its key, or the refusal that says what is wrong."""
    try:
        request = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise Refused("INVALID_ARGUMENT", "a command is a JSON object, e.g. {\"op\": \"get\", \"key\": \"p1/a\"}") from None
    if not isinstance(request, dict) or request.get("op") not in ops:
        raise Refused("INVALID_ARGUMENT", f"op must be one of {', '.join(ops)}")
    key = request.get("key")
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
        raise Refused("INVALID_ARGUMENT", f"key must be a string of 1..{MAX_KEY} characters")
    return request, key


# ---- checks over a snapshot
def _decode(view: View) -> tuple[dict[str, dict], list[tuple[str, str, int, dict]]]:
    states = {node: json.loads(state) for node, state in view.states.items()}
    return states, [(src, dst, seq, json.loads(payload)) for src, dst, seq, payload in view.in_flight]


def places(view: View) -> dict[str, list[str]]:
    """Where each key is in the snapshot: its node, or the channel and seq of its handoff."""
    states, in_flight = _decode(view)
    found: dict[str, list[str]] = {}
    for node, state in sorted(states.items()):
        for key in state["keys"]:
            found.setdefault(key, []).append(f"at {node}")
    for src, dst, seq, message in in_flight:
        if message["type"] == "handoff":
            found.setdefault(message["key"], []).append(f"in flight {src}->{dst} seq {seq}")
    return found


def describe(view: View) -> dict[str, Any]:
    counts = {node: _counts(view, node) for node in sorted(view.states)}  # one state at a time, by name
    in_flight = [(src, dst, json.loads(payload)) for src, dst, _, payload in view.in_flight]
    handoffs = [f"{m['key']}: {src}->{dst}" for src, dst, m in in_flight if m["type"] == "handoff"]
    return {
        "keys_per_node": {node: count["keys"] for node, count in counts.items()},
        "keys_in_flight": len(handoffs),
        "handoffs_in_flight": handoffs[:20],
        "updates_in_flight": sum(1 for *_, m in in_flight if m["type"] == "update"),
        "created": sum(count["created"] for count in counts.values()),
        "deleted": sum(count["deleted"] for count in counts.values()),
    }


def _counts(view: View, node: str) -> Counter[str]:
    return Counter(part for part, _ in kvscan.names(view.states[node]))


def key_rows(view: View) -> list[dict[str, Any]]:
    """kv_keys: one row per place a key is found (a node, or a handoff in flight)."""
    return [{"snapshot_id": view.snapshot_id, "key": key, "place": place}
            for key, where in sorted(places(view).items()) for place in where]


def name_rows(view: View) -> list[dict[str, Any]]:
    """kv_names: one row per name created or deleted, and where."""
    states, _ = _decode(view)
    return [{"snapshot_id": view.snapshot_id, "key": name, "node": node, "event": event}
            for node, state in sorted(states.items()) for event in ("created", "deleted") for name in state[event]]


# A row per key seen other than once: lost (0), doubled (2+), or alive without being a live name.
KEYS_SEEN_ONCE = """
WITH expected AS (
  SELECT snapshot_id, key FROM kv_names GROUP BY snapshot_id, key
  HAVING SUM(CASE WHEN event = 'created' THEN 1 ELSE 0 END) = 1
     AND SUM(CASE WHEN event = 'deleted' THEN 1 ELSE 0 END) = 0),
seen AS (SELECT snapshot_id, key, COUNT(*) AS seen FROM kv_keys GROUP BY snapshot_id, key)
SELECT COALESCE(e.snapshot_id, s.snapshot_id) AS snapshot_id, COALESCE(e.key, s.key) AS key,
       COALESCE(s.seen, 0) AS seen, e.key IS NOT NULL AS live
FROM expected e FULL OUTER JOIN seen s ON e.snapshot_id = s.snapshot_id AND e.key = s.key
WHERE e.key IS NULL OR COALESCE(s.seen, 0) <> 1
"""


def home(key: str, nodes: Sequence[str]) -> str:
    """KR1: the node of `nodes` with the highest sha256(node, key) (rendezvous hashing)."""
    return max(nodes, key=lambda node: hashlib.sha256(f"{node}\0{key}".encode()).digest())


def drained(view: View) -> dict[str, KVShard]:
    """KR2: the cut's machines once every message in flight has arrived, round robin
    over the old channels in name order (a forwarded update joins its channel's end)."""
    old = sorted(view.states)
    machines = {}
    for node in old:
        others = tuple(n for n in old if n != node)
        machines[node] = KVShard(NodeInfo(node_id=node, peers_out=others, peers_in=others, params=view.params))
        machines[node].restore(view.states[node])
    queues: dict[tuple[str, str], deque[bytes]] = {}
    for src, dst, _, payload in view.in_flight:
        queues.setdefault((src, dst), deque()).append(payload)
    steps = 0
    while any(queues.values()):
        for (src, dst), queue in sorted(queues.items()):
            if queue:
                ctx = Context(dst, machines[dst].peers_out)
                machines[dst].on_message(src, queue.popleft(), ctx)
                for to, payload in ctx.sends:
                    queues.setdefault((dst, to), deque()).append(payload)
                steps += 1
        if steps > 10 * (len(view.in_flight) + 1) * (len(old) + 1):
            raise ValueError("the messages in flight do not settle: a key's pointers loop")
    return machines


def rescale(view: View, nodes: Sequence[NodeInfo]) -> dict[str, bytes]:
    """The new node set's states (KR1-KR4), every message in flight absorbed."""
    ids = [info.node_id for info in nodes]
    new = {node: {"keys": {}, "moved": {}, "created": [], "deleted": []} for node in ids}

    def keeper(name: str) -> str:  # KR3
        owner = name.split("/", 1)[0]
        return owner if owner in new else home(owner, ids)

    for _, machine in sorted(drained(view).items()):
        for key, entry in sorted(machine.keys.items()):
            new[home(key, ids)]["keys"][key] = entry
        for kind, names in (("created", machine.created), ("deleted", machine.deleted)):
            for name in sorted(names):
                new[keeper(name)][kind].append(name)
    for state in new.values():
        state["created"].sort()
        state["deleted"].sort()
    return {node: encode(state) for node, state in new.items()}


def workload(nodes: Sequence[NodeInfo], rng: Any) -> Iterator[tuple[str, bytes]]:
    """Creates, updates, reads, moves and deletes, from a guess of where each key is.

    The guess follows the commands as if each one went through; a command sent on a
    wrong guess (a handoff still in flight, a refused move) is refused, and counted.
    params "keys" bounds the live keys (default 100).
    """
    limit = int(nodes[0].params.get("keys", 100)) if nodes else 0
    made = dict.fromkeys((n.node_id for n in nodes), 0)
    out = {n.node_id: n.peers_out for n in nodes}
    owner: dict[str, str] = {}  # key -> the node we think holds it
    while nodes:
        roll = rng.random()
        if not owner or (roll < 0.3 and len(owner) < limit):
            node = rng.choice(nodes).node_id
            key = f"{node}/k{made[node]}"
            made[node] += 1
            owner[key] = node
            yield node, encode({"op": "put", "key": key, "value": rng.randrange(1000)})
            continue
        key = rng.choice(sorted(owner))
        at = owner[key] if rng.random() < 0.9 else rng.choice(nodes).node_id
        if roll < 0.5:
            yield at, encode({"op": "put", "key": key, "value": rng.randrange(1000)})
        elif roll < 0.6:
            yield at, encode({"op": "get", "key": key})
        elif roll < 0.9 and out[at]:
            owner[key] = rng.choice(out[at])
            yield at, encode({"op": "move", "key": key, "to": owner[key]})
        else:
            del owner[key]
            yield at, encode({"op": "delete", "key": key})


app = App(
    name="kvshard",
    new=KVShard,
    invariants={"every key exactly once": every_key_exactly_once},
    describe=describe,
    views={"kv_keys": key_rows, "kv_names": name_rows},
    sql_invariants={"every key exactly once": KEYS_SEEN_ONCE},
    workload=workload,
    rescale=rescale,
)
