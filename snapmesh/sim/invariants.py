"""The fault fuzzer's judge: what must hold, read from the logs, apart from the code under test.

The checker sees only what a node appended to its log (every record, in
order), which of those records a crash left on disk, what the controller
decided, what clients were told, and each live node's app state and open
recordings. It keeps its own fold of the logs; it never calls the recovery,
link or node code it judges. Every case runs an app (the bank's too: its
money is bytes to the framework, and its conservation is its app invariant,
judged as kvshard's are), so what a node holds is its app state and what a
message carries its payload.

After every step:
  S2 a live node's app state is what its log says (A6 of sim/apps.py);
  S3 per channel, the receiver logs seqs 1, 2, 3, ... each once, each one a
     message the sender logged (nothing applied twice, nothing invented);
  S4 lsns are 1, 2, 3, ... per node; a checkpoint's state is the log's (A6);
  S5 no recording outlives the node's ttl;
  S6 one request_id, one command record; except that a restore takes back the
     ids a node paid after the restored snapshot's cut there, and one of them
     may then be paid once more (snapmesh/protocol/node/requests.py W4);
  S7 no `cut` for a snapshot after the node logged an `abort` for it (no zombie);
  S8 a `report` record rests (`upto`) on itself or a report record after it (a part
     an early marker finished, overtake), or on the marker_recv right after its run
     of report records: nothing else comes between a report and what it rests on.
When the controller marks a snapshot COMPLETE, `snapmesh.checking.cut.check_snapshot`
(the one definition of a snapshot consistent with the logs):
  C1 every node's recorded state is the one its cut record's digest names;
  C2 every channel's recorded messages are exactly the sends before the
     sender's cut not received before the receiver's cut, with their payloads;
  C3 the app's invariants hold on the snapshot (the bank's: conserved).
Across restores, everything above is per epoch: a node's `restore`
record starts its new epoch (channels keyed by the epoch they were used in);
C1-C2 against the log of the snapshot's epoch, and
  R1 a `restore` record holds the restored snapshot's recorded state for the
     node, and the `replay` records after it are exactly the messages the
     snapshot recorded in flight towards it, in channel order.
After quiescence (faults stopped, everything healed and delivered):
  Q1 every message logged as sent is received exactly once; outboxes empty;
  Q2 every snapshot ended COMPLETE or FAILED; no recording left anywhere;
  Q3 (A4) every command a client was told about is its `command` record, and
     no crash takes that record back;
  A5 the app's invariants hold over the final states.
A1-A6 of snapmesh/sim/apps.py are the app's rules (payloads, the state
digests, the invariants on every COMPLETE snapshot and at the end, the
commands' request ids and replies, the state against the log).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from snapmesh.checking import cut
from snapmesh.protocol.node import core
from snapmesh.protocol import wal
from snapmesh.sim import apps


class Violation(AssertionError):
    """An invariant does not hold; the message says which and where."""


class Checker:
    """`nodes`: the node ids; `app` (a snapmesh.app.App) the app they host, `app_params` its [app] table."""

    def __init__(
        self, nodes: Iterable[str], channels: Iterable[tuple[str, str]], ttl: float, *,
        app: Any, app_params: Mapping[str, Any] | None = None,
    ) -> None:
        self.app, self.app_params = app, dict(app_params or {})
        self.versions = {app.version: app}  # the code of each version the logs hold
        self.nodes = list(nodes)
        self.channels = list(channels)
        self.infos = apps.infos(self.nodes, self.channels, self.app_params)  # what each node's app is told
        self.ttl = ttl
        self.logs: dict[str, list[wal.Record]] = {n: [] for n in self.nodes}
        self.reports_due: dict[str, tuple[wal.Record, ...]] = {}  # S8: report records awaiting their marker_recv
        self.recorded_at: dict[tuple[str, str], float] = {}
        # (node, request_id) -> (reply, lsn of its command record) (rebuilt by _refold)
        self.requests: dict[tuple[str, str], tuple[str, int]] = {}
        self.cuts: dict[tuple[str, str], int] = {}  # (node, snapshot id) -> lsn of its cut
        self.taken_back: dict[tuple[str, str], str] = {}  # (node, request_id) -> reply a restore took back
        self.answered: dict[str, list[tuple[int, str]]] = {n: [] for n in self.nodes}  # node -> (lsn, request_id) told (Q3)
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
        self._rests_on(node, record)
        self.fold.apply(node, record)
        if kind is wal.Send:
            self._fold_send(node, record)  # type: ignore[arg-type]
        command = wal.step_command(record)  # a `command`, or a step's first send carrying it
        if command is not None and command.request_id:
            rid = command.request_id
            if (node, rid) in self.requests:  # A4: S6 for commands
                raise Violation(f"{node}: request_id {rid!r} run twice (lsn {self.requests[(node, rid)][1]}, {record.lsn})")
            self.requests[(node, rid)] = (command.reply, record.lsn)
            self.taken_back.pop((node, rid), None)
        elif kind is wal.Recv or kind is wal.MarkerRecv:
            self._fold_recv(node, record)
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
        elif kind is wal.MarkerSent:
            self._sent(node, record.dst)[record.seq] = ""  # type: ignore[attr-defined]
        elif kind is wal.Restore or kind is wal.Replay:
            self._fold_restore(node, record, check=True)
            if kind is wal.Restore:
                self._take_back(node, record.snapshot_id)  # type: ignore[attr-defined]

    def new_code(self, app: Any) -> None:
        """The cluster runs another version of the app from now on (the version steps):
        its checks use it, and the logs' older records their own version's code."""
        self.app = app
        self.versions[app.version] = app
        self.fold.app = app
        self.fold.versions[app.version] = app

    def _rests_on(self, node: str, record: wal.Record) -> None:
        """S8: each report record of the run before `record` rests on one of the run or on it (a marker_recv)."""
        due = self.reports_due.pop(node, ())
        if type(record) is wal.Report:
            self.reports_due[node] = (*due, record)
            return
        for report in due:
            upto = report.upto  # type: ignore[attr-defined]
            if not report.lsn <= upto <= due[-1].lsn and (type(record) is not wal.MarkerRecv or record.lsn != upto):
                raise Violation(f"{node}: the report of {report.snapshot_id} (lsn {report.lsn}) rests on lsn "  # type: ignore[attr-defined]
                                f"{report.upto}, but a {record.KIND} at lsn {record.lsn} follows it")  # type: ignore[attr-defined]

    def crashed(self, node: str, durable_lsn: int) -> None:
        """`node` crashed; its log on disk ends at `durable_lsn`. Q3: no answer a client was told is lost."""
        lost = [(lsn, rid) for lsn, rid in self.answered[node] if lsn > durable_lsn]
        if lost:
            raise Violation(f"{node}: a command answered to a client (lsn {lost[0][0]}, request_id {lost[0][1]!r})"
                            f" is lost in a crash: the log is durable only to lsn {durable_lsn}")
        self.answered[node].clear()  # durable: no crash takes them back
        self.reports_due.pop(node, None)  # S8: the log may end between a report and its marker_recv
        del self.logs[node][durable_lsn:]
        self._refold()

    def replied_command(self, node: str, lsn: int, reply: str, request_id: str) -> None:
        """A4: an answered command (`lsn` its answer's, `reply` base64) is the `command`
        record before the sends of its step (and a checkpoint, if the step sealed a
        segment), or the step's first send carrying it, with that reply and request id."""
        self.answered[node].append((lsn, request_id))
        log = self.logs[node]
        at = lsn - 1
        while at >= 0 and type(log[at]) in (wal.Send, wal.Checkpoint) and wal.step_command(log[at]) is None:
            at -= 1
        record = wal.step_command(log[at]) if at >= 0 else None
        if record is None or (record.reply, record.request_id) != (reply, request_id):
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
        # (src, dst, epoch) -> {seq: msg_id ("" a marker)} and the last seq received, per epoch
        self.sent: defaultdict[tuple[str, str, int], dict[int, str]] = defaultdict(dict)
        self.received_upto: defaultdict[tuple[str, str, int], int] = defaultdict(int)
        self.payloads: defaultdict[tuple[str, str, int], dict[int, str]] = defaultdict(dict)  # A1
        self.epoch = dict.fromkeys(self.nodes, 1)
        self._replays: dict[str, list] = {}  # node -> the replays its last restore still owes (R1)
        self.requests = {}
        self.cuts = {}
        self.taken_back = {}
        self.aborted: set[tuple[str, str]] = set()
        self.fold = apps.StateFold(self.app, self.infos, self.versions)  # A6
        for node, log in self.logs.items():
            for record in log:
                self.fold.apply(node, record)
                if type(record) is wal.Abort:
                    self.aborted.add((node, record.snapshot_id))
                if type(record) is wal.Cut:
                    self.cuts[(node, record.snapshot_id)] = record.lsn
                elif type(record) is wal.Stop:  # a node a rescale started: its log is an init and the stop
                    self.cuts.setdefault((node, record.snapshot_id), record.lsn)
                command = wal.step_command(record)
                if command is not None and command.request_id:
                    self.requests[(node, command.request_id)] = (command.reply, record.lsn)
                if type(record) is wal.Send:
                    self._fold_send(node, record)
                elif type(record) is wal.MarkerSent:
                    self._sent(node, record.dst)[record.seq] = ""
                elif type(record) is wal.Restore or type(record) is wal.Replay:
                    self._fold_restore(node, record, check=False)
                    if type(record) is wal.Restore:
                        self._take_back(node, record.snapshot_id)
        for node, log in self.logs.items():
            epoch = 1
            for record in log:
                if type(record) is wal.Restore:
                    epoch = record.epoch
                elif type(record) is wal.Recv or type(record) is wal.MarkerRecv:
                    self._fold_recv(node, record, epoch)

    def _sent(self, node: str, dst: str) -> dict[int, str]:
        return self.sent[(node, dst, self.epoch[node])]

    @property
    def in_flight(self) -> int:
        """How many messages are sent and not received, on every channel of the epoch all nodes are in (0 when mixed)."""
        epochs = set(self.epoch.values())
        if len(epochs) != 1:
            return 0
        (e,) = epochs
        return sum(
            1 for (s, d) in self.channels for seq, msg_id in self.sent[(s, d, e)].items()
            if msg_id and seq > self.received_upto[(s, d, e)]
        )

    def _fold_restore(self, node: str, record: wal.Restore | wal.Replay, *, check: bool) -> None:
        """A restore starts the node's new epoch: its state is set, then each replay is one message (R1, A3)."""
        if type(record) is wal.Restore:
            self.epoch[node] = record.epoch
            reports = self.complete.get(record.snapshot_id)
            if check and reports is not None:
                part = reports[node]
                if record.state != wal.pack(apps.upgraded(self.app, part)):
                    raise Violation(f"{node}: restored {record.snapshot_id} with another app state than it recorded")
                self._replays[node] = [
                    (src, t.msg_id, wal.pack(t.payload or b"")) for src, t in apps.in_flight_towards(reports, node)
                ]
                if len(self._replays[node]) != record.deliveries:
                    raise Violation(
                        f"{node}: restore announces {record.deliveries} replays, the snapshot holds {self._replays[node]}"
                    )
            return
        owed = self._replays.get(node)
        if check and owed is not None:
            got = (record.src, record.msg_id, record.payload)
            if not owed or owed[0] != got:
                raise Violation(f"{node}: replayed {record.msg_id} ({record.payload!r}) from {record.src}, expected {owed[:1]}")
            owed.pop(0)

    def _fold_send(self, node: str, record: wal.Send) -> None:
        self._sent(node, record.dst)[record.seq] = record.msg_id
        self.payloads[(node, record.dst, self.epoch[node])][record.seq] = record.payload

    def _fold_recv(self, node: str, record: wal.Recv | wal.MarkerRecv, epoch: int | None = None) -> None:
        epoch = self.epoch[node] if epoch is None else epoch
        channel = (record.src, node, epoch)
        upto = self.received_upto[channel]
        if record.seq != upto + 1:
            what = "applied twice" if record.seq <= upto else "a gap"
            raise Violation(f"{node}: logged seq {record.seq} on {record.src}->{node} after {upto} ({what})")
        sent = self.sent[channel].get(record.seq)
        said = record.msg_id if type(record) is wal.Recv else ""  # type: ignore[union-attr]
        if sent is None or sent != said:
            logged = "nothing" if sent is None else repr(sent or "a marker")
            raise Violation(f"{node}: received seq {record.seq} on {record.src}->{node} as {said or 'a marker'!r},"
                            f" the sender logged {logged}")
        if type(record) is wal.Recv and self.payloads[channel].get(record.seq) != record.payload:
            logged = self.payloads[channel].get(record.seq)
            raise Violation(f"{node}: received {record.payload!r} as seq {record.seq} from {record.src}, sent as {logged!r}")
        self.received_upto[channel] = record.seq

    # -- after every step

    def check_step(self, live: Mapping[str, object], now: float) -> None:
        """`live`: node id -> its Node machine, for nodes that are up."""
        apps.check_states(self.fold, live)
        for node_id, node in live.items():
            for sid in node.process.in_progress():  # type: ignore[attr-defined]
                at = self.recorded_at.get((node_id, sid))
                if at is None:
                    raise Violation(f"{node_id}: recording {sid} with no cut in its log")
                if now - at >= self.ttl:
                    raise Violation(f"{node_id}: recording {sid} from t={at:g} still open at t={now:g} (ttl {self.ttl:g})")

    # -- a COMPLETE snapshot (C1-C3)

    def check_complete(self, snapshot_id: str, reports: Mapping[str, core.FullState], epoch: int = 1) -> None:
        """C1-C3 (A2): the snapshot against the log of its epoch, by `cut.check_snapshot`
        (the one definition the real-log checker and the reconcilers use) over payloads,
        then the app's invariants."""
        self.complete[snapshot_id] = reports
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
            raise Violation(f"quiescent: {self.in_flight} message(s) still in flight")
        for node_id, node in live.items():
            for dst, sender in node.senders.items():  # type: ignore[attr-defined]
                if sender.unacked:
                    raise Violation(f"quiescent: {node_id}->{dst} still holds {sender.unacked} unacknowledged")
            if node.process.in_progress():  # type: ignore[attr-defined]
                raise Violation(f"quiescent: {node_id} still recording {node.process.in_progress()}")  # type: ignore[attr-defined]
        stuck = {sid: s for sid, s in snapshot_status.items() if s not in ("COMPLETE", "FAILED")}
        if stuck:
            raise Violation(f"quiescent: snapshots never finished: {stuck}")
        apps.check_quiescent(self.app, {n: node.app_state() for n, node in live.items()}, self.app_params)  # type: ignore[attr-defined]  # A5
