"""Who may call what (snapmesh/settings/access.py), as a pure table: every RPC of the
API has a rule, and each rule admits exactly the identities it names.

The certificate names are the ones `snapmesh certs` writes (snapmesh/settings/devcerts.py):
a node's names its id, its host, localhost and 127.0.0.1; the controller's
`controller` and its host; the client's `client` only."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapmesh.settings import access, config, security
from snapmesh.settings.access import Gate, Roles, Rule
from snapmesh.settings.config import write_cluster
from snapmesh.v1 import snapmesh_pb2 as pb

ROLES = Roles(nodes=frozenset({"p1", "p2", "p3"}))
P2 = {"p2", "localhost", "127.0.0.1", "::1"}
CONTROLLER = {"controller", "localhost", "127.0.0.1", "::1"}
CLIENT = {"client"}
TOKEN = "the-token"
BEARER = f"Bearer {TOKEN}"

TRIGGER = "/snapmesh.v1.Controller/TriggerSnapshot"
RESTORE = "/snapmesh.v1.Controller/RestoreSnapshot"
NODE_CONTROL = ["/snapmesh.v1.Node/StartSnapshot", "/snapmesh.v1.Node/AbortSnapshot", "/snapmesh.v1.Node/RestoreState"]


def every_rpc() -> list[str]:
    return [f"/{service.full_name}/{method.name}"
            for service in pb.DESCRIPTOR.services_by_name.values() for method in service.methods]


def test_every_rpc_of_the_api_has_a_row():
    # A new RPC gets a row here on purpose; until then it is a client-only write (AUTH1).
    assert sorted(every_rpc()) == sorted(access.RULES)
    assert access.rule("/snapmesh.v1.Controller/StopCluster") is Rule.CLIENT_WRITE
    assert access.rule("/grpc.health.v1.Health/Check") is Rule.ANY


@pytest.mark.parametrize("method", [TRIGGER, RESTORE])
def test_a_node_certificate_never_writes_the_control_plane(method):
    gate = Gate(roles=ROLES, token=TOKEN)
    for presented in (BEARER, None, "Bearer wrong"):
        refused = gate.check(method, P2, presented)
        assert refused is not None and refused.code == "PERMISSION_DENIED", presented
        assert "node 'p2'" in refused.message and method in refused.message and "AUTH1" in refused.message
    # Nor the controller's; a client's with the token may, without it it is asked for the token.
    assert gate.check(method, CONTROLLER, BEARER).code == "PERMISSION_DENIED"
    assert gate.check(method, CLIENT, BEARER) is None
    assert gate.check(method, CLIENT, None).code == "UNAUTHENTICATED"
    assert gate.check(method, CLIENT, "Bearer wrong").code == "UNAUTHENTICATED"


def test_without_a_token_the_certificates_alone_decide():
    # [tls] and no [auth]: the same rule, with no token anywhere.
    gate = Gate(roles=ROLES, token=None)
    assert gate.check(TRIGGER, P2, None).code == "PERMISSION_DENIED"
    assert gate.check(RESTORE, P2, None).code == "PERMISSION_DENIED"
    assert gate.check(TRIGGER, CLIENT, None) is None
    assert gate.check(RESTORE, CLIENT, None) is None


def test_a_certificate_naming_a_client_and_a_node_is_the_nodes():
    # A client name that is also in a node's certificate (its host, say) gives the node nothing.
    roles = Roles(nodes=frozenset({"p1", "p2"}), clients=frozenset({"ops", "localhost"}))
    gate = Gate(roles=roles)
    assert gate.check(TRIGGER, P2, None).code == "PERMISSION_DENIED"
    assert gate.check(TRIGGER, CONTROLLER, None).code == "PERMISSION_DENIED"
    assert gate.check(TRIGGER, {"ops"}, None) is None
    assert gate.check(TRIGGER, CLIENT, None).code == "PERMISSION_DENIED"  # `client` is not named: not a client


@pytest.mark.parametrize("method", NODE_CONTROL)
def test_the_node_control_calls_need_the_controller_certificate_and_no_token(method):
    gate = Gate(roles=ROLES, token=None)  # a node holds no token
    assert gate.check(method, CONTROLLER, None) is None
    for names in (P2, CLIENT):
        refused = gate.check(method, names, BEARER)
        assert refused.code == "PERMISSION_DENIED" and "'controller'" in refused.message
    # Even on a server that held the token, the controller is not asked for it.
    assert Gate(roles=ROLES, token=TOKEN).check(method, CONTROLLER, None) is None


def test_reports_and_channels_are_a_nodes_and_transfers_anyones():
    gate = Gate(roles=ROLES, token=TOKEN)
    for method in ("/snapmesh.v1.Controller/ReportState", "/snapmesh.v1.Controller/ReportStateChunks",
                   "/snapmesh.v1.Node/Channel"):
        assert gate.check(method, P2, None) is None
        assert "not a node" in gate.check(method, CLIENT, BEARER).message
    for method in ("/snapmesh.v1.Node/Transfer", "/snapmesh.v1.Node/TransferBatch", "/snapmesh.v1.Node/Submit",
                   "/snapmesh.v1.Node/SubmitBatch", "/grpc.health.v1.Health/Check"):
        assert not gate.guards(method)
        assert all(gate.check(method, names, None) is None for names in (P2, CLIENT, CONTROLLER))


READS = [m for m, r in access.RULES.items() if r is Rule.READ]


def test_reads_keep_their_rule():
    assert len(READS) == 6
    open_reads = Gate(roles=ROLES, token=TOKEN)
    for method in READS:
        assert not open_reads.guards(method)
        assert all(open_reads.check(method, names, None) is None for names in (P2, CLIENT, CONTROLLER))
    protected = Gate(roles=ROLES, token=TOKEN, protect_reads=True)
    for method in READS:
        assert protected.check(method, CLIENT, BEARER) is None
        assert protected.check(method, CLIENT, None).code == "UNAUTHENTICATED"
    # A node holds no token: its protected reads go by the certificate (the controller asks them).
    on_a_node = Gate(roles=ROLES, token=None, protect_reads=True)
    assert on_a_node.check("/snapmesh.v1.Node/GetState", CONTROLLER, None) is None
    assert on_a_node.check("/snapmesh.v1.Node/GetState", CLIENT, None) is None
    assert on_a_node.check("/snapmesh.v1.Node/GetState", P2, None).code == "PERMISSION_DENIED"


def test_plaintext_has_no_identity_to_check():
    gate = Gate(roles=ROLES)
    assert all(gate.check(method, None, None) is None for method in access.RULES)


# ------------------------------------------------------------------ the cluster file


def cluster_file(tmp_path: Path, auth: str | None) -> Path:
    path = write_cluster(tmp_path / "cluster.toml", nodes=3)
    text = path.read_text() + (
        '\n[tls]\nca = "tls/ca.pem"\ncert = "tls/{name}.pem"\nkey = "tls/{name}-key.pem"\n'
        'client_cert = "tls/client.pem"\nclient_key = "tls/client-key.pem"\n'
    )
    path.write_text(text + (f"\n[auth]\n{auth}\n" if auth is not None else ""))
    return path


def test_the_clients_default_to_the_certificate_certs_makes(tmp_path):
    nodes = frozenset({"p1", "p2", "p3"})
    assert security.cluster_roles(config.load(cluster_file(tmp_path, None))) == Roles(nodes=nodes)
    plain = config.load(cluster_file(tmp_path, 'token_file = "tls/token"'))
    assert plain.auth.clients == ("client",) and Roles(nodes=nodes).clients == {config.CLIENT_NAME}
    named = config.load(cluster_file(tmp_path, 'token_file = "tls/token"\nclients = ["ops", "ci"]'))
    assert named.auth.clients == ("ops", "ci")
    assert security.cluster_roles(named) == Roles(nodes=nodes, clients=frozenset({"ops", "ci"}))


@pytest.mark.parametrize(("clients", "message"), [
    ('["p2"]', "'p2' is the controller's or a node's name"),
    ('["controller"]', "'controller' is the controller's or a node's name"),
    ("[]", "must be a non-empty array"),
    ('"client"', "must be a non-empty array"),
])
def test_a_client_name_is_never_a_node_nor_the_controller(tmp_path, clients, message):
    with pytest.raises(config.ConfigError, match=f"auth.clients: {message}"):
        config.load(cluster_file(tmp_path, f'token_file = "tls/token"\nclients = {clients}'))


def test_a_node_identity_never_holds_the_token(tmp_path):
    path = cluster_file(tmp_path, 'token_file = "tls/token"')
    cfg = config.load(path)
    security.write_certs(cfg, tmp_path / "tls")
    assert security.load_identity(cfg, "p2").token is None
    assert security.load_identity(cfg, "controller").token is not None
    assert security.load_identity(cfg, "client").token is not None
    (tmp_path / "tls" / "token").unlink()  # a node's container has none: it starts all the same
    assert security.load_identity(cfg, "p2").roles == security.cluster_roles(cfg)


def test_each_rule_code_is_unique_and_indexed_in_the_security_doc():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text(encoding="utf-8")
    codes = [r.value for r in Rule]
    assert len(set(codes)) == len(codes)
    assert all(f"| {code} |" in doc for code in codes), codes
