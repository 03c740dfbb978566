"""What every file deploy/compose/generate.py writes agrees on: the node ids, the ports, a node's service, the healthcheck."""

from __future__ import annotations

CONTROLLER_PORT = 50050
CONTROLLER_METRICS_PORT = 9100
NODE_PORT_BASE = 50050  # node i listens on 50050 + i
NODE_METRICS_BASE = 9100  # and serves /metrics on 9100 + i
INITIAL_BALANCE = 1000
SNAPSHOT_DEADLINE_S = 10


# The app every process runs (snapmesh.settings.appsettings): a built-in name or module:attr,
# and its [app] params as one JSON object; unset, the bank. The nodes, the controller (its
# invariant checks), the load generator, the page and the reconcile jobs all get both.
APP_ENV = """    SNAPMESH_APP: "${SNAPMESH_APP:-}"
    SNAPMESH_APP_PARAMS: "${SNAPMESH_APP_PARAMS:-}"
"""
APP_VARIABLES = "SNAPMESH_APP (the app, module:attr; default the bank), SNAPMESH_APP_PARAMS (its params, JSON)"


def node_ids(n: int) -> list[str]:
    return [f"p{i}" for i in range(1, n + 1)]


def healthcheck(port: int, tls_dir: str = "") -> str:
    """`snapmesh health` on the server's own port; `tls_dir`: the certificate it presents
    (default: the client's in $SNAPMESH_TLS_DIR)."""
    tls = f', "--tls-dir", "{tls_dir}"' if tls_dir else ""
    return f"""    healthcheck:
      test: ["CMD", "snapmesh", "health", "127.0.0.1:{port}", "--timeout", "2"{tls}]
      interval: 3s
      timeout: 5s
      retries: 20
      start_period: 5s
"""


def node_service(node: str) -> str:
    """The start of node `node`'s service, the same in the compose file and the Swarm stack."""
    return f"""  {node}:
    <<: *snapmesh
    hostname: {node}
    command: ["node", "--config", "/etc/snapmesh/cluster.toml", "--id", "{node}"]
"""


UI_PORT = 8080
# The page holds the client's certificate and key but not the token: it only reads.
UI_FILES = ("ca.pem", "client.pem", "client-key.pem")


def ui_command() -> str:
    """`snapmesh ui` beside the controller. It listens on every address of its container
    (published on the host), and `--allow-host ui` lets the other containers reach it by
    its service name too: a wildcard listen accepts IP addresses and `localhost` only,
    against DNS rebinding."""
    return (f'    command: ["ui", "--controller", "controller:{CONTROLLER_PORT}", "--listen", "0.0.0.0:{UI_PORT}",'
            ' "--allow-host", "ui"]\n')


def ui_healthcheck() -> str:
    """The page's own /healthz over HTTP (the image has no curl or wget)."""
    return f"""    healthcheck:
      test: ["CMD", "python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:{UI_PORT}/healthz', timeout=2)"]
      interval: 3s
      timeout: 5s
      retries: 20
      start_period: 5s
"""
