"""Every gRPC server and channel of snapmesh is opened here, with the identity
snapmesh.settings.security read:

- `new_server(options)`, `open_server_port(server, address, identity)` and
  `add_guarded(register, servicer, server, guard_of(identity))`: with TLS, the
  port asks every client for a certificate signed by the cluster's CA (mutual
  TLS), and every call of a servicer added with `add_guarded` is put to the
  cluster's gate before its handler runs (snapmesh.settings.access, who may call
  what): a certificate the call is not for is PERMISSION_DENIED (naming the
  caller and the rule), a missing or wrong token where one is asked for
  UNAUTHENTICATED; nothing changes. The check is in the handlers, not a server
  interceptor, so it holds on a server snapmesh shares (snapmesh.embed).
- `open_channel(address, identity, aio=...)`: presents the process's certificate,
  checks the server's against the CA and sends the token on every call when the
  identity holds one (a client's; the controller drops it towards nodes).
- `require_peer(context, name)`: the part of access rule AUTH3 a request decides: a
  node accepts a Channel stream from `src` only if the peer's certificate names
  `src`, and the controller accepts a node's ReportState only from that node's
  certificate.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from snapmesh.settings import access
from snapmesh.settings.security import Identity


# ---------------------------------------------------------------- servers


@dataclass(frozen=True, slots=True)
class Guard:
    """One server's checks of snapmesh's calls: the cluster's gate and, when `ca`
    is given, that the call came over mutual TLS with a certificate of that CA.
    The second matters on a server snapmesh shares: the program's own ports
    (plaintext, or TLS with its own CA) reach snapmesh's services too, and a
    certificate from another CA may name a node."""

    gate: access.Gate
    ca: bytes | None = None


def guard_of(identity: Identity | None, *, shared: bool = True) -> Guard | None:
    """The checks of a server holding `identity` (None: plaintext, none).
    `shared=False`: a server of snapmesh's own, whose every port is the cluster's
    mutual TLS (open_server_port), so the CA need not be checked again per call."""
    if identity is None:
        return None
    if identity.roles is None:
        raise ValueError(f"the identity of {identity.name} has no cluster roles: a server's comes from load_identity")
    return Guard(access.Gate(roles=identity.roles, token=identity.token, protect_reads=identity.protect_reads),
                 ca=identity.ca if shared else None)


def add_guarded(register: Callable[[Any, Any], None], servicer: Any, server: grpc.aio.Server,
                gate: Guard | None) -> None:
    """Register `servicer` on `server` with `register` (a generated
    `add_XServicer_to_server`), each of its methods put to `gate` before its
    handler runs: the one place snapmesh's checks happen. They live in the
    servicer's handlers, not in a server interceptor, so a server that is not
    snapmesh's (an embedding program's, with its own interceptors and services)
    applies them to snapmesh's calls only. None: plaintext, nothing checked."""
    register(servicer, server if gate is None else _GuardedServer(server, gate))


class _GuardedServer:
    """What a generated `add_XServicer_to_server` sees: `server`, its handlers
    wrapped by `guarded_handler` on their way in."""

    def __init__(self, server: grpc.aio.Server, gate: Guard) -> None:
        self._server = server
        self._gate = gate

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GuardedGeneric(h, self._gate) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(
            service, {name: guarded_handler(self._gate, f"/{service}/{name}", h) for name, h in handlers.items()}
        )


class _GuardedGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler, gate: Guard) -> None:
        self._inner = inner
        self._gate = gate

    def service(self, details: grpc.HandlerCallDetails):
        return guarded_handler(self._gate, details.method, self._inner.service(details))

    def service_name(self) -> str | None:
        return getattr(self._inner, "service_name", lambda: None)()


def guarded_handler(guard: Guard, method: str, handler: grpc.RpcMethodHandler | None):
    """Carries out the checks (snapmesh.settings.access, and the cluster's CA)
    before `handler` runs: a refused call gets the status and changes nothing.
    Without a CA only the methods the gate can refuse are wrapped; the others,
    client transfers among them, keep their handler as it is."""
    gate, ca = guard.gate, guard.ca
    if handler is None or (ca is None and not gate.guards(method)):
        return handler

    async def refusal(context: grpc.aio.ServicerContext) -> None:
        names = peer_names(context)
        if ca is not None and names is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                f"{method}: needs the cluster's mutual TLS, and the call came in plaintext")
        if ca is not None and not _issued_by(bytes(next(iter(context.auth_context().get("x509_pem_cert", [])), b"")), ca):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                 f"{method}: the caller's certificate is not from the cluster's CA")
        presented = next((v for k, v in context.invocation_metadata() or () if k == "authorization"), None)
        if refused := gate.check(method, names, None if presented is None else str(presented)):
            await context.abort(grpc.StatusCode[refused.code], refused.message)

    return _checked_first(handler, refusal)


@functools.lru_cache(maxsize=256)
def _issued_by(pem: bytes, ca: bytes) -> bool:
    """Whether the certificate `pem` is signed by the CA certificate `ca` (both PEM)."""
    try:
        x509.load_pem_x509_certificate(pem).verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _checked_first(handler: grpc.RpcMethodHandler, refusal) -> grpc.RpcMethodHandler:
    """`handler` whose behaviour awaits `refusal(context)` (which aborts) before it starts."""
    kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream") if getattr(handler, k))
    behavior = getattr(handler, kind)
    if inspect.isasyncgenfunction(behavior):
        async def checked_stream(request, context):
            await refusal(context)
            async for response in behavior(request, context):
                yield response

        return handler._replace(**{kind: checked_stream})

    async def checked(request, context):
        await refusal(context)
        return await behavior(request, context)

    return handler._replace(**{kind: checked})


def new_server(options: Sequence[tuple[str, Any]], outer: Sequence[grpc.aio.ServerInterceptor] = ()) -> grpc.aio.Server:
    """A grpc.aio server with the interceptors `outer`, which see every call,
    refused ones too (the gate's checks are in the handlers: `add_guarded`)."""
    return grpc.aio.server(options=list(options), interceptors=list(outer))


def open_server_port(server: grpc.aio.Server, address: str, identity: Identity | None) -> int:
    """Bind `address`: mutual TLS when `identity` is given, plaintext when None.
    Returns the port (0 when it cannot bind)."""
    if identity is None:
        return server.add_insecure_port(address)
    credentials = grpc.ssl_server_credentials(
        [(identity.key, identity.cert)], root_certificates=identity.ca, require_client_auth=True
    )
    return server.add_secure_port(address, credentials)


def metrics_tls(identity: Identity | None) -> dict[str, Any]:
    """The `start_http_server` arguments for a process's /metrics:
    with `protect_reads` the metrics (an app's figures among them) are read-protected
    too, so they are served over HTTPS that asks for a client certificate
    signed by the cluster's CA, the same mutual TLS as the gRPC port. Otherwise
    plain HTTP, as before."""
    if identity is None or not identity.protect_reads or identity.files is None:
        return {}
    ca, cert, key = identity.files
    return {"certfile": str(cert), "keyfile": str(key), "client_cafile": str(ca), "client_auth_required": True}


# ---------------------------------------------------------------- clients


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def __call__(self, context, callback) -> None:
        callback(self._metadata, None)


def channel_credentials(identity: Identity) -> grpc.ChannelCredentials:
    credentials = grpc.ssl_channel_credentials(identity.ca, identity.key, identity.cert)
    if identity.token is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.metadata_call_credentials(_BearerToken(identity.token), name="snapmesh-token")
        )
    return credentials


def open_channel(
    address: str,
    identity: Identity | None,
    *,
    options: Sequence[tuple[str, Any]] = (),
    aio: bool = False,
    server_name: str | None = None,
):
    """A channel to `address`: mutual TLS plus the token when `identity` is given,
    plaintext when None. `aio=True` for a grpc.aio channel, else a blocking one.
    `server_name`: the name to check the server's certificate against when the
    address is not in it (a container's IP: give its node id)."""
    options = list(options)
    if server_name is not None and identity is not None:
        options.append(("grpc.ssl_target_name_override", server_name))
    if identity is None:
        return grpc.aio.insecure_channel(address, options=options) if aio else grpc.insecure_channel(address, options=options)
    credentials = channel_credentials(identity)
    if aio:
        return grpc.aio.secure_channel(address, credentials, options=options)
    return grpc.secure_channel(address, credentials, options=options)


# ---------------------------------------------------------------- peers


def peer_names(context: grpc.aio.ServicerContext) -> set[str] | None:
    """The subjectAltNames of the peer's certificate; None on a plaintext connection."""
    auth = context.auth_context()
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    return {value.decode("utf-8", errors="replace") for value in auth.get("x509_subject_alternative_name", [])}


async def require_peer(context: grpc.aio.ServicerContext, name: str) -> None:
    """Abort with PERMISSION_DENIED unless the peer's certificate names `name`
    (no check on a plaintext server: there is no identity to check)."""
    names = peer_names(context)
    if names is not None and name not in names:
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"the peer's certificate names {', '.join(sorted(names)) or 'nothing'}, not {name!r}",
        )
