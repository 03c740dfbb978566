"""An app's own edge on the node: RPCs of the node's service that the app answers itself.

Every app's node answers Submit, SubmitBatch and Query through its `Edge`
(edge.py). An app may answer more of the service through an adapter of its own
(a v1 adapter answers the calls its clients have always made, Transfer say):
its `App.edge` names a factory as "module:attr", which the node shell imports by
name when the servicer is made (never a static import: the shell knows no app)
and calls once, `factory(engine, edge)`. The object it returns may define any of:

    async Transfer(request, context) -> TransferResponse
    async TransferBatch(request, context) -> TransferBatchResponse
    async GetState(request, context) -> NodeStateResponse | None   (None: the node's own answer)
    restore_args(request, in_flight, state) -> (in_flight, state)  (what a RestoreState restores)
    restored(epoch) -> RestoreStateResponse                         (what it answers)

Rules
-----
X1. An edge that does not load (no module, no attribute, a factory that raises)
    stops the node's start with one line naming the app and the spec: a node
    never runs without the edge its app asked for.
X2. Without an edge that answers them, `Transfer` and `TransferBatch` are refused
    INVALID_ARGUMENT ("use Submit"), each item of a batch alike; a batch over
    MAX_BATCH items is refused whole, naming the limit. Neither is counted in a
    series the node exports (such a node's scrape never showed them).
X3. Retired, not reused: it answered UNIMPLEMENTED on a machine that hosts no
    app, which no `Node` is (machine.py N10), as edge.py's retired E5 did.
"""

from __future__ import annotations

from typing import Any

import grpc

from snapmesh.app import App, AppError, named_object
from snapmesh.v1 import snapmesh_pb2 as pb

# A TransferBatch holds at most this many items (X2), as edge.MAX_BATCH_COMMANDS; an edge that
# answers TransferBatch holds it to the same bound (`refuse_oversized`): the node's receive limit
# (process.rpc_budgets) is made for it.
MAX_BATCH = 10_000


def load(app: App, engine: Any, edge: Any) -> Any:
    """The extra edge `app` names, made for this node (X1); None when it names none."""
    if not app.edge:
        return None
    try:
        return named_object(app.edge)(engine, edge)
    except Exception as exc:  # the app's own code: one line, the node does not start
        raise AppError(f"app {app.name!r}: its edge {app.edge!r} does not load: {type(exc).__name__}: {exc}") from exc


def refusal(engine: Any) -> tuple[grpc.StatusCode, str]:
    """Why a call no edge answers is refused (X2)."""
    return (grpc.StatusCode.INVALID_ARGUMENT,
            f"{engine.node_id} runs app {engine.node.host.app.name!r}, whose edge answers no transfers: use Submit")


async def refuse_one(engine: Any, context: grpc.aio.ServicerContext) -> None:
    """A single call no edge answers (X2): aborted."""
    code, text = refusal(engine)
    await context.abort(code, text)


async def refuse_oversized(count: int, context: grpc.aio.ServicerContext) -> None:
    """A TransferBatch of `count` items over MAX_BATCH (X2): aborted whole, naming the limit.
    The one check of the bound, the node's own and every edge's that answers TransferBatch."""
    if count > MAX_BATCH:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"a TransferBatch holds at most {MAX_BATCH} transfers, got {count}")


async def refuse_batch(engine: Any, request: pb.TransferBatchRequest,
                       context: grpc.aio.ServicerContext) -> pb.TransferBatchResponse:
    """A batch no edge answers (X2): each item refused alike, or the whole when too long."""
    items = request.transfers
    await refuse_oversized(len(items), context)
    response = pb.TransferBatchResponse()
    if not items:
        return response
    code, text = refusal(engine)
    for _ in items:
        response.results.add(code=code.value[0], message=text)
    return response
