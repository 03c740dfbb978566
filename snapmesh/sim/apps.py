"""The fault fuzzer's app (snapmesh.app; the bank is one, services/app/bank.py): its clients and its checks.

The node machines host the app (node rule N10); the world (sim/world.py) only
routes their effects. The app's part:

  clients   commands come from the app's `workload(nodes, rng)`, its rng drawn
            from the world's; each goes through `Node.submit` (some with a
            request_id, some retried) and is answered under the transfers' rule:
            once durable, unless a restore took it back (then retried)
  restore   a node's part is the controller machine's plan: the node's state and
            the in-flight payloads of the COMPLETE snapshot (snapmesh/protocol/appstate.py),
            which the checker holds to the parts the nodes reported (A3); in
            overtake mode a channel is completed from the sender's outbox at its
            cut (`channel_state`, snapmesh/protocol/overtake.py O3)

and the checker (sim/invariants.py) adds, in app mode:

  A1 per channel and epoch, each received payload is the one its sender logged
     at that seq (with S3: every message once, in order, none invented);
  A2 a COMPLETE snapshot: each node's state is the one its `cut` record's digest
     names, each in-flight payload is the one the sender logged at that seq (both
     by `snapmesh.checking.cut.check_snapshot` with `cut.Payloads`),
     `check_invariants(app, view)` is all empty, and the controller machine's
     verdict (its AppChecker) says the same;
  A3 a `restore` record holds the snapshot's recorded state for the node, and
     its `replay` records the recorded in-flight payloads (with R1);
  A4 one request_id, one `command` record (S6 for commands), and an answered
     command is the `command` record its answer names, with the reply given;
  A5 after quiescence the invariants hold over the final states, nothing in flight
     (and over the first states, before any step: an app whose start breaks them,
     e.g. two first holders of one token, is named at once);
  A6 (S2 for an app) a live node's app state is what its log says: the checker
     folds each log through machines of its own (`StateFold`: `init` a new one,
     each `command`, app `recv` and `replay` fed in, `restore` a fresh one
     holding the record's state), and a `checkpoint` holds the fold's state.
The framework carries no number of its own for an app (every log's tally is 0):
the bank's conservation is its app invariant "conserved", checked by A2 and A5.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from snapmesh.app import App, Context, NodeInfo, Refused, View, check_invariants, new_machine
from snapmesh.checking import cut
from snapmesh.protocol.node import core
from snapmesh.protocol import overtake, statedigest, wal
from snapmesh.v1 import snapmesh_pb2 as pb


class AppViolation(AssertionError):
    """An app-mode invariant broke (sim/invariants.py turns it into its Violation)."""


# -- a snapshot's channels, with payloads


def channel_state(reports: Mapping[str, core.FullState], src: str, dst: str) -> tuple[core.Transfer, ...]:
    """overtake.channel_state with the payloads: the outbox part keeps the bytes its entries hold."""
    recorded = reports[dst].channels.get(src, ())
    position = reports[dst].positions.get(src)
    if position is None:
        return tuple(recorded)
    outbox = reports[src].outbox.get(dst, ())
    payloads = {e.seq: e.payload for e in outbox}
    return tuple(overtake.merge(
        tuple(recorded), [e.seq for e in outbox], position,
        lambda seq: core.Transfer(msg_id=f"{src}:{dst}:{seq}", seq=seq, payload=payloads[seq]),
    ))


def in_flight_towards(reports: Mapping[str, core.FullState], dst: str) -> list[tuple[str, core.Transfer]]:
    """overtake.in_flight_towards with the payloads: what a restore delivers to `dst`, in order."""
    part = reports[dst]
    sources = dict.fromkeys([*part.channels, *part.positions])
    return [(src, t) for src in sources for t in channel_state(reports, src, dst)]


def restore_part(request: pb.RestoreStateRequest) -> tuple[list[tuple], dict[str, bytes]]:
    """A node's part of the controller's restore plan as `Node.restore` takes it:
    (in_flight, keywords); the items carry their payloads and the keywords the state."""
    in_flight = [(c.src, t.msg_id, t.seq, t.amount, t.payload) for c in request.channels for t in c.in_flight]
    return in_flight, {"state": request.state}


def view(
    snapshot_id: str, reports: Mapping[str, core.FullState], channels: Sequence[tuple[str, str]],
    params: Mapping[str, Any],
) -> View:
    in_flight = [
        (src, dst, t.seq, t.payload or b"") for src, dst in channels for t in channel_state(reports, src, dst)
    ]
    states = {node: part.state or b"" for node, part in reports.items()}
    return View(snapshot_id=snapshot_id, states=states, in_flight=in_flight, params=params)


# -- checks (A2, A5)


def upgraded(app: App, part: core.FullState) -> bytes:
    """A3: the state a restore into `app` gives a node whose part `part` recorded: an older
    version's through `app.upgrade` (snapmesh/protocol/upgrade.py U3), else as recorded."""
    state = part.state or b""
    if app.upgrade is not None and 0 < (part.version or 1) < app.version:
        return app.upgrade(state, part.version or 1)
    return state


def check_view(app: App, where: str, snapshot: View) -> None:
    broken = {name: problems for name, problems in check_invariants(app, snapshot).items() if problems}
    for name, problems in broken.items():
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise AppViolation(f"{where}: app {app.name!r} invariant {name!r}: {'; '.join(problems[:3])}{more}")


def check_complete(
    app: App, snapshot_id: str, reports: Mapping[str, core.FullState], channels: Sequence[tuple[str, str]],
    params: Mapping[str, Any], logs: Mapping[str, Sequence[wal.Record]],
) -> None:
    """A2. `logs`: each node's log in the snapshot's epoch. The states and the in-flight
    payloads against them by `cut.check_snapshot` (the one definition) with an app's
    reading, `cut.Payloads`; then the app's invariants."""
    recorded = {(src, dst): channel_state(reports, src, dst) for src, dst in channels}
    snapshot = cut.Snapshot(
        snapshot_id,
        nodes=[(node, None if part.state is None else _recorded(part.state)) for node, part in reports.items()],
        channels=[
            (src, dst, [(t.msg_id, None if t.payload is None else wal.pack(t.payload), t.seq) for t in items])
            for (src, dst), items in recorded.items()
        ],
    )
    index = cut.LogIndex.of(logs, [snapshot_id], reading=cut.Payloads())
    verdict = cut.check_snapshot(index, snapshot, topology=channels)
    for rule, args in verdict.problems:
        if rule == cut.STATE:
            node, _, logged = args
            raise AppViolation(
                f"snapshot {snapshot_id}: {node} reported a state whose digest is not its cut record's ({logged!r})"
            )
        if rule == cut.IN_FLIGHT_CONTENT:
            src, dst, msg_id, _, logged = args
            t = next(t for t in recorded[(src, dst)] if t.msg_id == msg_id)
            raise AppViolation(
                f"snapshot {snapshot_id}: {src}->{dst} seq {t.seq} recorded payload {t.payload!r},"
                f" the sender logged {logged!r}"
            )
        if rule in cut.IN_FLIGHT_RULES or rule == cut.MISSING_CHANNEL:
            src, dst = args[:2]
            expected = [seq for _, _, seq in verdict.expected.get((src, dst), [])]
            raise AppViolation(f"snapshot {snapshot_id}: {src}->{dst} recorded seqs"
                               f" {[t.seq for t in recorded.get((src, dst), ())]}, the logs say {expected}")
        raise AppViolation(f"snapshot {snapshot_id}: {rule} {args}")
    check_view(app, f"snapshot {snapshot_id}", view(snapshot_id, reports, channels, params))


def agrees(snapshot: pb.Snapshot) -> None:
    """The controller machine judged a COMPLETE snapshot the checker found whole (A2): checked, all ok."""
    verdict = snapshot.app
    failed = [r.name for r in verdict.invariants if not r.ok]
    if verdict.status != pb.AppCheck.CHECKED or failed or not verdict.invariants:
        raise AppViolation(
            f"snapshot {snapshot.snapshot_id}: the controller says {pb.AppCheck.Status.Name(verdict.status)},"
            f" failed {failed}, reason {snapshot.reason!r}; the checker found every invariant holds"
        )


def check_quiescent(app: App, states: Mapping[str, bytes], params: Mapping[str, Any], where: str = "quiescent") -> None:
    """A5: the final states, nothing in flight (Q1 checked that); the first states too (`where`)."""
    check_view(app, where, View(snapshot_id=where, states=dict(states), in_flight=[], params=params))


# -- the log's app state (A6)


class StateFold:
    """Each node's app state as its log says (A6), by machines of the checker's own."""

    def __init__(self, app: App, infos: Mapping[str, NodeInfo], versions: Mapping[int, App] | None = None) -> None:
        self.app, self.infos = app, infos
        self.versions = dict(versions or {app.version: app})  # the code of each version a log may name
        self.code: dict[str, App] = {}  # node -> the app its log names now (init, version records)
        self.stopped: set[str] = set()  # nodes whose log ends in a stop: a restart gives a fresh machine
        self.machines: dict[str, Any] = {}
        self.applied: dict[str, int] = {}  # node -> records folded
        self.checked: dict[str, int] = {}  # node -> records folded when its state was last compared

    def apply(self, node: str, record: wal.Record) -> None:
        self.applied[node] = self.applied.get(node, 0) + 1
        kind = type(record)
        if kind is wal.Init or kind is wal.AppVersion:
            self.code[node] = self.versions.get(record.version or 1, self.app)  # type: ignore[attr-defined]
            self.machines[node] = new_machine(self.code[node], self.infos[node])
        elif kind is wal.Stop:
            self.stopped.add(node)
        elif kind is wal.Restart and node in self.stopped:  # recovery: nothing replays before the stop
            self.machines[node] = new_machine(self.code.get(node, self.app), self.infos[node])
        elif kind is wal.Restore:
            self.stopped.discard(node)
            machine = self.machines[node] = new_machine(self.code.get(node, self.app), self.infos[node])
            machine.restore(wal.unpack(record.state, f"{node} lsn {record.lsn}"))  # type: ignore[attr-defined]
        elif (command := wal.step_command(record)) is not None:  # a `command`, or a step's first send carrying it
            ctx = Context(node, self.infos[node].peers_out)
            try:
                reply = self.machines[node].on_command(wal.unpack(command.command, node), ctx)
            except Refused as exc:
                raise AppViolation(f"{node}: lsn {record.lsn} logs a command its log's state refuses: {exc}") from None
            if wal.pack(reply or b"") != command.reply:
                raise AppViolation(f"{node}: lsn {record.lsn} logs reply {command.reply!r}, its log's state replies {reply!r}")
        elif kind is wal.Recv or kind is wal.Replay:
            ctx = Context(node, self.infos[node].peers_out)
            self.machines[node].on_message(record.src, wal.unpack(record.payload, node), ctx)  # type: ignore[attr-defined]
        elif kind is wal.Checkpoint and record.state != wal.pack(self.state(node)):  # type: ignore[attr-defined]
            raise AppViolation(f"{node}: the checkpoint at lsn {record.lsn} holds another app state than its log's")

    def state(self, node: str) -> bytes:
        return self.machines[node].snapshot()


def check_states(fold: StateFold, live: Mapping[str, Any]) -> None:
    """A6 after a step: every live node's app state is its log's (compared when its log grew:
    a step that changes the state logs a record; a restart logs one too)."""
    for node_id, node in live.items():
        if fold.checked.get(node_id) == fold.applied.get(node_id):
            continue
        fold.checked[node_id] = fold.applied.get(node_id, 0)
        if node.app_state() != fold.state(node_id):
            raise AppViolation(
                f"{node_id}: app state in memory {node.app_state()[:200]!r}, its log says {fold.state(node_id)[:200]!r}"
            )


# -- clients


def infos(ids: Sequence[str], channels: Sequence[tuple[str, str]], params: Mapping[str, Any]) -> dict[str, NodeInfo]:
    """What each node's app is told of its place (as the node machine's Host tells it)."""
    return {
        i: NodeInfo(
            node_id=i, peers_out=tuple(d for s, d in channels if s == i), peers_in=tuple(s for s, d in channels if d == i),
            params=params,
        )
        for i in ids
    }


def commands(app: App, nodes: Sequence[NodeInfo], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """The app's endless workload over this cluster; `rng` its only randomness."""
    if app.workload is None:
        raise ValueError(f"app {app.name!r} has no workload: the fuzzer has no commands to send")
    return iter(app.workload(list(nodes), rng))


def _recorded(state: bytes) -> str:
    """`state`'s digest as a node's cut record holds it (statedigest.py SD3, SD4)."""
    return statedigest.record_text(statedigest.canonical(state))
