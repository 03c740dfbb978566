"""`snapmesh submit --node ID TEXT`: a client's command to a node's app, its reply out.

    snapmesh submit --node p1 pass                         # Submit: the reply on stdout
    snapmesh submit --node p1 --request-id r1 pass         # a retry with r1 gets the first reply
    snapmesh submit --node p1 --batch commands.txt         # SubmitBatch: one command per line
    snapmesh submit --node p1 --base64 cGFzcw==            # binary: base64 in, base64 out
    snapmesh query --node p1 has                           # Query: a read (on_query), not logged

The node: `--address HOST:PORT`, else node ID of the cluster file: `--config
FILE`, else `--data-dir D`'s cluster.toml, else the shipped one (`snapmesh
cluster up` with no arguments); TLS as the other clients have it (`--tls-dir`,
$SNAPMESH_TLS_DIR, the file's [tls], D/tls/: snapmesh.settings.target.find_node).

TEXT is the command as UTF-8, and the reply is printed as UTF-8 (a byte that is
not is printed as \\xNN) with a newline. `--base64`: TEXT, and each line of
`--batch`, is the command in base64, and each reply is printed in base64.

`--request-id ID` makes the command exactly-once: a retry with the same ID, in
the node's request-id window (15 minutes), gets the first reply and the app does
not run it again (stderr says so). With `--batch`, item N (its line number, from
1) gets the id `ID:N`, so rerunning the same file with the same ID runs nothing
twice.

`--batch FILE` (`-` for stdin): one command per line, blank lines skipped; sent
by SubmitBatch, in calls of at most 10,000 commands and 4 MiB (the node's
limits, docs/api.md). One line out per command, in order: `OK: reply`, or
`CODE: text` for an item the node refused.

Exit status: 0 when every command went through; 1 when one was refused (a
single command prints one line, `CODE: text`, on stderr) or the node cannot be
reached; 2 for bad arguments or a bad certificate file.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import sys
from collections.abc import Iterator

from snapmesh.serving import credentials
from snapmesh.settings import target
from snapmesh.settings.argparsing import parse_args, positive_float

# The node's limits on one SubmitBatch (services/node/edge.py E3); a file over them goes in several calls.
from snapmesh.services.node.edge import MAX_BATCH_BYTES, MAX_BATCH_COMMANDS


def parser(prog: str, *, query: bool) -> argparse.ArgumentParser:
    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # exit 2 on bad arguments, one line
            self.exit(2, f"{prog}: {message}\n")

    what = "a read of a node's app (Query, on_query)" if query else "a command to a node's app (Submit, SubmitBatch)"
    p = _Parser(prog=prog, description=f"Send {what}; print the reply.")
    p.add_argument("text", nargs=None if query else "?", metavar="TEXT",
                   help="the query" if query else "the command (or give --batch)")
    p.add_argument("--node", metavar="ID", help="the node, by its id in the cluster file (default: none; give it or --address)")
    p.add_argument("--address", metavar="HOST:PORT", help="the node's gRPC address (default: --node's in the cluster file)")
    p.add_argument("--config", metavar="FILE", help=target.NODE_CONFIG_HELP)
    p.add_argument("--data-dir", metavar="DIR",
                   help=f"the cluster's data dir: its {target.CLUSTER_FILE} names the node (default: none)")
    p.add_argument("--tls-dir", metavar="DIR", help="client certificate of a TLS cluster "
                   "(default: $SNAPMESH_TLS_DIR, else the cluster file's [tls], else --data-dir's tls/, else plaintext)")
    p.add_argument("--base64", action="store_true",
                   help="TEXT (and each --batch line) is base64, and replies are printed in base64")
    if not query:
        p.add_argument("--request-id", metavar="ID", default="",
                       help="exactly-once: a retry with ID gets the first reply (--batch: line N gets ID:N; default: none)")
        p.add_argument("--batch", metavar="FILE",
                       help="one command per line (- for stdin), sent by SubmitBatch (default: TEXT, one Submit)")
    p.add_argument("--timeout", type=positive_float, default=30.0, metavar="S", help="give up after S seconds (default: 30)")
    return p


def _parser() -> argparse.ArgumentParser:
    return parser("snapmesh submit", query=False)


def decode(text: str, as_base64: bool) -> bytes:
    """A command as given: UTF-8 text, or base64 (ValueError naming the fault)."""
    if not as_base64:
        return text.encode()
    try:
        return base64.b64decode(text.strip(), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {text[:40]!r} ({exc})") from None


def encode(reply: bytes, as_base64: bool) -> str:
    """A reply as printed: UTF-8 (\\xNN for a byte that is not), or base64."""
    return base64.b64encode(reply).decode() if as_base64 else reply.decode(errors="backslashreplace")


def chunks(items: list[tuple[str, bytes]]) -> Iterator[list[tuple[str, bytes]]]:
    """The batch in calls the node takes: at most MAX_BATCH_COMMANDS and MAX_BATCH_BYTES each."""
    chunk: list[tuple[str, bytes]] = []
    size = 0
    for request_id, command in items:
        item = len(command) + len(request_id.encode())
        if chunk and (len(chunk) == MAX_BATCH_COMMANDS or size + item > MAX_BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append((request_id, command))
        size += item
    if chunk:
        yield chunk


def read_batch(path: str, as_base64: bool, request_id: str) -> list[tuple[str, bytes]]:
    """(request_id, command) per non-blank line of `path` ("-": stdin)."""
    if path == "-":
        lines = sys.stdin.read().splitlines()
    else:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    return [(f"{request_id}:{n}" if request_id else "", decode(line, as_base64))
            for n, line in enumerate(lines, 1) if line.strip()]


def run(argv: list[str] | None, *, query: bool) -> int:
    prog = "snapmesh query" if query else "snapmesh submit"
    args = parse_args(parser(prog, query=query), argv)
    if isinstance(args, int):
        return args
    batch = getattr(args, "batch", None)
    if not query and (args.text is None) == (batch is None):
        print(f"{prog}: give TEXT or --batch FILE (one of them)", file=sys.stderr)
        return 2
    try:
        found = target.find_node(args.node, args.address, args.config, args.data_dir, args.tls_dir)
        items = (read_batch(batch, args.base64, args.request_id) if batch is not None
                 else [(getattr(args, "request_id", ""), decode(args.text, args.base64))])
    except (target.TargetError, ValueError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if not items:
        print(f"{prog}: {batch} holds no command", file=sys.stderr)
        return 2

    import grpc

    from snapmesh.commands import client_errors
    from snapmesh.v1 import snapmesh_pb2 as pb
    from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

    status = {code.value[0]: code for code in grpc.StatusCode}  # google.rpc.Code number -> name
    refused = False
    try:
        with credentials.open_channel(found.address, found.identity, server_name=args.node) as channel:
            stub = pb_grpc.NodeStub(channel)
            if query:
                print(encode(stub.Query(pb.QueryRequest(query=items[0][1]), timeout=args.timeout).reply, args.base64))
            elif batch is None:
                request_id, command = items[0]
                answer = stub.Submit(pb.SubmitRequest(command=command, request_id=request_id), timeout=args.timeout)
                print(encode(answer.reply, args.base64))
                if answer.replayed:
                    print(f"{prog}: request id {request_id} was answered before: its first reply "
                          "(the app did not run it again)", file=sys.stderr)
            else:
                for chunk in chunks(items):
                    request = pb.SubmitBatchRequest(items=[pb.SubmitRequest(command=c, request_id=r) for r, c in chunk])
                    for result in stub.SubmitBatch(request, timeout=args.timeout).results:
                        if result.code:
                            refused = True
                            print(f"{status[result.code].name}: {result.message}")
                        else:
                            print(f"OK: {encode(result.reply, args.base64)}")
    except grpc.RpcError as error:  # `CODE: text`; a second line when the fault is likely the client's
        print(client_errors.explain(error, found.address, found.identity, service="snapmesh.v1.Node"), file=sys.stderr)
        return 1
    return 1 if refused else 0


def main(argv: list[str] | None = None) -> int:
    return run(argv, query=False)


if __name__ == "__main__":
    sys.exit(main())
