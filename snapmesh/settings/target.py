"""Which controller (or node: `find_node`) a client command talks to, and with what identity.

`snapshot *`, `restore`, `app` and `ui` find the controller the same way, the
first that is given wins (as `ETCDCTL_ENDPOINTS` or kubectl's context do it):

  1. `--controller HOST:PORT`;
  2. `$SNAPMESH_CONTROLLER`;
  3. `--data-dir D`: the controller of `D/cluster.toml`, the file `snapmesh
     cluster up --data-dir D` runs and leaves there;
  4. the shipped default, `127.0.0.1:50050` (the port of `snapmesh cluster up`
     with no arguments).

The client certificate and token: `--tls-dir DIR`, else `$SNAPMESH_TLS_DIR`,
else, with `--data-dir D`, the [tls] of D/cluster.toml or the `D/tls/` that
`cluster up --tls` writes; else plaintext.

A value that is not HOST:PORT (a URL such as `http://host:port` included) or a
data dir without its cluster file is a `TargetError`: the caller prints its one
line and exits 2.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from snapmesh.settings import config as cluster_config
from snapmesh.settings import security

DEFAULT_CONTROLLER = "127.0.0.1:50050"
ENV_CONTROLLER = "SNAPMESH_CONTROLLER"
CLUSTER_FILE = "cluster.toml"  # what `cluster up --data-dir D` leaves in D

# The help text every client command shows for the two flags.
CONTROLLER_HELP = (f"the controller's gRPC address (default: ${ENV_CONTROLLER}, else the controller of "
                   f"--data-dir's {CLUSTER_FILE}, else {DEFAULT_CONTROLLER})")
DATA_DIR_HELP = f"the cluster's data dir: its {CLUSTER_FILE} names the controller (default: none)"


class TargetError(ValueError):
    """A bad address or data dir: a usage error (exit 2); the message is one line."""


@dataclass(frozen=True, slots=True)
class Target:
    address: str
    identity: security.Identity | None  # None: plaintext
    source: str  # where the address came from, for messages


def check_address(text: str, what: str = "--controller") -> str:
    """`text` when it is HOST:PORT; TargetError naming `what` otherwise."""
    scheme, sep, rest = text.partition("://")
    if sep:
        hint = f": give it without the scheme ({rest.rstrip('/')})" if valid(rest.rstrip("/")) else ""
        raise TargetError(f"{what} {text!r} is a URL, not HOST:PORT{hint}")
    if not valid(text):
        raise TargetError(f"{what} {text!r} is not HOST:PORT")
    return text


def valid(text: str) -> bool:
    """HOST:PORT, with a port in 1-65535 (an IPv6 host in brackets)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in host:
        return False
    if host.startswith("[") != host.endswith("]"):
        return False
    return 0 < int(port) < 65536


def cluster_file(data_dir: str | os.PathLike[str]) -> cluster_config.ClusterConfig:
    """D/cluster.toml, loaded; TargetError when D or the file is missing or malformed."""
    root = Path(data_dir)
    if not root.is_dir():
        raise TargetError(f"--data-dir {data_dir}: no such directory")
    path = root / CLUSTER_FILE
    if not path.is_file():
        raise TargetError(f"--data-dir {data_dir}: no {CLUSTER_FILE} there (`snapmesh cluster up --data-dir "
                          f"{data_dir}` writes it)")
    try:
        return cluster_config.load(path, env={})
    except cluster_config.ConfigError as exc:
        raise TargetError(str(exc)) from None


def find(
    controller: str | None,
    data_dir: str | os.PathLike[str] | None,
    tls_dir: str | None,
    env: Mapping[str, str] | None = None,
) -> Target:
    """The controller and the client identity, in the order the module's doc gives."""
    env = os.environ if env is None else env
    cfg = None
    if data_dir is not None:  # its file is needed for the address, else only read when there (for TLS)
        if (controller is None and not env.get(ENV_CONTROLLER)) or (Path(data_dir) / CLUSTER_FILE).is_file():
            cfg = cluster_file(data_dir)
    if controller is not None:
        address, source = check_address(controller), "--controller"
    elif env.get(ENV_CONTROLLER):
        address, source = check_address(env[ENV_CONTROLLER], f"${ENV_CONTROLLER}"), f"${ENV_CONTROLLER}"
    elif cfg is not None:
        address, source = cfg.controller.address, str(cfg.path)
    else:
        address, source = DEFAULT_CONTROLLER, "the default"
    try:
        if tls_dir or env.get("SNAPMESH_TLS_DIR"):
            identity = security.client_identity(tls_dir)
        elif cfg is not None and cfg.tls is not None:
            identity = security.load_identity(cfg, cluster_config.CLIENT_NAME)
        elif data_dir is not None and (Path(data_dir) / "tls" / cluster_config.CA_FILE).is_file():
            identity = security.load_tls_dir(Path(data_dir) / "tls")
        else:
            identity = None
    except security.SecurityError as exc:
        raise TargetError(str(exc)) from None
    return Target(address=address, identity=identity, source=source)


# -- a node, for `snapmesh submit` and `snapmesh query`

NODE_CONFIG_HELP = ("the cluster file that names the node's address (default: --data-dir's "
                    f"{CLUSTER_FILE}, else the shipped one `snapmesh cluster up` runs)")


def find_node(
    node_id: str | None,
    address: str | None,
    config_path: str | os.PathLike[str] | None,
    data_dir: str | os.PathLike[str] | None,
    tls_dir: str | None,
    env: Mapping[str, str] | None = None,
) -> Target:
    """A node and the client identity, found as `find` finds the controller: `--address
    HOST:PORT` wins; else node `node_id` of the cluster file, `--config FILE`, else
    `--data-dir D`'s cluster.toml, else the shipped one. The identity: `--tls-dir`,
    else $SNAPMESH_TLS_DIR, else the file's [tls] client, else D/tls/, else plaintext."""
    env = os.environ if env is None else env
    if config_path is not None and data_dir is not None:
        raise TargetError("give --config or --data-dir, not both")
    cfg = None
    if config_path is not None:
        if not Path(config_path).is_file():
            raise TargetError(f"--config {config_path}: no such file")
        try:
            cfg = cluster_config.load(config_path, env={})
        except cluster_config.ConfigError as exc:
            raise TargetError(str(exc)) from None
    elif data_dir is not None:
        cfg = cluster_file(data_dir)
    if address is not None:
        found, source = check_address(address, "--address"), "--address"
    else:
        if not node_id:
            raise TargetError("give --node ID (a node of the cluster file) or --address HOST:PORT")
        if cfg is None:
            cfg = cluster_config.load(None, env={})
        try:
            found, source = cfg.node(node_id).address, str(cfg.path)
        except cluster_config.ConfigError as exc:
            raise TargetError(str(exc)) from None
    try:
        if tls_dir or env.get("SNAPMESH_TLS_DIR"):
            identity = security.client_identity(tls_dir)
        elif cfg is not None and cfg.tls is not None:
            identity = security.load_identity(cfg, cluster_config.CLIENT_NAME)
        elif data_dir is not None and (Path(data_dir) / "tls" / cluster_config.CA_FILE).is_file():
            identity = security.load_tls_dir(Path(data_dir) / "tls")
        else:
            identity = None
    except security.SecurityError as exc:
        raise TargetError(str(exc)) from None
    return Target(address=found, identity=identity, source=source)
