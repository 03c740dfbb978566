"""The fault fuzzer's judge: what must hold, read from the logs, apart from the code under test.

The checker sees only what a node appended to its log (every record, in
order), which of those records a crash left on disk, what the controller
decided, what clients were told, and each live node's balance and open
recordings. It keeps its own fold of the logs; it never calls the recovery,
link or node code it judges.

After every step:
  S1 conservation: the balances the logs give + every transfer logged as sent
     and not yet logged as received (on links and in outboxes) = the total;
  S2 a live node's balance is what its log says;
  S3 per channel, the receiver logs seqs 1, 2, 3, ... each once, each one a
     message the sender logged (nothing applied twice, nothing invented);
  S4 lsns are 1, 2, 3, ... per node; a checkpoint's balance is the log's;
  S5 no recording outlives the node's ttl;
  S6 one request_id, one send record; except that a restore takes back the
     ids a node paid after the restored snapshot's cut there, and one of them
     may then be paid once more (snapmesh/protocol/node/requests.py W4);
  S7 no `cut` for a snapshot after the node logged an `abort` for it (no zombie).
When the controller marks a snapshot COMPLETE, `snapmesh.checking.cut.check_snapshot`
(the one definition of a snapshot consistent with the logs):
  C1 every node's recorded balance is its log's balance at its cut;
  C2 every channel's recorded transfers are exactly the sends before the
     sender's cut not received before the receiver's cut;
  C3 the snapshot conserves the total.
Across restores, everything above is per epoch: a node's `restore`
record starts its new epoch (channels keyed by the epoch they were used in);
S1 is checked whenever every node is in the same epoch and no restore is cut
short (a crash between its `restore` and its last `replay` holds money until the
node does it again; the `restore` record sets the balance, so redoing it is safe), C1-C2 against the
log of the snapshot's epoch, and
  R1 a `restore` record holds the restored snapshot's recorded balance for the
     node, and the `replay` records after it are exactly the transfers the
     snapshot recorded in flight towards it, in channel order.
After quiescence (faults stopped, everything healed and delivered):
  Q1 every transfer logged as sent is received exactly once; outboxes empty;
  Q2 every snapshot ended COMPLETE or FAILED; no recording left anywhere;
  Q3 every transfer a client was told about is in its sender's log.
With an app (`app`): A1-A5 of snapmesh/sim/apps.py besides (payloads, the
state digests, the app's invariants on every COMPLETE snapshot and at the end,
the commands' request ids and replies).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from snapmesh.checking import cut
from snapmesh.protocol.node import core
import snapmesh.bank.cut as bank_cut
from snapmesh.protocol import overtake, wal
from snapmesh.sim import apps


class Violation(AssertionError):
    """An invariant does not hold; the message says which and where."""


class Checker:
    def __init__(
        self, balances: Mapping[str, int], channels: Iterable[tuple[str, str]], ttl: float, *,
        app: Any = None, app_params: Mapping[str, Any] | None = None,
    ) -> None:
        self.app, self.app_params = app, dict(app_params or {})  # a snapmesh.app.App: A1-A6 too
        self.versions = {app.version: app} if app is not None else {}  # the code of each version the logs hold
        self.total = sum(balances.values())
        self.initial = dict(balances)
        self.channels = list(channels)
        self.infos = apps.infos(list(balances), self.channels, self.app_params)  # what each node's app is told
        self.ttl = ttl
        self.logs: dict[str, list[wal.Record]] = {n: [] for n in balances}
        self.recorded_at: dict[tuple[str, str], float] = {}
        self.replied: dict[str, str] = {}  # msg_id -> node
        # (node, request_id) -> (msg_id, lsn of its send record) (rebuilt by _refold)
        self.requests: dict[tuple[str, str], tuple[str, int]] = {}
        self.cuts: dict[tuple[str, str], int] = {}  # (node, snapshot id) -> lsn of its cut
        self.taken_back: dict[tuple[str, str], str] = {}  # (node, request_id) -> msg_id a restore took back
        self.complete: dict[str, Mapping[str, core.FullState]] = {}  # COMPLETE snapshots' reports (R1)
        self._refold()

    # -- what happened

    def appended(self, node: str, record: wal.Record, now: float) -> None:
        log = self.logs[node]
        expected = log[-1].lsn + 1 if log else 1
        if record.lsn != expected:
            raise Violation(f"{node}: lsn {record.lsn} appended after {expected - 1}")
        log.append(record)
        kind = type(record)
        if self.fold is not None:
            self.fold.apply(node, record)
        if kind is wal.Send:
            self._fold_send(node, record)  # type: ignore[arg-type]
            rid = record.request_id  # type: ignore[attr-defined]
            if rid:
                if (node, rid) in self.requests:
                    first = self.requests[(node, rid)][0]
                    raise Violation(f"{node}: request_id {rid!r} paid twice ({first}, {record.msg_id})")  # type: ignore[attr-defined]
                self.requests[(node, rid)] = (record.msg_id, record.lsn)  # type: ignore[attr-defined]
                self.taken_back.pop((node, rid), None)
        elif kind is wal.Command and record.request_id:  # type: ignore[attr-defined]
            rid = record.request_id  # type: ignore[attr-defined]
            if (node, rid) in self.requests:  # A4: S6 for commands
                raise Violation(f"{node}: request_id {rid!r} run twice (lsn {self.requests[(node, rid)][1]}, {record.lsn})")
            self.requests[(node, rid)] = (record.reply, record.lsn)  # type: ignore[attr-defined]
            self.taken_back.pop((node, rid), None)
        elif kind is wal.Recv or kind is wal.MarkerRecv:
            self._fold_recv(node, record)
        elif kind is wal.Init:
            self.balance[node] = record.tally  # type: ignore[attr-defined]
        elif kind is wal.Cut:
            sid = record.snapshot_id  # type: ignore[attr-defined]
            if (node, sid) in self.aborted:
                raise Violation(f"{node}: a zombie recording: cut for {sid} at lsn {record.lsn} after its abort")
            self.recorded_at[(node, sid)] = now
            self.cuts[(node, sid)] = record.lsn
        elif kind is wal.Stop:  # a node a rescale started has no cut: nothing it ran comes after its stop
            self.cuts.setdefault((node, record.snapshot_id), record.lsn)  # type: ignore[attr-defined]
        elif kind is wal.Abort:
            self.aborted.add((node, record.snapshot_id))  # type: ignore[attr-defined]
        elif kind is wal.Checkpoint and record.tally != self.balance[node]:  # type: ignore[attr-defined]
            said = record.tally  # type: ignore[attr-defined]
            raise Violation(f"{node}: checkpoint at lsn {record.lsn} says balance {said}, the log says {self.balance[node]}")
        elif kind is wal.MarkerSent:
            self._sent(node, record.dst)[record.seq] = (0, "")  # type: ignore[attr-defined]
        elif kind is wal.Restore or kind is wal.Replay:
            self._fold_restore(node, record, check=True)
            if kind is wal.Restore:
                self._take_back(node, record.snapshot_id)  # type: ignore[attr-defined]

    def new_code(self, app: Any) -> None:
        """The cluster runs another version of the app from now on (the version steps):
        its checks use it, and the logs' older records their own version's code."""
        self.app = app
        self.versions[app.version] = app
        if self.fold is not None:
            self.fold.app = app
            self.fold.versions[app.version] = app

    def crashed(self, node: str, durable_lsn: int) -> None:
        """`node` crashed; its log on disk ends at `durable_lsn`."""
        del self.logs[node][durable_lsn:]
        self._refold()

    def replied_transfer(self, node: str, msg_id: str, request_id: str) -> None:
        self.replied[msg_id] = node
        first = self.requests.get((node, request_id), (msg_id, 0))[0]
        if request_id and first != msg_id:
            raise Violation(f"{node}: request_id {request_id!r} answered {msg_id}, first paid as {first}")
        if request_id and (node, request_id) not in self.requests and self.taken_back.get((node, request_id)) == msg_id:
            raise Violation(f"{node}: request_id {request_id!r} answered as paid ({msg_id}) after a restore took it back")

    def replied_command(self, node: str, lsn: int, reply: str, request_id: str) -> None:
        """A4: an answered command (`lsn` its answer's, `reply` base64) is the `command`
        record before the sends of its step (and a checkpoint, if the step sealed a
        segment), with that reply and request id."""
        log = self.logs[node]
        at = lsn - 1
        while at >= 0 and type(log[at]) in (wal.Send, wal.Checkpoint):
            at -= 1
        record = log[at] if at >= 0 else None
        if type(record) is not wal.Command or (record.reply, record.request_id) != (reply, request_id):
            raise Violation(f"{node}: command {request_id!r} answered {reply!r} (lsn {lsn}); its log holds {record}")
        first = self.requests.get((node, request_id))
        if request_id and first is not None and first[0] != reply:
            raise Violation(f"{node}: request_id {request_id!r} answered {reply!r}, first run replied {first[0]!r}")
        if request_id and first is None and (node, request_id) in self.taken_back:
            raise Violation(f"{node}: request_id {request_id!r} answered (lsn {lsn}) after a restore took its run back")

    def _take_back(self, node: str, snapshot_id: str) -> None:
        """A restore of `snapshot_id` at `node`: the ids it paid after its cut are forgotten."""
        cut = self.cuts.get((node, snapshot_id))
        if cut is None:
            raise Violation(f"{node}: restored {snapshot_id} without a cut for it in its log")
        for key in [k for k, (_, lsn) in self.requests.items() if k[0] == node and lsn > cut]:
            self.taken_back[key] = self.requests.pop(key)[0]

    # -- the fold (S1, S3)

    def _refold(self) -> None:
        self.balance = dict(self.initial)
        # (src, dst, epoch) -> {seq: (amount, msg_id)} and the last seq received, per epoch
        self.sent: defaultdict[tuple[str, str, int], dict[int, tuple[int, str]]] = defaultdict(dict)
        self.received_upto: defaultdict[tuple[str, str, int], int] = defaultdict(int)
        self.payloads: defaultdict[tuple[str, str, int], dict[int, str]] = defaultdict(dict)  # A1, app mode only
        self.epoch = dict.fromkeys(self.initial, 1)
        self._replays: dict[str, list] = {}  # node -> the replays its last restore still owes (R1)
        # node -> replays its last restore announced and has not logged yet: a restore
        # cut short by a crash holds part of the money until the node does it again.
        self._unreplayed: dict[str, int] = defaultdict(int)
        self.requests = {}
        self.cuts = {}
        self.taken_back = {}
        self.aborted: set[tuple[str, str]] = set()
        self.fold = apps.StateFold(self.app, self.infos, self.versions) if self.app is not None else None  # A6
        for node, log in self.logs.items():
            for record in log:
                if self.fold is not None:
                    self.fold.apply(node, record)
                if type(record) is wal.Abort:
                    self.aborted.add((node, record.snapshot_id))
                if type(record) is wal.Cut:
                    self.cuts[(node, record.snapshot_id)] = record.lsn
                elif type(record) is wal.Stop:  # a node a rescale started: its log is an init and the stop
                    self.cuts.setdefault((node, record.snapshot_id), record.lsn)
                if type(record) is wal.Send:
                    self._fold_send(node, record)
                    if record.request_id:
                        self.requests[(node, record.request_id)] = (record.msg_id, record.lsn)
                elif type(record) is wal.Command and record.request_id:
                    self.requests[(node, record.request_id)] = (record.reply, record.lsn)
                elif type(record) is wal.MarkerSent:
                    self._sent(node, record.dst)[record.seq] = (0, "")
                elif type(record) is wal.Init:
                    self.balance[node] = record.tally
                elif type(record) is wal.Restore or type(record) is wal.Replay:
                    self._fold_restore(node, record, check=False)
                    if type(record) is wal.Restore:
                        self._take_back(node, record.snapshot_id)
        for node, log in self.logs.items():
            epoch = 1
            last_restore = max((i for i, r in enumerate(log) if type(r) is wal.Restore), default=-1)
            for index, record in enumerate(log):
                if type(record) is wal.Restore:
                    epoch = record.epoch
                elif type(record) is wal.Recv or type(record) is wal.MarkerRecv:
                    # a receive before the node's last restore is in a balance that restore replaced
                    self._fold_recv(node, record, epoch, credit=index > last_restore)

    def _sent(self, node: str, dst: str) -> dict[int, tuple[int, str]]:
        return self.sent[(node, dst, self.epoch[node])]

    @property
    def in_flight(self) -> int:
        """Sent and not received, on every channel of the epoch all nodes are in (None when mixed)."""
        epochs = set(self.epoch.values())
        if len(epochs) != 1:
            return 0
        (e,) = epochs
        return sum(
            amount for (s, d) in self.channels for seq, (amount, _) in self.sent[(s, d, e)].items()
            if seq > self.received_upto[(s, d, e)]
        )

    def _fold_restore(self, node: str, record: wal.Restore | wal.Replay, *, check: bool) -> None:
        """A restore starts the node's new epoch: its balance is set, then each replay adds (R1)."""
        if type(record) is wal.Restore:
            self.epoch[node] = record.epoch
            self.balance[node] = record.tally
            self._unreplayed[node] = record.deliveries
            reports = self.complete.get(record.snapshot_id)
            if check and reports is not None:
                part = reports[node]
                if part.tally != record.tally:
                    raise Violation(
                        f"{node}: restored {record.snapshot_id} with balance {record.tally}, recorded {part.tally}"
                    )
                if self.app is None:
                    self._replays[node] = [(src, t.msg_id, t.tally) for src, t in overtake.in_flight_towards(reports, node)]
                else:  # A3: the state and the payloads too
                    if record.state != wal.pack(apps.upgraded(self.app, part)):
                        raise Violation(f"{node}: restored {record.snapshot_id} with another app state than it recorded")
                    self._replays[node] = [
                        (src, t.msg_id, t.tally, wal.pack(t.payload or b"")) for src, t in apps.in_flight_towards(reports, node)
                    ]
                if len(self._replays[node]) != record.deliveries:
                    raise Violation(
                        f"{node}: restore announces {record.deliveries} replays, the snapshot holds {self._replays[node]}"
                    )
            return
        self.balance[node] += record.tally
        self._unreplayed[node] -= 1
        owed = self._replays.get(node)
        if check and owed is not None:
            got = (record.src, record.msg_id, record.tally) + ((record.payload,) if self.app is not None else ())
            if not owed or owed[0] != got:
                raise Violation(f"{node}: replayed {record.msg_id} ({record.tally}) from {record.src}, expected {owed[:1]}")
            owed.pop(0)

    def _fold_send(self, node: str, record: wal.Send) -> None:
        self.balance[node] -= record.tally
        self._sent(node, record.dst)[record.seq] = (record.tally, record.msg_id)
        if self.app is not None:
            self.payloads[(node, record.dst, self.epoch[node])][record.seq] = record.payload

    def _fold_recv(
        self, node: str, record: wal.Recv | wal.MarkerRecv, epoch: int | None = None, *, credit: bool = True
    ) -> None:
        epoch = self.epoch[node] if epoch is None else epoch
        channel = (record.src, node, epoch)
        upto = self.received_upto[channel]
        if record.seq != upto + 1:
            what = "applied twice" if record.seq <= upto else "a gap"
            raise Violation(f"{node}: logged seq {record.seq} on {record.src}->{node} after {upto} ({what})")
        sent = self.sent[channel].get(record.seq)
        amount = record.tally if type(record) is wal.Recv else 0
        if sent is None or sent[0] != amount:
            raise Violation(f"{node}: received seq {record.seq} on {record.src}->{node}, the sender logged {sent}")
        if self.app is not None and type(record) is wal.Recv and self.payloads[channel].get(record.seq) != record.payload:
            logged = self.payloads[channel].get(record.seq)
            raise Violation(f"{node}: received {record.payload!r} as seq {record.seq} from {record.src}, sent as {logged!r}")
        self.received_upto[channel] = record.seq
        if amount and credit:
            self.balance[node] += amount

    # -- after every step

    def check_step(self, live: Mapping[str, object], now: float) -> None:
        """`live`: node id -> its Node machine, for nodes that are up."""
        settled = len(set(self.epoch.values())) == 1 and not any(self._unreplayed.values())
        if settled and sum(self.balance.values()) + self.in_flight != self.total:
            raise Violation(
                f"conservation: balances {self.balance} + in flight {self.in_flight} != total {self.total}"
            )
        if self.fold is not None:
            apps.check_states(self.fold, live)
        for node_id, node in live.items():
            if node.tally != self.balance[node_id]:  # type: ignore[attr-defined]
                raise Violation(f"{node_id}: balance {node.tally} in memory, its log says {self.balance[node_id]}")  # type: ignore[attr-defined]
            for sid in node.process.in_progress():  # type: ignore[attr-defined]
                at = self.recorded_at.get((node_id, sid))
                if at is None:
                    raise Violation(f"{node_id}: recording {sid} with no cut in its log")
                if now - at >= self.ttl:
                    raise Violation(f"{node_id}: recording {sid} from t={at:g} still open at t={now:g} (ttl {self.ttl:g})")

    # -- a COMPLETE snapshot (C1-C3)

    def check_complete(self, snapshot_id: str, reports: Mapping[str, core.FullState], epoch: int = 1) -> None:
        """C1-C3: the snapshot against the log of its epoch, by `cut.check_snapshot`
        (the one definition the real-log checker and the reconcilers use)."""
        self.complete[snapshot_id] = reports
        bank = bank_cut.Reading(self.total)
        index = cut.LogIndex.of(cut.epoch_logs(self.logs, epoch, bank), snapshot_ids=[snapshot_id], reading=bank)
        channels = {
            (src, dst): [(t.msg_id, t.tally, t.seq) for t in overtake.channel_state(reports, src, dst)]
            for src, dst in self.channels
        }
        snapshot = cut.Snapshot(
            snapshot_id,
            nodes=[(node, state.tally) for node, state in reports.items()],
            channels=[(src, dst, items) for (src, dst), items in channels.items()],
        )
        verdict = cut.check_snapshot(index, snapshot, topology=self.channels)
        problems, node_rules = verdict.problems, cut.NODE_RULES + bank.node_rules
        for node, state in reports.items():
            if any(p.rule in node_rules and p.args[0] == node for p in problems):
                at_cut = index.cut(snapshot_id, node)
                logged = bank.state(node, at_cut) if at_cut is not None else None
                raise Violation(f"snapshot {snapshot_id}: {node} recorded {state.tally}, its log says {logged} at its cut")
        if problems and problems[0].rule in node_rules:
            raise Violation(f"snapshot {snapshot_id}: COMPLETE but {problems[0].rule} for {problems[0].args[0]}")
        for src, dst in self.channels:
            if any(p.args[:2] == (src, dst) and p.rule not in node_rules for p in problems):
                expected = [seq for _, _, seq in verdict.expected.get((src, dst), [])]
                raise Violation(
                    f"snapshot {snapshot_id}: {src}->{dst} recorded seqs {[seq for _, _, seq in channels[(src, dst)]]}, "
                    f"the logs say {expected}"
                )
        if problems:
            raise Violation(f"snapshot {snapshot_id}: recorded total {verdict.whole.observed} != {self.total}")
        if self.app is not None:  # A2
            logs = cut.epoch_logs(self.logs, epoch, cut.Payloads())
            apps.check_complete(self.app, snapshot_id, reports, self.channels, self.app_params, logs)

    # -- after quiescence (Q1-Q3)

    def check_quiescent(self, live: Mapping[str, object], snapshot_status: Mapping[str, str]) -> None:
        epochs = set(self.epoch.values())
        if len(epochs) != 1:  # quiescent: every node has every restore (one told it was done, then lost it?)
            raise Violation(f"quiescent: the nodes are in epochs {dict(sorted(self.epoch.items()))}")
        (epoch,) = epochs
        for src, dst in self.channels:
            sent = self.sent[(src, dst, epoch)]
            last = max(sent, default=0)
            if self.received_upto[(src, dst, epoch)] != last:
                got = self.received_upto[(src, dst, epoch)]
                raise Violation(f"quiescent: {src}->{dst} sent up to seq {last}, received up to {got} (lost)")
        if self.in_flight:
            raise Violation(f"quiescent: {self.in_flight} still in flight")
        for node_id, node in live.items():
            for dst, sender in node.senders.items():  # type: ignore[attr-defined]
                if sender.unacked:
                    raise Violation(f"quiescent: {node_id}->{dst} still holds {sender.unacked} unacknowledged")
            if node.process.in_progress():  # type: ignore[attr-defined]
                raise Violation(f"quiescent: {node_id} still recording {node.process.in_progress()}")  # type: ignore[attr-defined]
        stuck = {sid: s for sid, s in snapshot_status.items() if s not in ("COMPLETE", "FAILED")}
        if stuck:
            raise Violation(f"quiescent: snapshots never finished: {stuck}")
        logged = {r.msg_id for log in self.logs.values() for r in log if type(r) is wal.Send}
        lost = sorted(set(self.replied) - logged)
        if lost:
            raise Violation(f"quiescent: transfers answered to a client but not in the log: {lost[:5]}")
        if self.app is not None:  # A5
            apps.check_quiescent(self.app, {n: node.app_state() for n, node in live.items()}, self.app_params)  # type: ignore[attr-defined]
