"""Every gRPC server and channel of snapmesh is opened here, with the identity
snapmesh.settings.security read:

- `new_server(identity, options)` and `open_server_port(server, address, identity)`:
  with TLS, the port asks every client for a certificate signed by the cluster's
  CA (mutual TLS) and, when a token is configured, refuses the control-plane calls
  (`TriggerSnapshot`, `RestoreSnapshot`, `StartSnapshot`, `AbortSnapshot`; and the
  read-only ones when `protect_reads`) without `authorization: Bearer <token>`
  with UNAUTHENTICATED before the handler runs, so nothing changes.
- `open_channel(address, identity, aio=...)`: presents the process's certificate,
  checks the server's against the CA and sends the token on every call.
- `require_peer(context, name)`: a node accepts a Channel stream from `src` only
  if the peer's certificate names `src` in its subjectAltName; the controller
  accepts a node's ReportState only from that node's certificate; a node accepts
  StartSnapshot, AbortSnapshot and RestoreState only from the controller's
  certificate (the token alone, which every node and client holds, is not enough).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any

import grpc

from snapmesh.settings.security import CONTROL_PLANE, READ_ONLY, Identity


# ---------------------------------------------------------------- servers


class _TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses protected calls without the bearer token, before their handler runs."""

    def __init__(self, token: str, protected: frozenset[str]) -> None:
        self._expected = f"Bearer {token}".encode()
        self._protected = protected

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method not in self._protected:
            return handler
        presented = next((v for k, v in details.invocation_metadata or () if k == "authorization"), None)
        if presented is not None and hmac.compare_digest(str(presented).encode(), self._expected):
            return handler
        why = "missing bearer token" if presented is None else "wrong bearer token"
        return _refusal(handler, f"{details.method}: {why} (send `authorization: Bearer <token>`)")


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only answers UNAUTHENTICATED."""

    async def refuse(_request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def refuse_stream(_request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover  (makes this an async generator)

    codec = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream, **codec)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **codec)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **codec)
    return grpc.unary_unary_rpc_method_handler(refuse, **codec)


def new_server(
    identity: Identity | None, options: Sequence[tuple[str, Any]], outer: Sequence[grpc.aio.ServerInterceptor] = ()
) -> grpc.aio.Server:
    """A grpc.aio server, with the token check when `identity` has a token
    (inside the interceptors `outer`, which see every call, refused ones too)."""
    interceptors = list(outer)
    if identity is not None and identity.token is not None:
        protected = CONTROL_PLANE | (READ_ONLY if identity.protect_reads else frozenset())
        interceptors.append(_TokenInterceptor(identity.token, protected))
    return grpc.aio.server(options=list(options), interceptors=interceptors)


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
    with `protect_reads` the metrics (balances among them) are read-protected
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
