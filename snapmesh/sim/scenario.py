"""Scenario files for the simulator: load, validate, and describe errors.

A scenario is JSON (the full format is in docs/scenarios.md)::

    {"nodes": {"A": 100, "B": 50},          initial balances, non-negative integers
     "channels": [["A", "B"], ["B", "A"]],  optional; default: every ordered pair
     "steps": [["send", "A", "B", 10], ["snapshot", "A", "s1"],
               ["deliver", "A", "B"], ["run"]]}

Everything that can be checked without running is checked here (shapes, types,
unknown nodes, channels the topology lacks, non-positive amounts, strong
connectivity). What depends on the run (an empty channel delivered, a transfer
the sender cannot afford) is checked by the simulator when it reaches the step.
Both raise `ScenarioError`, whose `where` names the field or the step.

Steps are numbered from 0: "step 4" is `steps[4]` in the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from snapmesh.protocol.topology import Channel, Topology, TopologyError, channel_name

TOP_LEVEL_KEYS = ("nodes", "channels", "steps")


class ScenarioError(ValueError):
    """The scenario is invalid. `where` names the place ("nodes", "channels[2]",
    'step 4 ["deliver","A","B"]'); `problem` says what is wrong; `step` is the step
    index when the problem is in a step."""

    def __init__(self, where: str, problem: str, *, step: int | None = None) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem
        self.step = step


# ------------------------------------------------------------------ steps


@dataclass(frozen=True, kw_only=True, slots=True)
class Send:
    src: str
    dst: str
    amount: int


@dataclass(frozen=True, kw_only=True, slots=True)
class StartSnapshot:
    node: str
    snapshot_id: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Deliver:
    src: str
    dst: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    pass


Step = Send | StartSnapshot | Deliver | Run

# kind -> (argument names, for the arity message)
_STEP_ARGS: dict[str, tuple[str, ...]] = {
    "send": ("SRC", "DST", "AMOUNT"),
    "snapshot": ("NODE", "ID"),
    "deliver": ("SRC", "DST"),
    "run": (),
}


@dataclass(frozen=True, slots=True)
class Scenario:
    topology: Topology
    balances: Mapping[str, int]  # initial, in topology order
    steps: tuple[Step, ...]
    raw_steps: tuple[Any, ...]  # as written in the file, for error messages

    def step_label(self, index: int) -> str:
        return step_label(index, self.raw_steps[index])


def step_label(index: int, raw: Any) -> str:
    """'step 4 ["deliver","A","B"]': the index and the step as written (compact JSON)."""
    try:
        shown = json.dumps(raw, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        shown = repr(raw)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"step {index} {shown}"


# ---------------------------------------------------------------- loading


def loads(text: str) -> Scenario:
    """Parse and validate a scenario from JSON text. Bad JSON raises ScenarioError
    with where="line L column C"."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}") from None
    except _DuplicateKey as exc:
        raise ScenarioError("JSON", f"key {exc.key!r} appears twice in one object") from None
    return from_dict(data)


def from_dict(data: Any) -> Scenario:
    """Validate an already-parsed scenario (e.g. one a test built in memory)."""
    if not isinstance(data, dict):
        raise ScenarioError("scenario", f"must be a JSON object, got {_kind(data)}")
    unknown = [key for key in data if key not in TOP_LEVEL_KEYS]
    if unknown:
        raise ScenarioError("scenario", f"unknown key {unknown[0]!r} (expected {', '.join(TOP_LEVEL_KEYS)})")
    for key in ("nodes", "steps"):
        if key not in data:
            raise ScenarioError("scenario", f"missing key {key!r}")

    balances = _parse_nodes(data["nodes"])
    channels = data.get("channels")
    if channels is not None and not isinstance(channels, list):
        raise ScenarioError("channels", f"must be a list of [src, dst] pairs, got {_kind(channels)}")
    try:
        topology = Topology.build(balances, channels)
    except TopologyError as exc:
        raise ScenarioError("channels" if channels is not None else "nodes", str(exc)) from None

    raw_steps = data["steps"]
    if not isinstance(raw_steps, list):
        raise ScenarioError("steps", f"must be a list, got {_kind(raw_steps)}")
    steps = tuple(_parse_step(i, raw, topology) for i, raw in enumerate(raw_steps))
    return Scenario(topology, balances, steps, tuple(raw_steps))


def _parse_nodes(nodes: Any) -> dict[str, int]:
    if not isinstance(nodes, dict):
        raise ScenarioError("nodes", f"must be an object of node id -> initial balance, got {_kind(nodes)}")
    if not nodes:
        raise ScenarioError("nodes", "needs at least one node")
    for node, balance in nodes.items():
        if not node:
            raise ScenarioError("nodes", "a node id is the empty string")
        if not _is_int(balance) or balance < 0:
            raise ScenarioError(
                f"nodes.{node}", f"initial balance must be a non-negative integer, got {json.dumps(balance)}"
            )
    return dict(nodes)


def _parse_step(index: int, raw: Any, topology: Topology) -> Step:
    def fail(problem: str) -> ScenarioError:
        return ScenarioError(step_label(index, raw), problem, step=index)

    if not isinstance(raw, list) or not raw or not isinstance(raw[0], str):
        raise fail('a step is a list that starts with its kind ("send", "snapshot", "deliver", "run")')
    kind, args = raw[0], raw[1:]
    if kind not in _STEP_ARGS:
        raise fail(f"unknown step {kind!r} (expected one of {', '.join(_STEP_ARGS)})")
    names = _STEP_ARGS[kind]
    if len(args) != len(names):
        raise fail(f"{kind!r} takes {len(names)} argument(s) ({' '.join(names) or 'none'}), got {len(args)}")

    def node(value: Any, role: str) -> str:
        if not isinstance(value, str):
            raise fail(f"{role} must be a node id (string), got {json.dumps(value)}")
        if value not in topology.nodes:
            raise fail(f"unknown node {value!r}")
        return value

    def channel(src_value: Any, dst_value: Any) -> Channel:
        pair = (node(src_value, "SRC"), node(dst_value, "DST"))
        if pair not in topology.channels:
            raise fail(f"the topology has no channel {channel_name(*pair)}")
        return pair

    if kind == "send":
        src, dst = channel(args[0], args[1])
        amount = args[2]
        if not _is_int(amount):
            raise fail(f"amount must be an integer, got {json.dumps(amount)}")
        if amount <= 0:
            raise fail(f"amount must be positive, got {amount}")
        return Send(src=src, dst=dst, amount=amount)
    if kind == "snapshot":
        who = node(args[0], "NODE")
        snapshot_id = args[1]
        if not isinstance(snapshot_id, str) or not snapshot_id:
            raise fail(f"snapshot ID must be a non-empty string, got {json.dumps(snapshot_id)}")
        return StartSnapshot(node=who, snapshot_id=snapshot_id)
    if kind == "deliver":
        src, dst = channel(args[0], args[1])
        return Deliver(src=src, dst=dst)
    return Run()


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
