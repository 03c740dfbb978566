"""The cluster file: who the nodes are, how they are joined, where data lives.

The reference, every key with its default: docs/cluster-file.md
(tests/shells/test_cluster_file_doc.py holds it to this reader).

TOML: top-level settings (`data_dir`, `channels`, the limits), `[controller]`, `[[nodes]]`; optional
`[tls]` and `[auth]` (mutual TLS, client names, the token) and `[app]` (default: the bank).

Environment overrides, for containers: SNAPMESH_DATA_DIR replaces `data_dir`; SNAPMESH_BIND_HOST is the
address every server binds to (default: its `host`), so a container can listen on 0.0.0.0 while peers dial
it by service name; SNAPMESH_TLS_DIR=D turns TLS and the token on with the files `snapmesh certs` writes
into D (D/ca.pem, D/{name}.pem, D/{name}-key.pem, D/client.pem, D/client-key.pem, D/token), in place of the
file's [tls] paths and token_file. SNAPMESH_APP=module:attr is the app in place of [app].module (how
`snapmesh cluster up --app` tells its children; [app]'s params stay the file's).

A malformed file raises `ConfigError` naming the file and the field.

This module also writes the file: `write` (any document `parse` accepts, checked before a byte is written)
and `write_cluster` (an N-node cluster on free loopback ports, what the launcher, the tests and the bench
start). Every cluster file snapmesh writes goes through `dumps`, so escaping is tomli-w's, not ours.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomli_w

from snapmesh.settings.appsettings import AppSettings as AppSettings, app_named as app_named, runs_bank as runs_bank
from snapmesh.settings.appsettings import check_app_spec, hosted as _hosted, parse_app
from snapmesh.settings.access import CLIENT_NAME, CONTROLLER_NAME, parse_clients
from snapmesh.settings import topologies
from snapmesh.settings.ports import free_ports
from snapmesh.protocol.controller.answers import DEFAULT_STATE_BYTES
from snapmesh.protocol.node.requests import REPLY_WINDOW_BYTES
from snapmesh.protocol.node.steps import DEFAULT_MAX_REPLY_BYTES, DEFAULT_SEGMENT_BYTES
from snapmesh.protocol.topology import Topology, TopologyError

SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = SHIPPED_CONFIGS / "local-4.toml"


def _relative_base(path: Path) -> Path:
    """What a relative data_dir is relative to: the file's directory, except for a
    file shipped in the package (installed, it lies in site-packages, which is
    no place for data): there the current directory."""
    parent = path.resolve().parent
    return Path.cwd() if parent == SHIPPED_CONFIGS else parent


SNAPSHOT_MODES = ("classic", "overtake", "hybrid")
ALIGN_TIMEOUT_MS = 50.0  # hybrid mode's default (snapmesh/protocol/hybrid.py)
DEFAULT_MAX_CONCURRENT_SNAPSHOTS = 32
NODE_ID_MAX = 64
_NODE_ID = re.compile(r"[A-Za-z0-9_.-]+")


class ConfigError(ValueError):
    """The cluster file is malformed; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    metrics_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_address(self) -> str:
        return f"{self.host}:{self.metrics_port}"


@dataclass(frozen=True, slots=True)
class NodeConfig(Endpoint):
    id: str
    # The port the node listens on when it differs from the one peers dial
    # (a proxy in between, as in the fault-injection tests). None: `port`.
    listen_port: int | None = None


@dataclass(frozen=True, slots=True)
class ControllerConfig(Endpoint):
    snapshot_deadline_s: float
    keep: int = 0  # retention: the snapshot files of the N newest COMPLETE ones are kept (0: all)
    # Admission (Flink's max-concurrent-checkpoints): a trigger past this many in progress is refused.
    max_concurrent_snapshots: int = DEFAULT_MAX_CONCURRENT_SNAPSHOTS
    answer_state_bytes: int = DEFAULT_STATE_BYTES  # states adding up to more are left out of answers


# The file names `snapmesh certs` writes into its output dir.
CA_FILE = "ca.pem"
TOKEN_FILE = "token"


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Where the certificates are (the files are read and checked by snapmesh.settings.security)."""

    ca: Path
    cert: str  # a path with {name}: a node id, "controller" or "client"
    key: str
    client_cert: Path
    client_key: Path

    @classmethod
    def in_dir(cls, directory: Path) -> TlsSettings:
        """The layout `snapmesh certs --out DIR` writes."""
        return cls(
            ca=directory / CA_FILE,
            cert=str(directory / "{name}.pem"),
            key=str(directory / "{name}-key.pem"),
            client_cert=directory / f"{CLIENT_NAME}.pem",
            client_key=directory / f"{CLIENT_NAME}-key.pem",
        )

    def cert_path(self, name: str) -> Path:
        return self.client_cert if name == CLIENT_NAME else Path(self.cert.replace("{name}", name))

    def key_path(self, name: str) -> Path:
        return self.client_key if name == CLIENT_NAME else Path(self.key.replace("{name}", name))


@dataclass(frozen=True, slots=True)
class AuthSettings:
    token_file: Path
    protect_reads: bool = False  # True: read-only RPCs need the token too
    clients: tuple[str, ...] = (CLIENT_NAME,)  # the names that may write the control plane (access AUTH1)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    path: Path
    data_dir: Path
    initial_balance: int
    controller: ControllerConfig
    nodes: tuple[NodeConfig, ...]
    topology: Topology
    bind_host: str | None  # None: every server binds to its own `host`
    channel_bound: int = 100_000
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES  # an app's longest reply (node rule N12)
    segment_records: int = 100_000
    segment_bytes: int = DEFAULT_SEGMENT_BYTES  # a segment seals at whichever of the two it reaches first
    reply_window_bytes: int = REPLY_WINDOW_BYTES  # the request-id window's byte budget (requests.py W2)
    snapshot_mode: str = "classic"  # one of SNAPSHOT_MODES
    align_timeout_ms: float = ALIGN_TIMEOUT_MS  # hybrid mode: how long a marker keeps its FIFO place
    tls: TlsSettings | None = None  # None: plaintext
    auth: AuthSettings | None = None  # None: no token asked for
    app: AppSettings = AppSettings()  # default: the bank

    def node(self, node_id: str) -> NodeConfig:
        for node in self.nodes:
            if node.id == node_id:
                return node
        known = ", ".join(n.id for n in self.nodes)
        raise ConfigError(f"{self.path}: no node {node_id!r} (nodes: {known})")

    def bind_address(self, endpoint: Endpoint) -> str:
        port = getattr(endpoint, "listen_port", None) or endpoint.port
        return f"{self.bind_host or endpoint.host}:{port}"

    def metrics_bind(self, endpoint: Endpoint) -> tuple[str, int]:
        return (self.bind_host or endpoint.host, endpoint.metrics_port)

    @property
    def expected_total(self) -> int:
        return self.initial_balance * len(self.nodes)

    def log_path(self, node_id: str) -> Path:
        return self.data_dir / f"{node_id}.log.jsonl"

    @property
    def snapshots_dir(self) -> Path:
        return self.data_dir / "snapshots"


def load(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> ClusterConfig:
    path = Path(path) if path is not None else DEFAULT_CONFIG
    env = os.environ if env is None else env
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse(raw, path=path, env=env)


def parse(raw: Mapping[str, Any], *, path: Path, env: Mapping[str, str]) -> ClusterConfig:
    fields = _Fields(path)
    known = {"data_dir", "initial_balance", "channels", "controller", "nodes", "channel_bound", "segment_records",
             "segment_bytes", "snapshot_mode", "align_timeout_ms", "tls", "auth", "app", "max_reply_bytes", "reply_window_bytes"}
    fields.reject_unknown(raw, known, "")

    data_dir_text = env.get("SNAPMESH_DATA_DIR") or fields.string(raw, "data_dir", "data_dir")
    data_dir = Path(data_dir_text)
    if not data_dir.is_absolute():
        data_dir = (_relative_base(path) / data_dir).resolve()
    app = parse_app(raw, env, fields.error)  # first: initial_balance is the bank's, an app's file may leave it out
    initial_balance = fields.integer(raw, "initial_balance", "initial_balance", minimum=0, default=None if runs_bank(app) else 0)
    channel_bound = fields.integer(raw, "channel_bound", "channel_bound", minimum=1, default=100_000)
    segment_records = fields.integer(raw, "segment_records", "segment_records", minimum=2, default=100_000)
    max_reply_bytes = fields.integer(raw, "max_reply_bytes", "max_reply_bytes", minimum=1, default=DEFAULT_MAX_REPLY_BYTES)
    # at least a few records (a checkpoint alone is about 1 KiB)
    segment_bytes = fields.integer(raw, "segment_bytes", "segment_bytes", minimum=4096, default=DEFAULT_SEGMENT_BYTES)
    reply_window_bytes = fields.integer(raw, "reply_window_bytes", "reply_window_bytes", minimum=1, default=REPLY_WINDOW_BYTES)

    snapshot_mode = raw.get("snapshot_mode", "classic")
    if snapshot_mode not in SNAPSHOT_MODES:
        raise fields.error("snapshot_mode", f"must be one of {', '.join(map(repr, SNAPSHOT_MODES))}, got {snapshot_mode!r}")
    align_timeout_ms = raw.get("align_timeout_ms", ALIGN_TIMEOUT_MS)
    if isinstance(align_timeout_ms, bool) or not isinstance(align_timeout_ms, (int, float)) or not (
            0 <= align_timeout_ms < float("inf")):
        raise fields.error("align_timeout_ms", f"must be a number of milliseconds >= 0, got {align_timeout_ms!r}")
    if "align_timeout_ms" in raw and snapshot_mode != "hybrid":
        raise fields.error("align_timeout_ms", f"applies to snapshot_mode = \"hybrid\" only, not {snapshot_mode!r}")

    controller_raw = fields.table(raw, "controller", "controller")
    fields.reject_unknown(controller_raw, {"host", "port", "metrics_port", "snapshot_deadline_s", "keep",
                                           "max_concurrent_snapshots", "answer_state_bytes"}, "controller")
    deadline = controller_raw.get("snapshot_deadline_s", 10)
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or deadline <= 0:
        raise fields.error("controller.snapshot_deadline_s", f"must be a positive number of seconds, got {deadline!r}")
    controller = ControllerConfig(
        host=fields.string(controller_raw, "host", "controller.host"),
        port=fields.port(controller_raw, "port", "controller.port"),
        metrics_port=fields.port(controller_raw, "metrics_port", "controller.metrics_port"),
        snapshot_deadline_s=float(deadline),
        keep=fields.integer(controller_raw, "keep", "controller.keep", minimum=1) if "keep" in controller_raw else 0,
        max_concurrent_snapshots=fields.integer(controller_raw, "max_concurrent_snapshots", "controller.max_concurrent_snapshots",
                                                minimum=1, default=DEFAULT_MAX_CONCURRENT_SNAPSHOTS),
        answer_state_bytes=fields.integer(controller_raw, "answer_state_bytes", "controller.answer_state_bytes",
                                          minimum=0, default=DEFAULT_STATE_BYTES),
    )

    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise fields.error("nodes", "must be a non-empty array of [[nodes]] tables")
    nodes = []
    for index, node_raw in enumerate(nodes_raw):
        where = f"nodes[{index}]"
        if not isinstance(node_raw, dict):
            raise fields.error(where, "must be a table")
        fields.reject_unknown(node_raw, {"id", "host", "port", "metrics_port", "listen_port"}, where)
        nodes.append(
            NodeConfig(
                id=fields.node_id(node_raw, "id", f"{where}.id"),
                host=fields.string(node_raw, "host", f"{where}.host"),
                port=fields.port(node_raw, "port", f"{where}.port"),
                metrics_port=fields.port(node_raw, "metrics_port", f"{where}.metrics_port"),
                listen_port=(
                    fields.port(node_raw, "listen_port", f"{where}.listen_port") if "listen_port" in node_raw else None
                ),
            )
        )

    channels = raw.get("channels")
    if channels is not None and not isinstance(channels, list):
        raise fields.error("channels", "must be an array of [src, dst] pairs")
    try:
        topology = Topology.build([n.id for n in nodes], channels)
    except TopologyError as exc:
        raise fields.error("channels" if channels is not None else "nodes", str(exc)) from None

    _check_distinct_addresses(fields, controller, nodes)
    for reserved in (CONTROLLER_NAME, CLIENT_NAME):
        if any(n.id == reserved for n in nodes):
            raise fields.error("nodes", f"{reserved!r} cannot be a node id: it names the {reserved}'s certificate")
    tls, auth = _security(fields, raw, path, env, [n.id for n in nodes])
    return ClusterConfig(
        path=path,
        data_dir=data_dir,
        initial_balance=initial_balance,
        controller=controller,
        nodes=tuple(nodes),
        topology=topology,
        bind_host=env.get("SNAPMESH_BIND_HOST") or None,
        channel_bound=channel_bound,
        max_reply_bytes=max_reply_bytes, reply_window_bytes=reply_window_bytes,
        segment_records=segment_records, segment_bytes=segment_bytes,
        snapshot_mode=snapshot_mode,
        align_timeout_ms=float(align_timeout_ms),
        tls=tls,
        auth=auth,
        app=app,
    )


def hosted(cfg: ClusterConfig) -> AppSettings:
    """The app `cfg`'s nodes run and its params (appsettings.hosted: no [app], the bank app)."""
    return _hosted(cfg.app, cfg.initial_balance)


def with_app(cfg: ClusterConfig, spec: str | None) -> ClusterConfig:
    """`cfg` running the app `spec` (a --app option) in place of the file's; as it is for None."""
    if not spec:
        return cfg
    check_app_spec(spec, lambda problem: ConfigError(f"--app: {problem}"))  # the file's params stay
    return replace(cfg, app=AppSettings(module=spec, params=cfg.app.params))


def with_controller(cfg: ClusterConfig, **flags: Any) -> ClusterConfig:
    """`cfg` with the controller's settings a command line gave (a None: the file's)."""
    return replace(cfg, controller=replace(cfg.controller, **{k: v for k, v in flags.items() if v is not None}))


def _security(
    fields: _Fields, raw: Mapping[str, Any], path: Path, env: Mapping[str, str], node_ids: list[str]
) -> tuple[TlsSettings | None, AuthSettings | None]:
    """[tls] and [auth], or SNAPMESH_TLS_DIR in their place."""
    base = path.resolve().parent

    def resolve(text: str) -> str:
        return text if Path(text).is_absolute() else str(base / text)

    auth_raw = raw.get("auth", {})
    if not isinstance(auth_raw, dict):
        raise fields.error("auth", "must be a table")
    fields.reject_unknown(auth_raw, {"token_file", "protect_reads", "clients"}, "auth")
    protect_reads = auth_raw.get("protect_reads", False)
    if not isinstance(protect_reads, bool):
        raise fields.error("auth.protect_reads", f"must be true or false, got {protect_reads!r}")
    clients = parse_clients(auth_raw.get("clients", [CLIENT_NAME]), node_ids, fields.error)

    tls_dir = env.get("SNAPMESH_TLS_DIR")
    if tls_dir:
        directory = Path(tls_dir).resolve()
        return TlsSettings.in_dir(directory), AuthSettings(directory / TOKEN_FILE, protect_reads, clients)

    tls = None
    if "tls" in raw:
        tls_raw = fields.table(raw, "tls", "tls")
        keys = ("ca", "cert", "key", "client_cert", "client_key")
        fields.reject_unknown(tls_raw, set(keys), "tls")
        values = {key: resolve(fields.string(tls_raw, key, f"tls.{key}")) for key in keys}
        for key in ("cert", "key"):
            if "{name}" not in values[key]:
                raise fields.error(f"tls.{key}", "must contain {name} (each process has its own)")
        tls = TlsSettings(
            ca=Path(values["ca"]), cert=values["cert"], key=values["key"],
            client_cert=Path(values["client_cert"]), client_key=Path(values["client_key"]),
        )
    auth = None
    if "auth" in raw:
        auth = AuthSettings(Path(resolve(fields.string(auth_raw, "token_file", "auth.token_file"))), protect_reads, clients)
        if tls is None:
            raise fields.error("auth", "needs a [tls] section: a bearer token is never sent in plaintext")
    return tls, auth


def _check_distinct_addresses(fields: _Fields, controller: ControllerConfig, nodes: list[NodeConfig]) -> None:
    taken: dict[tuple[str, int], str] = {}
    endpoints: list[tuple[str, Endpoint]] = [("controller", controller)]
    endpoints += [(f"node {n.id}", n) for n in nodes]
    for owner, endpoint in endpoints:
        for kind, port in (("port", endpoint.port), ("metrics_port", endpoint.metrics_port)):
            key = (endpoint.host, port)
            if key in taken:
                raise fields.error(f"{owner} {kind}", f"{endpoint.host}:{port} is already used by {taken[key]}")
            taken[key] = f"{owner} {kind}"


class _Fields:
    """Typed field readers whose errors name the file and the field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, field: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: {field}: {problem}")

    def reject_unknown(self, table: Mapping[str, Any], known: set[str], where: str) -> None:
        for key in table:
            if key not in known:
                name = f"{where}.{key}" if where else key
                raise self.error(name, f"unknown field (known: {', '.join(sorted(known))})")

    def table(self, raw: Mapping[str, Any], key: str, name: str) -> Mapping[str, Any]:
        value = raw.get(key)
        if not isinstance(value, dict):
            raise self.error(name, "missing table" if value is None else "must be a table")
        return value

    def string(self, raw: Mapping[str, Any], key: str, name: str) -> str:
        value = raw.get(key)
        if not isinstance(value, str) or not value:
            raise self.error(name, "missing" if value is None else f"must be a non-empty string, got {value!r}")
        return value

    def node_id(self, raw: Mapping[str, Any], key: str, name: str) -> str:
        """A node id: it names files (`<id>.log.jsonl`, certificates, `/etc/netns/<id>`
        under --hosts) and is a part of msg ids (`src:dst:seq`), so only
        NODE_ID_CHARS, no leading ".", at most NODE_ID_MAX characters."""
        value = self.string(raw, key, name)
        if len(value) > NODE_ID_MAX:
            raise self.error(name, f"{value[:NODE_ID_MAX]!r}... is {len(value)} characters, at most {NODE_ID_MAX}")
        if not _NODE_ID.fullmatch(value) or value.startswith("."):
            raise self.error(name, f"{value!r} is not a node id: letters, digits, '_', '.' and '-' only "
                             "(no ':', '/' or spaces), not starting with '.'")
        return value

    def integer(self, raw: Mapping[str, Any], key: str, name: str, *, minimum: int, default: int | None = None) -> int:
        value = raw.get(key, default)
        if value is None:
            raise self.error(name, "missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(name, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def port(self, raw: Mapping[str, Any], key: str, name: str) -> int:
        value = self.integer(raw, key, name, minimum=1)
        if value > 65535:
            raise self.error(name, f"must be a TCP port (1-65535), got {value}")
        return value


# ------------------------------------------------------------------ writing


def dumps(document: Mapping[str, Any], *, comment: str = "") -> str:
    """The TOML text of a cluster document (`comment` lines first, each prefixed `# `)."""
    head = "".join(f"# {line}".rstrip() + "\n" for line in comment.splitlines()) if comment else ""
    return head + tomli_w.dumps(dict(document))


def write(path: str | os.PathLike[str], document: Mapping[str, Any], *, comment: str = "") -> Path:
    """Write a cluster file; ConfigError (and nothing written) when `parse` would refuse it."""
    path = Path(path)
    parse(document, path=path, env={})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(document, comment=comment), encoding="utf-8")
    return path


def write_cluster(
    path: str | os.PathLike[str],
    *,
    nodes: int | Sequence[str] = 4,
    topology: str | Iterable[Sequence[str]] = "mesh",
    initial_balance: int = 1000,
    deadline: float = 10.0,
    data_dir: str | os.PathLike[str] | None = None,
    ports: Sequence[int] | None = None,
    host: str = "127.0.0.1",
    listen_ports: Mapping[str, int] | None = None,
    settings: Mapping[str, int] | None = None,
    snapshot_mode: str | None = None,
    topology_seed: int = 0,
) -> Path:
    """Write a cluster file for a local cluster and return its path.

    `nodes`: a count (ids p1..pN) or the ids. `topology`: a name of snapmesh.settings.topologies
    ("mesh", "ring", "random-regular:K" drawn from `topology_seed`) or explicit [src, dst] pairs.
    `data_dir` defaults to the file's directory. `ports`: 2 + 2N ports
    (controller port and metrics port, then each node's); default: free ones.
    `listen_ports`: node id -> the port that node listens on when peers dial
    another (a proxy in between, as in the fault tests). `settings`: more
    top-level keys (channel_bound, segment_records, segment_bytes, reply_window_bytes).
    """
    path = Path(path)
    ids = [f"p{i}" for i in range(1, nodes + 1)] if isinstance(nodes, int) else list(nodes)
    if not ids:
        raise ValueError("a cluster needs at least one node")
    ports = list(ports) if ports is not None else free_ports(2 + 2 * len(ids), host)
    if len(ports) != 2 + 2 * len(ids):
        raise ValueError(f"need {2 + 2 * len(ids)} ports, got {len(ports)}")
    document: dict[str, Any] = {
        "data_dir": str(Path(data_dir if data_dir is not None else path.parent).resolve()),
        "initial_balance": int(initial_balance),
        **(settings or {}),
    }
    if snapshot_mode is not None:  # "classic", "overtake" or "hybrid"; left out: the default (classic)
        document["snapshot_mode"] = snapshot_mode
    named = topologies.channels(topology, ids, topology_seed) if isinstance(topology, str) else topology
    if named is not None:  # None: the mesh, which the file says by leaving `channels` out
        document["channels"] = [list(pair) for pair in named]
    document["controller"] = {
        "host": host,
        "port": ports[0],
        "metrics_port": ports[1],
        "snapshot_deadline_s": float(deadline),
    }
    document["nodes"] = []
    for index, node_id in enumerate(ids):
        node = {"id": node_id, "host": host, "port": ports[2 + 2 * index], "metrics_port": ports[3 + 2 * index]}
        if listen_ports and node_id in listen_ports:
            node["listen_port"] = listen_ports[node_id]
        document["nodes"].append(node)
    return write(path, document, comment="Written by snapmesh.settings.config.write_cluster")
