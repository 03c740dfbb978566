"""`snapmesh snapshot`: take, list, show, watch and verify snapshots.

    snapmesh snapshot trigger [--controller HOST:PORT] [--initiator ID] [--broadcast] [--wait] [--stop]
    snapmesh snapshot list    [--controller HOST:PORT] [--status STATUS] [--limit N]
    snapmesh snapshot get     [--controller HOST:PORT] ID|latest
    snapmesh snapshot watch   [--controller HOST:PORT] [--count N]
    snapmesh snapshot verify  ID|FILE [--data-dir DIR]

The controller, as for `restore`, `app` and `ui` (snapmesh.settings.target):
`--controller`, else $SNAPMESH_CONTROLLER, else the controller of `--data-dir
D`'s cluster.toml, else 127.0.0.1:50050 (`snapmesh cluster up`'s). `--tls-dir
DIR` (default: $SNAPMESH_TLS_DIR, else D/tls/): the client certificate and
token of a TLS cluster.

Tables by default; `--json` prints proto JSON (snake_case names, as the
exported files) for scripts: one object for trigger and get, `{"snapshots":
[...]}` for list, one object per line for watch, the verdict for verify.
`list` is newest first, as the page; `get` shows what the snapshot's page
shows (each node's timings, the transfers in flight); `get latest` the newest.
`watch` first names the app the nodes run (GetCluster's app, app_name and
app_version: "app bank", "app kvshard (snapmesh.services.app.kvshard:app), kvshard
version 1"), then prints a row when a snapshot changes (started, each node's report as
"reported N/M", finished), never the same row twice: an app's with its invariants'
verdict, the bank's with its total and conserved.

`get` asks GetSnapshot; its table needs each state's size only, so it fetches the
snapshot in pieces (GetSnapshotChunks) only for in-flight messages left out or an
answer too large for one message. `--json` also fetches the app's states left out
(over answer_state_bytes) and says whose (`"states_fetched": [ids]`), unless they add
up to over JSON_STATES_MAX_BYTES (a message holds 2 GiB at most): then the answer is
printed as it came (sizes and digests) with a notice on stderr. `trigger --wait`
prints the answer's summary, states left out or not. `list` pages through
ListSnapshots (`--limit N`: the N newest).
`trigger --stop` stops with a snapshot (Flink's stop-with-savepoint): every node
refuses new commands, the snapshot is taken at every node, and once it is COMPLETE
the nodes stop, their logs ending in it; a node started on such a log (any version
of the app) answers only health and RestoreState until `snapmesh restore ID`
upgrades and restores it. A snapshot that fails leaves the cluster running and
accepting commands again (exit 1). It waits, as `--wait` does.
`verify` reads a stored file, the `.pb` or `.json` given, or by id both files
under `--data-dir` (default: $SNAPMESH_DATA_DIR), and checks without restoring
that it is intact (its checksum), COMPLETE, conserved and consistent with
itself (snapmesh/checking/snapshot_file.py).

Exit status, as `restore`'s: 0 when done (trigger --wait: COMPLETE and
conserved; verify: every check passed); 1 when the snapshot FAILED or is not
conserved, a check failed, the controller refused (NOT_FOUND, ...) or cannot be
reached; 2 for bad arguments or a bad certificate file. `watch` runs until
Ctrl-C (exit 0), `--count` updates, or the controller ends the stream.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from snapmesh.serving import credentials
from snapmesh.settings.argparsing import parse_args, positive_float, positive_int
from snapmesh.settings import target
from snapmesh.checking.snapshots import JSON_STATES_MAX_BYTES, fetch, fetch_states, pages  # noqa: F401  (part of this module's API)

PROG = "snapmesh snapshot"
LATEST = "latest"  # `get latest`: the newest snapshot
STATUSES = ("IN_PROGRESS", "COMPLETE", "FAILED")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 on bad arguments, one line
        self.exit(2, f"{self.prog}: {message}\n")


class UsageError(Exception):
    """Bad arguments or environment: exit 2."""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Take, list, show, watch and verify snapshots.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser,
                                     help="one of these; `snapmesh snapshot COMMAND --help` for its flags")

    def command(name: str, help_: str, *, remote: bool = True, timeout: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        if remote:
            sub.add_argument("--controller", metavar="HOST:PORT", help=target.CONTROLLER_HELP)
            sub.add_argument("--data-dir", metavar="DIR", help=target.DATA_DIR_HELP)
            sub.add_argument("--tls-dir", metavar="DIR", help="client certificate of a TLS cluster "
                             "(default: $SNAPMESH_TLS_DIR, else --data-dir's tls/, else plaintext)")
        if remote and timeout:
            sub.add_argument("--timeout", type=positive_float, default=60.0, metavar="S",
                             help="give up on a call after S seconds (default: 60)")
        if remote:
            sub.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")
        return sub

    trigger = command("trigger", "start a snapshot")
    trigger.add_argument("--initiator", metavar="ID", help="the node that starts it (default: a random node)")
    trigger.add_argument("--broadcast", action="store_true",
                         help="start it at every node at once, not at the initiator alone (one hop less)")
    trigger.add_argument("--wait", action="store_true", help="return once it is COMPLETE or FAILED")
    trigger.add_argument("--stop", action="store_true",
                         help="stop with a snapshot: refuse new commands, take it, stop the nodes once it is COMPLETE")
    listing = command("list", "list snapshots, newest first")
    listing.add_argument("--status", type=str.upper, choices=STATUSES, metavar="STATUS",
                         help=f"only snapshots with this status ({', '.join(STATUSES)}; default: all)")
    listing.add_argument("--limit", type=positive_int, metavar="N", help="only the N newest (default: all)")
    get = command("get", "show one snapshot: its nodes with their timings, its channels and the transfers in flight")
    get.add_argument("snapshot_id", metavar="ID", help=f"the snapshot's id, or {LATEST} for the newest")
    watch = command("watch", "print every snapshot update (started, finished, failed) as it happens",
                    timeout=False)
    watch.add_argument("--count", type=positive_int, metavar="N", help="stop after N updates (default: Ctrl-C)")
    verify = command("verify", "check a stored snapshot is intact, COMPLETE, conserved (an app's: its "
                     "invariants hold) and consistent, without restoring it", remote=False)
    verify.add_argument("target", metavar="ID|FILE", help="a snapshot id (its files under --data-dir) or a "
                        ".pb or .json snapshot file")
    verify.add_argument("--data-dir", metavar="DIR",
                        help="the cluster's data dir, to find a snapshot by id (default: $SNAPMESH_DATA_DIR)")
    verify.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")
    return parser


# ---------------------------------------------------------------- rendering


def _status(snapshot) -> str:
    from snapmesh.v1 import snapmesh_pb2 as pb

    return pb.Snapshot.Status.Name(snapshot.status) if snapshot.status in pb.Snapshot.Status.values() else "?"


def _started(snapshot) -> str:
    if not snapshot.HasField("started_at"):
        return "-"
    return snapshot.started_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")


def _verdict(snapshot) -> str:
    from snapmesh.v1 import snapmesh_pb2 as pb

    if snapshot.status != pb.Snapshot.COMPLETE:
        return "-"
    return "yes" if snapshot.conserved else "NO"


def _table(header: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join(line(r).rstrip() for r in [header, *rows])


SUMMARY = ["snapshot", "status", "initiator", "epoch", "started (UTC)", "duration", "total", "conserved", "reason"]
# An app's snapshots: its invariants' verdict in place of the bank's total and conserved.
APP_SUMMARY = [*SUMMARY[:6], "invariants", "reason"]


def app_verdict(snapshot) -> str:
    """An app snapshot's verdict as the controller judged it: "ok", "broken" or
    "unchecked" ("-" before it is COMPLETE)."""
    from snapmesh.v1 import snapmesh_pb2 as pb

    if snapshot.status != pb.Snapshot.COMPLETE:
        return "-"
    if snapshot.app.status == pb.AppCheck.UNCHECKED:
        return "unchecked"
    return "ok" if all(i.ok for i in snapshot.app.invariants) else "broken"


def summary_row(snapshot, *, app: bool = False) -> list[str]:
    """A summary row: the bank's (total, conserved) or, with `app`, an app's
    (`app_verdict`); an app snapshot without the bank's fields in a bank table
    shows "-" for both."""
    from snapmesh.checking.snapshots import duration_s
    from snapmesh.protocol.appstate import carries_v1
    from snapmesh.v1 import snapmesh_pb2 as pb

    duration = f"{duration_s(snapshot):.3f}s" if snapshot.HasField("finished_at") else "-"
    row = [snapshot.snapshot_id, _status(snapshot), snapshot.initiator, str(snapshot.epoch), _started(snapshot),
           duration]
    if app:
        return [*row, app_verdict(snapshot), snapshot.reason]
    if not carries_v1(snapshot):
        return [*row, "-", "-", snapshot.reason]
    total = str(snapshot.total) if snapshot.status == pb.Snapshot.COMPLETE else "-"
    return [*row, total, _verdict(snapshot), snapshot.reason]


def render_summary(snapshots) -> str:
    """The summary table: an app's columns when no snapshot carries the bank's
    fields (v1: `total`, `conserved`), else the bank's."""
    from snapmesh.protocol.appstate import carries_v1

    snapshots = list(snapshots)
    if snapshots and not any(carries_v1(s) for s in snapshots):
        return _table(APP_SUMMARY, [summary_row(s, app=True) for s in snapshots], right={3, 5})
    return _table(SUMMARY, [summary_row(s) for s in snapshots], right={3, 5, 6})


def _ms(value: float) -> str:
    return f"{value:.1f}ms"


def render_detail(snapshot, node_ids=()) -> str:
    """`get`, what the snapshot's page shows: the summary; each node's balance and
    timings (trigger to its cut, cut to its last marker, its report; "-" for a node
    of `node_ids`, the cluster's, that has not reported); each channel; the
    transfers in flight; the sum."""
    from snapmesh.checking import described
    from snapmesh.protocol.appstate import carries_v1

    lines = [render_summary([snapshot])]
    app = not carries_v1(snapshot)  # an app's node recorded state bytes; the bank's figures are its own
    balances = {n.node_id: str((n.state_bytes if n.state_omitted else len(n.state)) if app else n.balance)
                for n in snapshot.nodes}
    stats = {n.node_id: n for n in snapshot.stats.nodes}
    ids = list(dict.fromkeys([*node_ids, *(n.node_id for n in snapshot.nodes), *stats]))
    if ids:
        rows = []
        for node in ids:
            n = stats.get(node)
            figures = ([_ms(n.start_delay_ms), _ms(n.recording_duration_ms), _ms(n.report_time_ms),
                        str(n.in_flight_messages)] if n is not None else ["-"] * 4)
            rows.append([node, balances.get(node, "-"), *figures])
        header = ["node", "state bytes" if app else "balance", "start delay", "recording", "report", "in flight"]
        lines += ["", _table(header, rows, right={1, 2, 3, 4, 5})]
    if snapshot.channels:
        # An app's messages carry payloads, not amounts: their sizes (what they mean is its describe's).
        size, what, unit = ((lambda t: len(t.payload)), "messages", "payload bytes") if app else \
            ((lambda t: t.amount), "transfers", "amount")
        rows = [[f"{c.src}->{c.dst}", str(len(c.in_flight)), str(sum(size(t) for t in c.in_flight))]
                for c in snapshot.channels]
        lines += ["", _table(["channel", "in flight", unit], rows, right={1, 2})]
        transfers = [[c.src, c.dst, str(size(t)), str(t.seq), t.msg_id] for c in snapshot.channels for t in c.in_flight]
        lines += ["", f"{what} in flight: {len(transfers)}" if transfers else f"{what} in flight: none"]
        if transfers:
            lines.append(_table(["from", "to", unit, "seq", "msg id"], transfers, right={2, 3}))
    if described.is_app(snapshot):  # an app's: its verdicts and its describe
        lines += ["", *render_app(snapshot, described.describe(snapshot))]
    if not app and snapshot.nodes:  # the bank's sums
        in_flight = sum(t.amount for c in snapshot.channels for t in c.in_flight)
        balances_total = sum(n.balance for n in snapshot.nodes)
        lines += ["", f"balances {balances_total} + in flight {in_flight} = {balances_total + in_flight}; "
                      f"expected {snapshot.expected_total}"]
    return "\n".join(lines)


def render_app(snapshot, about) -> list[str]:
    """An app snapshot's lines: the controller's verdict per invariant, then what the
    app's `describe` returns (or why there is nothing: snapmesh.checking.described)."""
    from snapmesh.checking import described

    recorded_by = f" ({snapshot.app.name} version {snapshot.app.version or 1})" if snapshot.app.name else ""
    lines = [f"app {snapshot.app.spec}{recorded_by}", _table(["invariant", "verdict"], described.verdicts(snapshot))]
    if about is None:
        return lines
    if about.summary is None:
        return [*lines, "", f"describe: {about.note}"]
    return [*lines, "", "describe:", _table(["name", "value"], described.rows(about.summary))]


def to_json(message, *, indent: int | None = 2) -> str:
    from google.protobuf import json_format

    text = json_format.MessageToJson(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True, indent=indent)
    return text if indent is not None else json.dumps(json.loads(text), separators=(",", ":"))


# ---------------------------------------------------------------- calls


def _trigger(stub, args) -> int:
    from snapmesh.v1 import snapmesh_pb2 as pb

    request = pb.TriggerSnapshotRequest(initiator=args.initiator or "", wait=args.wait, broadcast=args.broadcast,
                                        stop=args.stop)
    snapshot = stub.TriggerSnapshot(request, timeout=args.timeout)
    print(to_json(snapshot) if args.json else render_summary([snapshot]))
    if args.stop and not args.json:
        print(f"the nodes stopped: start them (any version of the app) and run: snapmesh restore {snapshot.snapshot_id}"
              if snapshot.status == pb.Snapshot.COMPLETE else
              f"stop with a snapshot failed ({snapshot.reason}): the cluster runs and accepts commands again")
    if not (args.wait or args.stop):
        return 0
    from snapmesh.protocol.appstate import carries_v1

    # the bank's figures say conserved; an app without them has its invariants (shown in the row)
    return 0 if snapshot.status == pb.Snapshot.COMPLETE and (snapshot.conserved or not carries_v1(snapshot)) else 1


def _list(stub, args) -> int:
    from snapmesh.v1 import snapmesh_pb2 as pb

    status = pb.Snapshot.Status.Value(args.status) if args.status else 0
    found = newest_first(pages(stub, status=status, timeout=args.timeout))[:args.limit]
    if args.json:
        print(to_json(pb.ListSnapshotsResponse(snapshots=found)))
    elif found:
        print(render_summary(found))
    else:
        print("no snapshots" + (f" with status {args.status}" if args.status else ""))
    return 0


def newest_first(snapshots) -> list:
    """As the page lists them: by start time, then id, the newest first."""
    return sorted(snapshots, key=lambda s: (s.started_at.ToNanoseconds(), s.snapshot_id), reverse=True)


def _get(stub, args) -> int:
    sid = args.snapshot_id
    if sid == LATEST:
        newest = newest_first(pages(stub, timeout=args.timeout))
        if not newest:
            print(f"{PROG} get: no snapshots yet, so no {LATEST}", file=sys.stderr)
            return 1
        sid = newest[0].snapshot_id
    snapshot, fetched = fetch_states(stub, sid, args.timeout, states=args.json)
    if args.json:
        print(to_json(snapshot) if not fetched else json.dumps({**json.loads(to_json(snapshot)),
                                                                  "states_fetched": fetched}, indent=2))
        return 0
    from snapmesh.v1 import snapmesh_pb2 as pb

    cluster = stub.GetCluster(pb.GetClusterRequest(), timeout=args.timeout)  # the nodes yet to report, too
    print(render_detail(snapshot, [n.node_id for n in cluster.nodes]))
    return 0


# `watch` prints rows as they come, so its columns cannot fit the rows: each is as wide
# as a typical value (a longer one pushes only its own row), the header aligned with them.
# An app's cluster (GetCluster names its app) gets an app's columns: its invariants' verdict.
WATCH = [*SUMMARY[:2], "reported", *SUMMARY[2:]]
WATCH_WIDTHS = [" " * n for n in (32, 11, 8, 9, 5, 19, 9, 7, 9, 0)]
APP_WATCH = [*APP_SUMMARY[:2], "reported", *APP_SUMMARY[2:]]
APP_WATCH_WIDTHS = [" " * n for n in (32, 11, 8, 9, 5, 19, 9, 10, 0)]


def watch_row(snapshot, nodes: int, *, app: bool = False) -> list[str]:
    """A summary row with "reported N/M": N nodes of M have sent their part."""
    row = summary_row(snapshot, app=app)
    return [*row[:2], f"{len(snapshot.stats.nodes)}/{nodes}", *row[2:]]


def _watch(stub, args) -> int:
    from snapmesh.settings.appsettings import AppSettings, app_words, runs_bank
    from snapmesh.v1 import snapmesh_pb2 as pb

    cluster = stub.GetCluster(pb.GetClusterRequest(), timeout=30)
    nodes = len(cluster.nodes)
    app = not runs_bank(AppSettings(module=cluster.app))
    header, widths = (APP_WATCH, APP_WATCH_WIDTHS) if app else (WATCH, WATCH_WIDTHS)
    stream = stub.WatchSnapshots(pb.WatchSnapshotsRequest())
    seen = 0
    shown: dict[str, list[str]] = {}  # each snapshot's last row: an update that changes nothing shown is not printed
    try:
        if not args.json:
            print(f"app {app_words(cluster.app, cluster.app_name, cluster.app_version)}: "
                  f"{nodes} nodes, epoch {cluster.epoch}", flush=True)  # whose snapshots these are
            print(_table(header, [widths]).split("\n")[0], flush=True)  # the header, its columns as wide as a typical row
        for snapshot in stream:
            row = watch_row(snapshot, nodes, app=app)
            if shown.get(snapshot.snapshot_id) == row:
                continue
            shown[snapshot.snapshot_id] = row
            if snapshot.status != pb.Snapshot.IN_PROGRESS:
                del shown[snapshot.snapshot_id]  # finished: no more updates of it
            if args.json:
                print(to_json(snapshot, indent=None), flush=True)
            else:
                print(_table(header, [widths, row]).split("\n")[2], flush=True)
            seen += 1
            if args.count is not None and seen >= args.count:
                break
    except KeyboardInterrupt:
        pass
    finally:
        stream.cancel()
    return 0


REMOTE = {"trigger": _trigger, "list": _list, "get": _get, "watch": _watch}


# ---------------------------------------------------------------- verify


def stored_files(target: str, data_dir: str | None) -> list[Path]:
    """The files `verify` checks: the FILE given, or both files of an id."""
    path = Path(target)
    if path.suffix in (".pb", ".json") or os.sep in target:
        if not path.is_file():
            raise UsageError(f"{target}: no such snapshot file")
        return [path]
    directory = data_dir or os.environ.get("SNAPMESH_DATA_DIR")
    if not directory:
        raise UsageError(f"{target!r} is not a file; to find snapshot {target} by id give --data-dir DIR "
                         "(the cluster's data dir) or set SNAPMESH_DATA_DIR")
    root = Path(directory)
    if not root.is_dir():
        raise UsageError(f"--data-dir {directory}: no such directory")
    files = [p for p in (root / "controller" / "snapshots" / f"{target}.pb", root / "snapshots" / f"{target}.json")
             if p.is_file()]
    if not files:
        raise LookupError(f"no stored file of snapshot {target} under {root} "
                          f"(looked for controller/snapshots/{target}.pb and snapshots/{target}.json)")
    return files


def _verify(args) -> int:
    import snapmesh.bank.snapshot as bank_rules  # the v1 figures' arithmetic: the bank's, applied where a file has them
    from snapmesh.checking import snapshot_file

    files = stored_files(args.target, args.data_dir)
    verdicts = [snapshot_file.check(p, rules=bank_rules) for p in files]
    if args.json:
        print(json.dumps({"ok": all(v.ok for v in verdicts), "files": [v.as_dict() for v in verdicts]}, indent=2))
    else:
        for i, verdict in enumerate(verdicts):
            if i:
                print()
            print(f"{verdict.path}: {'OK' if verdict.ok else 'NOT RESTORABLE'}")
            print(_table(["check", "result", "detail"],
                         [[c.name, "ok" if c.ok else "FAILED", c.detail] for c in verdict.checks]))
    return 0 if all(v.ok for v in verdicts) else 1


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    prog = f"{PROG} {args.command}"
    if args.command == "verify":
        try:
            return _verify(args)
        except UsageError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        except LookupError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 1
    if args.command == "get" and not args.snapshot_id.strip():
        print(f"{prog}: ID is empty", file=sys.stderr)
        return 2
    try:
        found = target.find(args.controller, args.data_dir, args.tls_dir)
    except target.TargetError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    identity = found.identity

    import grpc

    from snapmesh.commands import client_errors
    from snapmesh.serving.runtime import CLIENT_OPTIONS
    from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

    try:
        with credentials.open_channel(found.address, identity, options=CLIENT_OPTIONS) as channel:
            return REMOTE[args.command](pb_grpc.ControllerStub(channel), args)
    except grpc.RpcError as error:
        print(f"{prog}: {client_errors.explain(error, found.address, identity)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0 if args.command == "watch" else 130
    except BrokenPipeError:  # `snapmesh snapshot list | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
