"""A started cluster in the foreground: what `cluster up` and `cluster up --hosts` print and do until stopped.

One home for both launchers (`snapmesh.processes.launcher` on loopback,
`snapmesh.hosts.launch` one host per process), so their stdout stays the same
lines in the same order: `controller:`, the `grpcurl:` line of a TLS cluster,
a line per process with its gRPC and metrics addresses, then the page's `ui:`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from snapmesh.processes.page import PageProcess
from snapmesh.settings import config as cluster_config
from snapmesh.settings import security


def address_lines(cfg: cluster_config.ClusterConfig) -> str:
    """Where each process serves gRPC and its Prometheus metrics."""
    lines = [f"controller metrics: http://{cfg.controller.metrics_address}/metrics"]
    lines += [f"node {n.id}: {n.address} metrics: http://{n.metrics_address}/metrics" for n in cfg.nodes]
    return "\n".join(lines)


def serve_page(cluster, listen: str) -> PageProcess | None:
    """The snapshot page on `listen`, in a process of its own (its `ui:` line
    printed), or None for `off` or when it does not start: the cluster is worth
    more than its page."""
    if listen == "off":
        return None
    from snapmesh.ui.server import parse_listen

    page = PageProcess(cluster)
    try:
        host, port = parse_listen(listen)
        url = page.start(host, port)
    except (OSError, ValueError) as exc:
        print(f"snapmesh cluster: no snapshot page on {listen}: {exc}", file=sys.stderr, flush=True)
        return None
    print(f"ui: {url}", flush=True)
    return page


def watch_children(cluster, page: PageProcess | None = None) -> None:
    """Until a stop signal: say once on stderr when a child exits; start the page
    again when it exited (it holds no state, and its URL was printed)."""
    reported: set[str] = set()
    while True:
        time.sleep(0.5)
        for name, alive in cluster.alive().items():
            if not alive and name not in reported:
                reported.add(name)
                print(f"snapmesh cluster: {name} exited; see {cluster.log_dir}", file=sys.stderr, flush=True)
        said = page.restart_if_exited() if page is not None else None
        if said is not None:
            print(f"snapmesh cluster: {said}; see {cluster.log_dir}", file=sys.stderr, flush=True)


def serve_until_stopped(cluster, addressed: cluster_config.ClusterConfig, tls_dir: Path | None, listen: str) -> None:
    """Print the started cluster's lines, serve its page on `listen`, and watch its
    children until a stop signal's exception ends the watch; the page is closed then.

    `addressed`: the cluster file as clients reach it (a host's address, not the
    one the process binds); `tls_dir`: where the certificates are (None: plaintext)."""
    print(f"controller: {cluster.controller_address}", flush=True)
    if tls_dir is not None:
        token = cluster.client_identity.token if cluster.client_identity else None
        token_file = tls_dir / cluster_config.TOKEN_FILE if token is not None else None  # the path, never the token
        print(f"grpcurl: {security.grpcurl_line(cluster.controller_address, tls_dir, token_file)}", flush=True)
    print(address_lines(addressed), flush=True)
    page = serve_page(cluster, listen)
    try:
        watch_children(cluster, page)
    finally:
        if page is not None:
            page.close()
