"""Any app's part of the checkers: what every app's logs and snapshots show, as bytes.

The checkers (`logcheck.check_logs`, `trace.check_trace`, `steps.StepChecker`) take
the app's part; this one knows no app. An app's node logs each message's payload
(base64, `wal.pack`) and, at a cut, the digest of its state (sha256 of its
`snapshot()` bytes, hex); its snapshots record each node's state bytes and each
in-flight message's payload. So, whatever the app, they hold:

- a message's content is its payload: received as it was sent, and recorded in
  flight as its sender logged it at its seq;
- a node's recorded state hashes to the digest its cut record holds, and a
  restore sets the state the snapshot recorded;
- the rest is the checkers' own (channels, FIFO, seqs, markers, cuts).

What the bytes mean is the app's: given the app (`Payloads(app)`, or by its name,
`Payloads.named("module:attr")`), every snapshot checked is also held to the app's
invariants over its `snapmesh.app.View` (`snapmesh.app.check_invariants`). Pure:
records in, values and problems out (loading an app by name imports it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from snapmesh.app import App, View, check_invariants, load_app
from snapmesh.checking import cut
from snapmesh.protocol import statedigest, wal

Channel = tuple[str, str]
Record = Mapping[str, Any]

# Which field of a log line holds a node's state or a message's content, by kind.
_VALUE = {"init": "state", "checkpoint": "state", "restore": "state", "cut": "digest",
          "send": "payload", "recv": "payload", "replay": "payload"}


def digest(state: bytes) -> str:
    """A state as a node's cut record names it: the form a node records for its size
    (snapmesh/protocol/statedigest.py SD3), as the record holds it (SD4)."""
    return statedigest.record_text(statedigest.canonical(state))


class Payloads:
    """The part of the checkers for any app: one object serves a trace, a step checker's ledger and the logs.
    `app` (None: bytes only): its invariants are checked on every snapshot; `params`: its [app] table."""

    def __init__(self, app: App | None = None, params: Mapping[str, Any] | None = None) -> None:
        self.app = app
        self.params = dict(params or {})

    @classmethod
    def named(cls, spec: str, params: Mapping[str, Any] | None = None) -> Payloads:
        """The part for the app `spec` names ("module:attr" or a built-in name), loaded by `snapmesh.app.load_app`."""
        return cls(load_app(spec), params)

    # Its trace events' keys: a node's state (its digest at a cut), a message's payload.
    state_key = "state"
    content_key = "payload"
    contents_key = "payloads"

    @property
    def trace(self) -> Payloads:
        return self

    # ---- a trace (trace.Part)

    @staticmethod
    def reading(total: Any = None) -> cut.Payloads:
        return cut.Payloads()

    @staticmethod
    def logged(kind: str, value: Any) -> dict[str, Any]:
        """The line of `kind` its node logs: an app's record (its kind's mark, wal.APP_MARKS) holding `value`."""
        if kind == "init":
            return {"app": "", "state": value}
        return {_VALUE[kind]: value}

    @staticmethod
    def total(initial: Mapping[str, Any]) -> None:
        return None  # no sum over bytes: the app's invariants are its whole-snapshot rules

    @staticmethod
    def message_problem(msg: str, content: Any) -> str | None:
        return None if isinstance(content, str) else f"transfer {msg} has no payload: {content!r}"

    @staticmethod
    def history_problems(node: str, initial: Any, history: Iterable[Any]) -> list[str]:
        return []

    @staticmethod
    def whole_problem(sid: str, rules: set[str], whole: Any, total: Any) -> str | None:
        return None

    # ---- step by step (the ledger of steps.StepChecker): bytes are not added up

    def declared(self, node: str, state: Any) -> None:
        pass

    def sent(self, node: str, content: Any) -> str | None:
        return None

    def received(self, node: str, content: Any) -> None:
        pass

    @staticmethod
    def changed(sent: Any, received: Any) -> str | None:
        return f"payload changed in transit: sent {sent!r}" if sent != received else None

    def cut(self, node: str, recorded: Any) -> str | None:
        return None

    def now(self, on_channels: Mapping[Channel, Any], states: Mapping[str, Any] | None = None) -> list[str]:
        return []

    # ---- the logs (logcheck.check_logs)

    @staticmethod
    def read(logs: Mapping[str, list[Record]]) -> Mapping[str, list[Record]]:
        return logs

    @staticmethod
    def value(record: Record, where: str) -> str:
        """An init's state (empty: none logged), a cut's digest, a send's or a receive's payload."""
        kind = record["kind"]
        key = _VALUE[kind]
        if kind == "init":
            return record.get(key, "")
        if not isinstance(record.get(key), str):
            raise wal.CorruptRecord(f"{where}: an app's {kind} record needs a string {key!r}")
        return record[key]

    @staticmethod
    def initial_total(logs: Mapping[str, list[Record]]) -> None:
        return None

    @staticmethod
    def whole_problems(sid: str, rules: set[str], whole: Any, total: Any) -> list[str]:
        return []

    def snapshot_problems(self, snapshot: Any) -> list[str]:
        """The app's invariants over a controller `Snapshot` (v1): one line per problem (none without an app)."""
        if self.app is None:
            return []
        view = View(snapshot_id=snapshot.snapshot_id, states={n.node_id: n.state for n in snapshot.nodes},
                    in_flight=[(c.src, c.dst, t.seq, t.payload) for c in snapshot.channels for t in c.in_flight],
                    params=self.params)
        return [f"snapshot {snapshot.snapshot_id}: {self.app.name}'s invariant {name!r}: {problem}"
                for name, problems in check_invariants(self.app, view).items() for problem in problems]

    @staticmethod
    def recorded(snapshot: Any) -> tuple[str, dict[str, str], dict[Channel, list[tuple[str, str, int]]]]:
        """A controller `Snapshot` (v1) of an app as (snapshot_id, each node's state digest, the payloads in flight)."""
        return (snapshot.snapshot_id, {n.node_id: digest(n.state) for n in snapshot.nodes},
                {(c.src, c.dst): [(t.msg_id, wal.pack(t.payload), t.seq) for t in c.in_flight]
                 for c in snapshot.channels})

    # ---- restores (logcheck.split_epochs, check_restore)

    @staticmethod
    def opening(node: str, restore: Record) -> dict[str, Any]:
        """An epoch's first record after `restore`: an `init` holding the restored state."""
        return {"node": node, "lsn": restore["lsn"], "kind": "init", "app": "", "state": restore.get("state", "")}

    @staticmethod
    def with_replay(first: Record, replay: Record) -> Record:
        return first  # the state after the replays is the app's; the next cut's digest says it

    @staticmethod
    def replayed_item(replay: Record) -> tuple[str, str, int]:
        return (replay["msg_id"], replay["payload"], replay["seq"])

    @staticmethod
    def restore_problems(epoch: int, node: str, record: Record, snapshot_id: str, state: str) -> list[str]:
        """The restore record of `node` in `epoch` against the digest of the state snapshot `snapshot_id` recorded."""
        restored = digest(wal.unpack(record.get("state", ""), f"{node}'s log, lsn {record.get('lsn')}"))
        if record["snapshot_id"] != snapshot_id or restored != state:
            return [f"epoch {epoch}: {node} restored {record['snapshot_id']} to state {restored[:12]}, "
                    f"expected {snapshot_id} at {state[:12]}"]
        return []


PAYLOADS = Payloads()
