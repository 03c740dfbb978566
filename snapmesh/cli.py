"""The `snapmesh` command: one entry point, each subcommand in its own module.

Subcommands are imported only when chosen, so `snapmesh sim` never pays for
importing Spark or gRPC. Each module exposes `main(argv) -> int` with its own
argument parser.
"""

from __future__ import annotations

import importlib
import os
import sys

from snapmesh.processes.orphans import die_with_parent_if_asked

# name -> (module with main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("snapmesh.commands.sim", "run a scenario in the deterministic simulator"),
    "node": ("snapmesh.services.node.process", "run one node (gRPC server)"),
    "controller": ("snapmesh.services.controller.process", "run the snapshot controller"),
    "app": ("snapmesh.commands.app", "run an app's workload (--app, $SNAPMESH_APP, the cluster file's [app]; else the bank's)"),
    "cluster": ("snapmesh.processes.launcher", "start a local cluster on loopback (cluster up)"),
    "demo": ("snapmesh.bank.demo", "cluster + workload + reconciliation, end to end"),
    "reconcile": ("snapmesh.reconcile.job", "check exported snapshots against the transfer logs (Spark)"),
    "synth": ("snapmesh.synth.writer", "write synthetic transfer logs and snapshots"),
    "restore": ("snapmesh.commands.restore", "roll the whole cluster back to a COMPLETE snapshot"),
    "snapshot": ("snapmesh.commands.snapshot_cli", "take, list, show, watch and verify snapshots"),
    "health": ("snapmesh.commands.health", "exit 0 when a server's gRPC health check says SERVING"),
    "certs": ("snapmesh.commands.certs", "make dev certificates (CA, nodes, controller, client) and a token"),
    "chaos": ("snapmesh.commands.chaos", "a seeded fault campaign on a local cluster, checked against the logs"),
    "trace": ("snapmesh.commands.trace", "the message flow from the logs: a ShiViz log, an SVG or PNG diagram"),
    "replay": ("snapmesh.commands.replay", "replay the node logs of a data dir through app code, offline (CI)"),
    "ui": ("snapmesh.ui.server", "a read-only web page of the snapshots (overview, history, one snapshot)"),
    "submit": ("snapmesh.commands.submit", "send a command (or --batch FILE) to a node's app; print the reply"),
    "query": ("snapmesh.commands.query", "a read of a node's app (on_query, not logged); print the reply"),
    "examples": ("snapmesh.commands.examples", "print where the examples shipped with snapmesh are"),
}


# An optional dependency's top-level module -> the extra that installs it: a
# command that needs one says which extra, instead of a traceback.
EXTRAS = {"pyspark": "reconcile"}


# The client commands: gRPC's C-core logs nothing on their stderr (a failed TLS
# handshake would log a line before the call fails); each says what went wrong in
# its own words (snapmesh.commands.client_errors). GRPC_VERBOSITY set by the user
# wins. Not the servers: `cluster` passes its environment on to them.
CLIENTS = ("app", "restore", "snapshot", "health", "ui", "submit", "query")


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: snapmesh COMMAND [ARGS...] | --version", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`snapmesh COMMAND --help` for a command's arguments."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    die_with_parent_if_asked()  # a supervised child goes when its supervisor goes
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from snapmesh.version import version

        print(f"snapmesh {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"snapmesh: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if name in CLIENTS:
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # before grpc is imported
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return module.main(rest)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in EXTRAS:
            raise
        print(f"snapmesh {name}: needs {missing}, which is not installed: pip install 'snapmesh[{EXTRAS[missing]}]'",
              file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`snapmesh snapshot list | head`): what is left
        # unprinted has no reader, so stop quietly, as a Unix tool does. stdout
        # goes to /dev/null so the interpreter's final flush cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
