"""What a failed call means, in words that say what to do: for the CLI clients.

gRPC's own details are accurate but not helpful where the mistake is the
user's: a plaintext client against a TLS server sees "Socket closed", a TLS
client against a plaintext one an SSL handshake error, and a call to the wrong
kind of server (a node's address given as the controller's) "Method not
found!". `explain` keeps gRPC's code and details and adds the fix. Whether the
server speaks TLS is not guessed from the words of the error: `speaks_tls`
asks it, with a TLS handshake that checks nothing and sends nothing else.
"""

from __future__ import annotations

import socket
import ssl

import grpc


def speaks_tls(address: str, timeout: float = 2.0) -> bool | None:
    """Whether the server at HOST:PORT answers a TLS ClientHello as a TLS server
    (None: it cannot be reached at all). A server asking for a client
    certificate it did not get still answered in TLS."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as raw:
            try:
                with context.wrap_socket(raw, server_hostname=host or None):
                    return True
            except ssl.SSLError as exc:
                return "ALERT" in (exc.reason or "").upper()  # an alert is a TLS server refusing us
            except OSError:
                return False  # closed on a ClientHello: not TLS
    except (OSError, ValueError):
        return None


def explain(error: grpc.RpcError, address: str, identity, *, service: str = "snapmesh.v1.Controller") -> str:
    """`CODE: details`, then, when the cause is likely the client's, what to change;
    certificates from another CA: one line that says so, without the TLS library's words."""
    if other_ca(error, identity):
        return another_ca_line(address)
    text = f"{error.code().name}: {error.details() or ''}"
    fix = hint(error, address, identity, service=service)
    return f"{text}\n{fix}" if fix else text


# What the TLS library says when the server's certificate is not signed by our CA
# (ours: CERTIFICATE_VERIFY_FAILED), or ours not by the server's (its alert).
_OTHER_CA = ("CERTIFICATE_VERIFY_FAILED", "ALERT_UNKNOWN_CA", "ALERT_BAD_CERTIFICATE", "ALERT_CERTIFICATE_UNKNOWN")


def other_ca(error: grpc.RpcError, identity) -> bool:
    """The TLS handshake failed because the two sides' certificates are from different CAs."""
    details = (error.details() or "").upper()
    return identity is not None and error.code() == grpc.StatusCode.UNAVAILABLE and any(w in details for w in _OTHER_CA)


def another_ca_line(address: str) -> str:
    return (f"the certificates of {address} are from another CA than this client's: check --tls-dir "
            "(or $SNAPMESH_TLS_DIR, or --data-dir's tls/) names this cluster's ca.pem, client.pem and client-key.pem")


def hint(error: grpc.RpcError, address: str, identity, *, service: str = "snapmesh.v1.Controller") -> str:
    """What to change when the failure is the client's mistake ("" otherwise)."""
    if other_ca(error, identity):
        return another_ca_line(address)
    code = error.code()
    tls = speaks_tls(address) if code == grpc.StatusCode.UNAVAILABLE else None
    if tls is not None and tls == (identity is None):
        if identity is None:
            return (f"TLS is on at {address} and this client spoke plaintext: give --tls-dir DIR "
                    "(or set SNAPMESH_TLS_DIR), DIR holding the cluster's ca.pem, client.pem, client-key.pem "
                    "and token (`snapmesh cluster up --tls` writes them to <data_dir>/tls/)")
        return f"{address} does not speak TLS: the server is plaintext; drop --tls-dir (and unset SNAPMESH_TLS_DIR)"
    if code == grpc.StatusCode.UNIMPLEMENTED and service == "snapmesh.v1.Controller":
        node = node_at(address, identity)
        what = f"node {node}'s address, not the controller's" if node else "not the controller's address"
        return (f"{address} is {what}: give the controller's address (`snapmesh cluster up` prints "
                "it first, `controller: HOST:PORT`)")
    if code == grpc.StatusCode.UNAUTHENTICATED and identity is not None and identity.token is None:
        return "the call needs the cluster's token: put it in the file `token` of your --tls-dir"
    return ""


def node_at(address: str, identity) -> str:
    """The id of the node serving at `address` ("" when none answers GetState there)."""
    from snapmesh.serving import credentials
    from snapmesh.v1 import snapmesh_pb2 as pb
    from snapmesh.v1 import snapmesh_pb2_grpc as pb_grpc

    try:
        with credentials.open_channel(address, identity) as channel:
            return pb_grpc.NodeStub(channel).GetState(pb.GetStateRequest(), timeout=2).node_id
    except grpc.RpcError:
        return ""
