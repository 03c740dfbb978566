"""`snapmesh replay --app module:attr DATA_DIR`: does this code reproduce the recorded history?

Offline, with no cluster: every node's log in DATA_DIR (its sealed segments and
the active one) is replayed through the given app by the node's own recovery
code (snapmesh/protocol/node/recovery.py `replay_inputs`), once from the log's
start (if it still holds its init) and once from each checkpoint, as a restart
would. Per node it prints either `ok` or the first record where the sends or
the reply differ: the log position (file:line, lsn), the record, and what the
code sent against what the log holds, with the likely cause (recovery.cause:
a snapshot() that does not round-trip, or code that changed or is not
deterministic). A log of another version than the code's is named too.

Snapshots: at each `cut` record the replayed state's sha256 must be the digest
the cut recorded; if DATA_DIR holds the controller's store
(controller/snapshots/), every COMPLETE snapshot's state of the node must be
that state too. This is Temporal's Replayer for snapmesh: keep a data dir
recorded by a short run in the repository and run this in CI (docs/apps.md).

The topology and the [app] params come from DATA_DIR/cluster.toml (what
`cluster up` leaves there) or `--cluster FILE`; without either, from a
COMPLETE snapshot's channels, else from the logs' records, with no params.
Each checkpoint's replay runs to the log's end (a state that does not
round-trip may show only much later), so the cost grows with the segments
times the log: keep a recorded data dir short, with small segments.
Exit 0: the code reproduces history; 1: it does not (a line per node that
differs); 2: bad input, one line (no such directory, no logs, an app that
does not load, a log that cannot be read).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapmesh.app import App, AppError, load_app
from snapmesh.protocol import statedigest, wal
from snapmesh.protocol.node import recovery
from snapmesh.protocol.node.core import AppFailed
from snapmesh.protocol.topology import Topology, TopologyError
from snapmesh.settings import config as cluster_config
from snapmesh.settings.target import CLUSTER_FILE
from snapmesh.v1 import snapmesh_pb2 as pb


class BadInput(Exception):
    """What makes the replay impossible: exit 2 with this line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 on bad arguments, one line
        self.exit(2, f"snapmesh replay: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapmesh replay", description="Replay every node's log through the given app code, "
                     "offline; exit 1 naming the first record it does not reproduce.")
    parser.add_argument("data_dir", metavar="DATA_DIR", help="a cluster's data dir (the node logs, and the "
                        "controller's store if present)")
    parser.add_argument("--app", required=True, metavar="MODULE:ATTR", help="the app code to replay through")
    parser.add_argument("--cluster", metavar="FILE", help="the cluster file for the topology and the [app] "
                        f"params (default: DATA_DIR/{CLUSTER_FILE} if present)")
    return parser


@dataclass
class Verdict:
    """One node's outcome: `problems` empty when the code reproduces its log."""

    node: str
    records: int = 0
    starts: list[str] = field(default_factory=list)  # where replays began: "init", "checkpoint at lsn N"
    cuts: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.problems:
            return f"{self.node}: " + "\n  ".join(self.problems)
        checkpoints = sum(start != "init" for start in self.starts)
        starts = (["init"] if "init" in self.starts else []) + ([f"{checkpoints} checkpoint(s)"] if checkpoints else [])
        return (f"{self.node}: ok, {self.records} records replayed from {' and from '.join(starts)};"
                f" {self.cuts} cut(s) reproduce their recorded state")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        verdicts = replay(Path(args.data_dir), args.app, Path(args.cluster) if args.cluster else None)
    except BadInput as exc:
        print(f"snapmesh replay: {exc}", file=sys.stderr)
        return 2
    for verdict in verdicts:
        print(verdict.line())
    return 1 if any(v.problems for v in verdicts) else 0


def replay(data_dir: Path, spec: str, cluster_file: Path | None = None) -> list[Verdict]:
    """Every node's verdict (the module doc); BadInput for what makes a replay impossible."""
    if not data_dir.is_dir():
        raise BadInput(f"no such directory: {data_dir}")
    try:
        app = load_app(spec)
    except AppError as exc:
        raise BadInput(str(exc)) from None
    names = os.listdir(data_dir)
    nodes = sorted({node for name in names if (node := wal.log_file_node(name)) is not None})
    if not nodes:
        raise BadInput(f"{data_dir} holds no node log (<node>{wal.ACTIVE_SUFFIX})")
    logs = {node: _read(data_dir, names, node) for node in nodes}
    snapshots = _complete_snapshots(data_dir)
    topology, params = _topology(data_dir, cluster_file, nodes, logs, snapshots)
    states = {(s.snapshot_id, n.node_id): n.state for s in snapshots for n in s.nodes if n.HasField("state")}
    return [_replay_node(app, node, logs[node], topology, params, states) for node in nodes]


def _read(data_dir: Path, names: list[str], node: str) -> list[list[tuple[str, wal.Record]]]:
    segments = []
    for name in wal.segment_order(names, node):
        lines, _ = wal.split_lines((data_dir / name).read_bytes(), str(data_dir / name))  # a torn last line: skipped
        try:
            segments.append([(where, wal.parse(raw, where, node_id=node)) for where, raw in lines])
        except wal.CorruptRecord as exc:
            raise BadInput(str(exc)) from None
    return [s for s in segments if s]


def _complete_snapshots(data_dir: Path) -> list[pb.Snapshot]:
    """The COMPLETE snapshots of the controller's store in `data_dir`, if it has one (services/controller/store.py)."""
    directory = data_dir / "controller" / "snapshots"
    if not directory.is_dir():
        return []
    from snapmesh.services.controller.store import SnapshotStore  # only for a data dir that has one

    snapshots, _ = SnapshotStore(data_dir / "snapshots", directory).load_all()
    return [s for s in snapshots if s.status == pb.Snapshot.COMPLETE]


def _topology(data_dir: Path, cluster_file: Path | None, nodes: list[str], logs: Mapping[str, list],
              snapshots: list[pb.Snapshot]) -> tuple[Topology, Mapping[str, Any]]:
    path = cluster_file or (data_dir / CLUSTER_FILE if (data_dir / CLUSTER_FILE).is_file() else None)
    if path is not None:
        try:
            cfg = cluster_config.load(path)
        except (cluster_config.ConfigError, OSError) as exc:
            raise BadInput(f"{path}: {exc}") from None
        return cfg.topology, cluster_config.hosted(cfg).params  # a bank: its initial_balance the file's
    channels: list[tuple[str, str]] = []
    for snapshot in snapshots:  # a COMPLETE snapshot lists every channel, in the topology's order
        channels = [(c.src, c.dst) for c in snapshot.channels]
        break
    else:
        seen = set()
        for node, segments in logs.items():
            for _, record in (pair for segment in segments for pair in segment):
                if type(record) is wal.Checkpoint:
                    seen |= {(node, dst) for dst in record.next_seq} | {(src, node) for src in record.received}
                elif type(record) in (wal.Send, wal.MarkerSent, wal.Recv, wal.MarkerRecv):
                    seen.add((record.src, record.dst))  # type: ignore[attr-defined]
        channels = sorted(seen)
    try:
        return Topology.build(sorted({n for c in channels for n in c} | set(nodes)), channels), {}
    except TopologyError as exc:
        raise BadInput(f"the logs' channels make no topology ({exc}); pass --cluster FILE") from None


def _replay_node(app: App, node: str, segments: list[list[tuple[str, wal.Record]]], topology: Topology,
                 params: Mapping[str, Any], states: Mapping[tuple[str, str], bytes]) -> Verdict:
    verdict = Verdict(node=node, records=sum(len(s) for s in segments))
    chain = dict(node_id=node, incoming=topology.incoming(node), outgoing=topology.outgoing(node), app=app,
                 app_params=params)
    cuts: dict[str, str] = {}  # snapshot id -> the problem found at its cut ("" none)

    def at_cut(record: wal.Cut, where: str, state: bytes) -> None:
        said = statedigest.from_record(record.digest)  # either form (statedigest.py SD2, SD4)
        made = statedigest.of(state, like=said)
        problem = ""
        if said and made != said:
            problem = f"the cut recorded {said}"
        elif (record.snapshot_id, node) in states and states[record.snapshot_id, node] != state:
            stored = hashlib.sha256(states[record.snapshot_id, node]).hexdigest()
            problem = f"the COMPLETE snapshot holds sha256:{stored}"
        if problem:
            problem = (f"snapshot {record.snapshot_id}: replayed to its cut ({where}, lsn {record.lsn}) the state is"
                       f" {made}; {problem}")
        cuts.setdefault(record.snapshot_id, problem)

    found: list[tuple[recovery.NonDeterministic, bool]] = []  # (divergence, replayed from a checkpoint)
    from_start: recovery.NonDeterministic | None | bool = False
    try:
        for k, segment in enumerate(segments):
            first = segment[0][1]
            if type(first) not in (wal.Init, wal.Checkpoint):
                continue
            records = [pair for later in segments[k:] for pair in later]
            diverged = recovery.replay_inputs(records, **chain, on_cut=at_cut if k == 0 else None)  # type: ignore[arg-type]
            verdict.starts.append("init" if type(first) is wal.Init else f"checkpoint at lsn {first.lsn}")
            if type(first) is wal.Init:
                from_start = diverged
            if diverged is not None:
                found.append((diverged, type(first) is wal.Checkpoint))
    except recovery.OtherVersion as exc:
        verdict.problems.append(f"{exc}")
        return verdict
    except (recovery.CorruptLog, wal.CorruptRecord, AppFailed) as exc:
        raise BadInput(f"{node}: cannot replay its log: {exc}") from None
    if not verdict.starts:
        raise BadInput(f"{node}: no segment of its log starts with an init or a checkpoint")
    if found:
        diverged, from_checkpoint = min(found, key=lambda f: (_lsn(f[0]), not f[1]))
        line = recovery.cause(diverged, from_checkpoint=from_checkpoint,
                              from_start=from_start, version=app.version)
        verdict.problems.append(f"{line}\n  the record: {_line_at(str(diverged))}")
    verdict.cuts = len(cuts)
    verdict.problems += [p for p in cuts.values() if p]
    return verdict


def _lsn(exc: Exception) -> int:
    text = str(exc)
    _, _, rest = text.partition(": lsn ")
    digits = rest.partition(":")[0]
    return int(digits) if digits.isdigit() else 0


def _line_at(message: str) -> str:
    """The log line `message` starts with (`file:line: ...`), as it is on disk."""
    path, _, rest = message.partition(":")
    number = rest.partition(":")[0]
    try:
        with open(path, "rb") as handle:
            for n, raw in enumerate(handle, start=1):
                if str(n) == number:
                    return raw.decode(errors="replace").strip()[:300]
    except OSError:
        pass
    return "(not found)"
