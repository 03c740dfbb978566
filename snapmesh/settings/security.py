"""Mutual TLS and the control-plane token: everything about them, in one place.

Every gRPC server and channel of snapmesh is opened here:

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

An `Identity` is what one process presents and trusts: `load_identity(cfg, name)`
for a node id, "controller" or "client" reads the files the cluster file names
(None for a plaintext cluster); `load_tls_dir(DIR)` for the CLI clients. Files
are checked when loaded: a missing or malformed certificate, key or token, a key
that does not match its certificate, or a certificate the CA did not sign is a
`SecurityError` naming the file (exit 2 at start-up), never a fall-back to
plaintext.

`snapmesh certs --config FILE --out DIR` makes dev certificates (snapmesh.settings.devcerts) with
`cryptography`: a CA, one certificate per node and for the controller (SANs: the
name, its host, localhost, 127.0.0.1), a client certificate and a random token.
"""

from __future__ import annotations

import argparse
import hmac
import os
import secrets
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from snapmesh.settings import config as cluster_config
from snapmesh.settings import devcerts
from snapmesh.settings.argparsing import parse_args
from snapmesh.settings.config import CA_FILE, CLIENT_NAME, CONTROLLER_NAME, TOKEN_FILE, ClusterConfig, ConfigError, TlsSettings

# The calls that change the cluster: a token is asked for them.
CONTROL_PLANE = frozenset({
    "/snapmesh.v1.Controller/TriggerSnapshot",
    "/snapmesh.v1.Controller/RestoreSnapshot",
    "/snapmesh.v1.Node/StartSnapshot",
    "/snapmesh.v1.Node/AbortSnapshot",
    "/snapmesh.v1.Node/RestoreState",
})
# Read-only calls: open to any client with a certificate unless `protect_reads`.
READ_ONLY = frozenset({
    "/snapmesh.v1.Controller/GetSnapshot",
    "/snapmesh.v1.Controller/GetSnapshotChunks",
    "/snapmesh.v1.Controller/ListSnapshots",
    "/snapmesh.v1.Controller/WatchSnapshots",
    "/snapmesh.v1.Controller/GetCluster",
    "/snapmesh.v1.Node/GetState",
})


class SecurityError(ValueError):
    """A certificate, key or token file is missing or malformed; the message names the file."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What one process presents and trusts, read and checked."""

    name: str  # a node id, "controller" or "client"
    ca: bytes
    cert: bytes
    key: bytes
    token: str | None  # None: no token configured
    protect_reads: bool = False
    # The files they were read from (None when built in memory): the metrics
    # endpoint's TLS (Python's ssl loads a certificate chain from files only).
    files: tuple[Path, Path, Path] | None = None  # (ca, cert, key)


# ---------------------------------------------------------------- loading


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SecurityError(f"{path}: no such file ({what}; `snapmesh certs` makes them)") from None
    except OSError as exc:
        raise SecurityError(f"{path}: cannot read {what}: {exc.strerror}") from None


def _certificate(path: Path, what: str):
    from cryptography import x509

    data = _read(path, what)
    try:
        return data, x509.load_pem_x509_certificate(data)
    except ValueError:
        raise SecurityError(f"{path}: not a PEM certificate ({what})") from None


def _check_key(key_path: Path, cert_path: Path, cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    data = _read(key_path, f"the private key of {cert_path.name}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise SecurityError(f"{key_path}: not a PEM private key (unencrypted) for {cert_path}") from None
    if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) != (
        cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    ):
        raise SecurityError(f"{key_path}: this key does not belong to the certificate {cert_path}")
    return data


def read_token(path: Path) -> str:
    text = _read(path, "the control-plane token").decode("utf-8", errors="replace").strip()
    if not text or any(c.isspace() for c in text) or not text.isprintable():
        raise SecurityError(f"{path}: the token must be one line of printable characters with no spaces")
    return text


def load_files(
    name: str, *, ca: Path, cert: Path, key: Path, token_file: Path | None, protect_reads: bool = False
) -> Identity:
    """Read and check one process's files."""
    from cryptography.exceptions import InvalidSignature

    ca_pem, ca_cert = _certificate(ca, "the CA certificate")
    cert_pem, leaf = _certificate(cert, f"the certificate of {name}")
    try:
        leaf.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise SecurityError(f"{cert}: not signed by the CA in {ca} ({type(exc).__name__})") from None
    key_pem = _check_key(key, cert, leaf)
    token = read_token(token_file) if token_file is not None else None
    return Identity(name=name, ca=ca_pem, cert=cert_pem, key=key_pem, token=token, protect_reads=protect_reads,
                    files=(Path(ca), Path(cert), Path(key)))


def load_identity(cfg: ClusterConfig, name: str) -> Identity | None:
    """The identity of `name` (a node id, "controller" or "client") from the cluster
    file's [tls] and [auth]; None for a plaintext cluster."""
    if cfg.tls is None:
        return None
    auth = cfg.auth
    return load_files(
        name,
        ca=cfg.tls.ca,
        cert=cfg.tls.cert_path(name),
        key=cfg.tls.key_path(name),
        token_file=auth.token_file if auth else None,
        protect_reads=auth.protect_reads if auth else False,
    )


def load_tls_dir(directory: str | os.PathLike[str]) -> Identity:
    """The client identity in a dir `snapmesh certs` (or `cluster up --tls`) wrote."""
    directory = Path(directory)
    settings = TlsSettings.in_dir(directory)
    token = directory / TOKEN_FILE
    return load_files(CLIENT_NAME, ca=settings.ca, cert=settings.client_cert, key=settings.client_key,
                      token_file=token if token.exists() else None)


def client_identity(tls_dir: str | None) -> Identity | None:
    """For the CLI clients: --tls-dir, else SNAPMESH_TLS_DIR, else None (plaintext)."""
    directory = tls_dir or os.environ.get("SNAPMESH_TLS_DIR")
    return load_tls_dir(directory) if directory else None


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


# ---------------------------------------------------------------- dev certificates


def _write(path: Path, data: bytes, *, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def write_certs(cfg: ClusterConfig, out_dir: str | os.PathLike[str], *, token: str | None = None) -> list[Path]:
    """A new CA, a certificate and key for every node, the controller and a client,
    and a token, into `out_dir` (the layout TlsSettings.in_dir reads). The CA's key is
    not kept: run again to add a process. Returns the files written."""
    from cryptography.hazmat.primitives import serialization

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = devcerts.make_ca()
    written = [out / CA_FILE]
    _write(written[0], ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    holders = [(node.id, node.host) for node in cfg.nodes]
    holders += [(CONTROLLER_NAME, cfg.controller.host), (CLIENT_NAME, None)]
    for name, host in holders:
        cert_pem, key_pem = devcerts.issue(ca_key, ca_cert, name, host)
        _write(out / f"{name}.pem", cert_pem, private=False)
        _write(out / f"{name}-key.pem", key_pem, private=True)
        written += [out / f"{name}.pem", out / f"{name}-key.pem"]
    _write(out / TOKEN_FILE, ((token or secrets.token_urlsafe(32)) + "\n").encode(), private=True)
    written.append(out / TOKEN_FILE)
    return written


def grpcurl_tls_flags(tls_dir: str | os.PathLike[str]) -> list[str]:
    """grpcurl's certificate flags for a client of a TLS cluster (certificates in `tls_dir`)."""
    directory = Path(tls_dir)
    return ["-cacert", str(directory / CA_FILE), "-cert", str(directory / f"{CLIENT_NAME}.pem"),
            "-key", str(directory / f"{CLIENT_NAME}-key.pem")]


def token_header(token_file: str | os.PathLike[str]) -> str:
    """grpcurl's `-H` flag that reads the token from its file when the shell runs it:
    a line printed on a terminal (or kept in a scrollback, a CI log) never holds the token."""
    return f'-H "authorization: Bearer $(cat {shlex.quote(str(token_file))})"'


def grpcurl_line(address: str, tls_dir: str | os.PathLike[str], token_file: str | os.PathLike[str] | None) -> str:
    """A grpcurl command that triggers a snapshot and waits for it (`token_file`: None
    when the cluster asks for no token)."""
    line = shlex.join(["grpcurl", *grpcurl_tls_flags(tls_dir)])
    if token_file is not None:
        line += " " + token_header(token_file)
    return line + " " + shlex.join(["-d", '{"wait": true}', address, "snapmesh.v1.Controller/TriggerSnapshot"])


# ---------------------------------------------------------------- CLI: snapmesh certs


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        self.exit(2, f"snapmesh certs: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="snapmesh certs",
        description="Make dev certificates: a CA, one per node and for the controller, a client one, and a token.",
    )
    parser.add_argument("--config", metavar="FILE", help="cluster file (default: the shipped 4-node config)")
    parser.add_argument("--tls-dir", "--out", dest="out", required=True, metavar="DIR",
                        help="where the files go (created if missing): the --tls-dir of the clients; "
                        "--out is its old name")
    parser.add_argument("--keep", action="store_true",
                        help="do nothing when DIR already holds every file (for deploy scripts run on each start)")
    return parser


def expected_files(cfg: ClusterConfig, out_dir: Path) -> list[Path]:
    names = [n.id for n in cfg.nodes] + [CONTROLLER_NAME, CLIENT_NAME]
    return [out_dir / CA_FILE, out_dir / TOKEN_FILE] + [out_dir / f"{n}{s}.pem" for n in names for s in ("", "-key")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        cfg = cluster_config.load(args.config)
    except ConfigError as exc:
        print(f"snapmesh certs: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    if args.keep and all(path.is_file() for path in expected_files(cfg, out)):
        print(f"snapmesh certs: {out} already holds every file; kept")
        return 0
    try:
        written = write_certs(cfg, args.out)
    except OSError as exc:
        print(f"snapmesh certs: cannot write into {args.out}: {exc}", file=sys.stderr)
        return 2
    print(f"snapmesh certs: wrote {len(written)} files into {out}")
    print("\nFor the cluster file (or set SNAPMESH_TLS_DIR=" + str(out) + "):\n")
    print(f'[tls]\nca = "{out / CA_FILE}"\ncert = "{out}/{{name}}.pem"\nkey = "{out}/{{name}}-key.pem"')
    print(f'client_cert = "{out / "client.pem"}"\nclient_key = "{out / "client-key.pem"}"\n')
    print(f'[auth]\ntoken_file = "{out / TOKEN_FILE}"\n')
    print("grpcurl: " + grpcurl_line(cfg.controller.address, out, out / TOKEN_FILE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
