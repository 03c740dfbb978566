"""The fault campaign running an app (`snapmesh chaos --app kvshard`) instead of the bank.

What changes with an app, and only that (the faults, the schedule, recovery
timing and quiescence are the bank's):

- the load is the app's `workload` over the whole cluster, one command at a time
  through `Node.SubmitBatch` (snapmesh/load/generator.py, as `snapmesh app --app`),
  each retried under its request id while its node is down;
- the `retry` fault sends an app command (a move: a command with a send) under
  one request id before and after its node's SIGKILL: the same reply twice, the
  second replayed, and one command record in the logs;
- once the faults stop and every send is received, one more snapshot: settled,
  COMPLETE, its invariants holding;
- kvshard: a tally of the keys the client was told were created and deleted
  (`KeyTally`), held against that settled snapshot: no key lost, none doubled.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc

from snapmesh.services.app import kvshard
from snapmesh.load.background import BackgroundLoad
from snapmesh.load.generator import LoadGenerator
from snapmesh.services.app.drive import node_infos, snapshot_view
from snapmesh.settings.config import hosted
from snapmesh.v1 import snapmesh_pb2 as pb

SETTLED_TRIES = 10  # triggers until the settled snapshot is COMPLETE
GIVE_UP_S = 60.0  # a command whose node does not answer for this long: outcome unknown


@dataclass
class KeyTally:
    """kvshard's keys as the client knows them from the replies it got."""

    created: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)  # a create or delete never answered: either way is right

    def see(self, node: str, command: bytes, reply: bytes | None, status: str) -> None:
        request = json.loads(command)
        if reply is None:
            if status in _UNKNOWN and request.get("op") in ("put", "delete"):
                self.unknown.add(request["key"])
            return
        answer = json.loads(reply)
        if "created_at" in answer:
            self.created.add(answer["key"])
        elif "deleted_at" in answer:
            self.deleted.add(answer["key"])

    def against(self, snapshot: pb.Snapshot) -> dict[str, Any]:
        """The settled snapshot's keys against the tally: figures and the keys wrong."""
        view = snapshot_view(snapshot)
        found = kvshard.places(view)
        states = {node: json.loads(state) for node, state in view.states.items()}
        made = Counter(name for s in states.values() for name in s["created"])
        gone = {name for s in states.values() for name in s["deleted"]}
        expected = self.created - self.deleted
        lost = sorted(expected - set(found) - self.unknown)
        doubled = sorted(key for key, where in found.items() if len(where) > 1)
        stray = sorted(set(found) - expected - self.unknown)
        return {"created": len(self.created), "deleted": len(self.deleted), "live": len(expected),
                "found": len(found), "snapshot_created": len(made), "snapshot_live": len(set(made) - gone),
                "unknown": len(self.unknown), "lost": lost, "duplicated": doubled, "stray": stray}


_UNKNOWN = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"})  # given up, not refused


def load(campaign) -> BackgroundLoad:
    """The app's workload on every node of the campaign's cluster, dialled directly (past the proxies):
    one stream over the whole cluster, one command at a time, so the workload's guesses follow its commands."""
    backend, app = campaign.backend, campaign.app
    topology = backend.config.topology
    infos = node_infos(list(topology.nodes), topology.channels, hosted(backend.config).params)
    tally = campaign.outcome.keys = KeyTally() if app.name == kvshard.app.name else None
    generator = LoadGenerator(app, {n: backend.direct_address(n) for n in topology.nodes}, infos,
                              seed=campaign.o.seed, per_node=False, identity=backend.client_identity, timeout=10.0,
                              give_up_s=GIVE_UP_S, on_answer=tally.see if tally else None)
    return BackgroundLoad(generator, callers=1)


def _one_node(campaign, node: str, on_answer=None) -> BackgroundLoad:
    """A load that sends no stream of its own: the retry fault's commands, one by one, to `node`."""
    generator = LoadGenerator(campaign.app, {node: campaign.backend.direct_address(node)}, [],
                              seed=campaign.o.seed, identity=campaign.backend.client_identity, timeout=5.0,
                              give_up_s=30.0, on_answer=on_answer)
    return BackgroundLoad(generator, callers=0).start()


def retry_fault(campaign, fault) -> float:
    """A kvshard move under one request id, before and after its node's SIGKILL: one answer, one run."""
    (node,) = fault.nodes
    backend, outcome = campaign.backend, campaign.outcome
    if outcome.keys is None:
        return _retry_any(campaign, fault)
    driver = _one_node(campaign, node, outcome.keys.see)
    key, rid = f"{node}/chaos-retry-{fault.index}", f"chaos-{campaign.o.seed}-{fault.index}"
    to = backend.config.topology.outgoing(node)[0]
    try:
        made = driver.submit(node, kvshard.encode({"op": "put", "key": key, "value": fault.index}), f"{rid}-put")
        move = kvshard.encode({"op": "move", "key": key, "to": to})
        first = driver.submit(node, move, rid)
        repaired = campaign._fault_kill(fault)
        second = driver.submit(node, move, rid)
    finally:
        driver.stop()
    if made is None or first is None or second is None:
        outcome.problems.append(f"retry {rid} at {node}: no answer ({driver.stats.last_error})")
    elif (second.reply, second.replayed) != (first.reply, True):
        outcome.problems.append(f"retry {rid} at {node}: first reply {first.reply!r}, the retry's {second.reply!r} "
                                f"(replayed: {second.replayed})")
    else:
        outcome.retries.append((rid, "answered"))
    return repaired


def _retry_any(campaign, fault) -> float:
    """Any other app: the first command its workload makes for the node, before and after the kill."""
    (node,) = fault.nodes
    backend, outcome = campaign.backend, campaign.outcome
    topology = backend.config.topology
    infos = node_infos(list(topology.nodes), topology.channels, hosted(backend.config).params)
    command = next(c for n, c in campaign.app.workload(infos, random.Random(f"retry:{fault.index}")) if n == node)
    driver = _one_node(campaign, node)
    rid = f"chaos-{campaign.o.seed}-{fault.index}"
    try:
        first = driver.submit(node, command, rid)
        repaired = campaign._fault_kill(fault)
        second = driver.submit(node, command, rid)
    finally:
        driver.stop()
    if driver.stats.node(node).given_up:
        outcome.problems.append(f"retry {rid} at {node}: no answer ({driver.stats.last_error})")
    elif (first is None) != (second is None) or (first and (second.reply, second.replayed) != (first.reply, True)):
        outcome.problems.append(f"retry {rid} at {node}: answered {first} then {second}")
    else:
        outcome.retries.append((rid, "answered" if first else "refused"))
    return repaired


def settled_snapshot(campaign) -> pb.Snapshot | None:
    """Once faults stop and every send is received: a snapshot, retried until COMPLETE."""
    for _ in range(SETTLED_TRIES):
        snap = campaign._trigger(campaign.ids[0], during_faults=False, wait=True)
        if snap is not None and snap.status == pb.Snapshot.COMPLETE:
            return _whole(campaign, snap)
        time.sleep(1.0)
    campaign.outcome.problems.append(f"no COMPLETE snapshot once settled, in {SETTLED_TRIES} tries")
    return None


def _whole(campaign, snap: pb.Snapshot) -> pb.Snapshot:
    try:
        return campaign.controller.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snap.snapshot_id), timeout=10)
    except grpc.RpcError:
        return snap


def command_runs(logs: dict[str, list[dict]], request_ids: list[str]) -> dict[str, int]:
    """How many command records each request id has across the logs (a retry must not run it again)."""
    wanted = set(request_ids)
    runs = Counter(r["request_id"] for records in logs.values() for r in records  # a command, or a send carrying one
                   if (r.get("kind") == "command" or "command" in r) and r.get("request_id") in wanted)
    return {rid: runs.get(rid, 0) for rid in request_ids}
