"""Mutual TLS and the control-plane token: the files, read and checked.

An `Identity` is what one process presents and trusts: `load_identity(cfg, name)`
for a node id, "controller" or "client" reads the files the cluster file names
(None for a plaintext cluster); `load_tls_dir(DIR)` for the CLI clients. Files
are checked when loaded: a missing or malformed certificate, key or token, a key
that does not match its certificate, or a certificate the CA did not sign is a
`SecurityError` naming the file (exit 2 at start-up), never a fall-back to
plaintext. Who may call what, and where the token is asked for, is
snapmesh.settings.access; a server's identity carries the cluster's `Roles` for it.
A node's identity never holds the token: nothing a node calls needs it.

The gRPC side (servers, channels, the token check, the peer's name) is
snapmesh.serving.credentials; `snapmesh certs` (snapmesh.commands.certs) writes
dev certificates through `write_certs` here (snapmesh.settings.devcerts).
"""

from __future__ import annotations

import os
import secrets
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from snapmesh.settings import devcerts
from snapmesh.settings.access import Roles
from snapmesh.settings.config import CA_FILE, CLIENT_NAME, CONTROLLER_NAME, TOKEN_FILE, ClusterConfig, TlsSettings


class SecurityError(ValueError):
    """A certificate, key or token file is missing or malformed; the message names the file."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What one process presents and trusts, read and checked."""

    name: str  # a node id, "controller" or "client"
    ca: bytes
    cert: bytes
    key: bytes
    token: str | None  # None: no token configured, or a node's (nodes hold none)
    protect_reads: bool = False
    # The files they were read from (None when built in memory): the metrics
    # endpoint's TLS (Python's ssl loads a certificate chain from files only).
    files: tuple[Path, Path, Path] | None = None  # (ca, cert, key)
    # Who is who in the cluster, for a server's checks (load_identity); None for a client's.
    roles: Roles | None = None

    def without_token(self) -> Identity:
        """The same certificate, sending no token: what the controller presents to
        the nodes, which ask for none (access AUTH2) and must never be sent it."""
        return replace(self, token=None)


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
    name: str, *, ca: Path, cert: Path, key: Path, token_file: Path | None, protect_reads: bool = False,
    roles: Roles | None = None,
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
                    files=(Path(ca), Path(cert), Path(key)), roles=roles)


def cluster_roles(cfg: ClusterConfig) -> Roles:
    """Who is who in `cfg`: its node ids, the controller, its client names ([auth]
    clients; without [auth] the client certificate `snapmesh certs` makes)."""
    clients = cfg.auth.clients if cfg.auth is not None else (CLIENT_NAME,)
    return Roles(nodes=frozenset(n.id for n in cfg.nodes), controller=CONTROLLER_NAME, clients=frozenset(clients))


def load_identity(cfg: ClusterConfig, name: str) -> Identity | None:
    """The identity of `name` (a node id, "controller" or "client") from the cluster
    file's [tls] and [auth]; None for a plaintext cluster."""
    if cfg.tls is None:
        return None
    auth = cfg.auth
    roles = cluster_roles(cfg)
    # A node is never given the token (deployments mount none): nothing it calls asks
    # for it, and a node's key with the token must not pass for a client (access AUTH1).
    token_file = auth.token_file if auth is not None and name not in roles.nodes else None
    return load_files(
        name,
        ca=cfg.tls.ca,
        cert=cfg.tls.cert_path(name),
        key=cfg.tls.key_path(name),
        token_file=token_file,
        protect_reads=auth.protect_reads if auth else False,
        roles=roles,
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


def expected_files(cfg: ClusterConfig, out_dir: Path) -> list[Path]:
    names = [n.id for n in cfg.nodes] + [CONTROLLER_NAME, CLIENT_NAME]
    return [out_dir / CA_FILE, out_dir / TOKEN_FILE] + [out_dir / f"{n}{s}.pem" for n in names for s in ("", "-key")]
