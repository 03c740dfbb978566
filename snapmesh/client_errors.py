"""What a failed call means, in words that say what to do: for the CLI clients.

gRPC's own details are accurate but not helpful where the mistake is the
user's: a plaintext client against a TLS server sees "Socket closed", a TLS
client against a plaintext one an SSL handshake error, and a call to the wrong
kind of server (a node's address given as the controller's) "Method not
found!". `explain` keeps gRPC's code and details and adds the fix.
"""

from __future__ import annotations

import grpc

_TLS_SYMPTOMS = ("socket closed", "connection reset", "ssl", "handshake", "tls", "wrong_version_number",
                 "http2 framing", "recvmsg", "end of stream")


def explain(error: grpc.RpcError, address: str, identity, *, service: str = "snapmesh.v1.Controller") -> str:
    """`CODE: details`, then, when the cause is likely the client's, what to change."""
    code = error.code()
    details = error.details() or ""
    text = f"{code.name}: {details}"
    lowered = details.lower()
    if code == grpc.StatusCode.UNAVAILABLE and any(s in lowered for s in _TLS_SYMPTOMS):
        if identity is None:
            return (f"{text}\n{address} closed a plaintext connection: the server likely has TLS on. Give "
                    "--tls-dir DIR (or set SNAPMESH_TLS_DIR) with the cluster's client certificate "
                    "(ca.pem, client.pem, client-key.pem, token; `snapmesh cluster up --tls` makes them "
                    "in <data_dir>/tls/)")
        return (f"{text}\n{address} refused the TLS handshake: the server may be plaintext (then drop --tls-dir "
                "and unset SNAPMESH_TLS_DIR), or its certificate is not signed by the CA in your --tls-dir")
    if code == grpc.StatusCode.UNIMPLEMENTED and ("method not found" in lowered or not details):
        kind = "a node" if service == "snapmesh.v1.Controller" else "not a node (the controller?)"
        return (f"{text}\n{address} does not serve {service}: it is likely {kind}'s address. "
                "`snapmesh cluster up` prints every address; `grpcurl HOST:PORT list` shows what one serves")
    if code == grpc.StatusCode.UNAUTHENTICATED and identity is not None and identity.token is None:
        return f"{text}\nthe call needs the cluster's token: put it in the file `token` of your --tls-dir"
    return text
