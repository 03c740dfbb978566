"""snapmesh: consistent global snapshots (Chandy-Lamport) for a cluster of gRPC services."""

from __future__ import annotations

from typing import Any


async def embed(app: Any, *, cluster: Any, node_id: str, server: Any) -> Any:
    """Host node `node_id` of the cluster file `cluster` running `app` in `server`,
    the caller's grpc.aio server (not yet started): adds the node's services and
    its port, runs the node on the running loop. Returns the node: `submit`,
    `submit_many`, `close()`. docs/apps.md, "Embedding"; the rules are
    snapmesh/services/node/embedded.py's (M1-M3)."""
    from snapmesh.services.node.embedded import embed as embed_node  # grpc and the node load only when asked

    return await embed_node(app, cluster=cluster, node_id=node_id, server=server)
