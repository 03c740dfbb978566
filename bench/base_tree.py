"""An older commit's code, run beside today's: a temporary detached worktree, its generated
code made by its own protogen with this interpreter, and a cluster of its own nodes.

`checkout(rev)` yields the tree (removed at the end, even on failure); `cluster(tree, ...)`
starts that tree's `snapmesh.processes.supervisor.Cluster` in a helper process (its code
only: PYTHONPATH and cwd at the tree) and yields what `bench.submit_batch.drive` reads of a
cluster: `config.nodes` (id, metrics_address), `node_address(id)`, `nodes` (pid), plus
`peers` (id -> its outgoing peers). Closing the helper's stdin stops that cluster, so a
bench that dies takes it down too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent

_HELPER = r"""
import json, sys
from pathlib import Path
from snapmesh.processes.supervisor import Cluster
from snapmesh.settings.config import write_cluster
root, nodes, balance = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
path = write_cluster(root / "cluster.toml", nodes=nodes, topology="mesh", data_dir=root / "data",
                     initial_balance=balance)
cluster = Cluster(path).start()
try:
    print(json.dumps([{"id": n.id, "address": cluster.node_address(n.id), "metrics": n.metrics_address,
                       "pid": cluster.node_pid(n.id), "peers": sorted(cluster.config.topology.outgoing(n.id))}
                      for n in cluster.config.nodes]), flush=True)
    sys.stdin.read()  # until the bench closes it (or dies)
finally:
    cluster.stop()
"""


def has_commit(rev: str) -> bool:
    """Whether this clone holds `rev` (a shallow clone may not)."""
    found = subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True)
    return found.returncode == 0


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SNAPMESH_APP", "SNAPMESH_DATA_DIR")}
    env["PYTHONPATH"] = str(tree)  # that tree's code only, never this one's
    return env


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """`rev` in a temporary detached worktree with its generated code; removed at the end."""
    parent = Path(tempfile.mkdtemp(prefix="bench-base-"))
    tree = parent / "tree"
    try:
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), rev], cwd=REPO, check=True,
                       capture_output=True, text=True)
        subprocess.run([sys.executable, "-m", "snapmesh.commands.protogen"], cwd=tree, env=_env(tree), check=True,
                       capture_output=True, text=True)
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)


@contextlib.contextmanager
def cluster(tree: Path, *, nodes: int, initial_balance: int) -> Iterator[SimpleNamespace]:
    """A `nodes`-node mesh of `tree`'s code (its cluster file without [app]), stopped after."""
    with tempfile.TemporaryDirectory(prefix="bench-base-cluster-") as tmp:
        helper = subprocess.Popen(
            [sys.executable, "-c", _HELPER, tmp, str(nodes), str(initial_balance)], cwd=tree, env=_env(tree),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        try:
            line = helper.stdout.readline() if helper.stdout else ""
            if not line:
                raise RuntimeError(f"the cluster of {tree} did not start (exit {helper.wait()})")
            members = json.loads(line)
            addresses = {m["id"]: m["address"] for m in members}
            yield SimpleNamespace(
                config=SimpleNamespace(nodes=[SimpleNamespace(id=m["id"], metrics_address=m["metrics"])
                                              for m in members]),
                node_address=addresses.__getitem__,
                nodes={m["id"]: SimpleNamespace(pid=m["pid"]) for m in members},
                peers={m["id"]: m["peers"] for m in members},
            )
        finally:
            if helper.stdin:
                helper.stdin.close()  # the helper stops its cluster
            try:
                helper.wait(timeout=60)
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.wait()
