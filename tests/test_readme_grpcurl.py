"""The README's grpcurl commands, run against a real cluster.

grpcurl is not packaged for this machine, so the commands go through a client
that works the way grpcurl does: it knows nothing of snapmesh's generated code,
learns every service and message from server reflection, turns the `-d` JSON
into a request and prints the response as JSON. If reflection, the method
names or the JSON field names drift from the README, this fails.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from snapmesh import config
from snapmesh.config import write_cluster
from snapmesh.supervisor import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_commands() -> list[list[str]]:
    section = README.read_text(encoding="utf-8").split("## Call it with grpcurl", 1)[1].split("\n## ", 1)[0]
    return [shlex.split(line) for line in section.splitlines() if line.startswith("grpcurl ")]


class ReflectionClient:
    """What grpcurl does with -plaintext: reflection for the schema, JSON in and out."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.database = ProtoReflectionDescriptorDatabase(self.channel)
        self.pool = descriptor_pool.DescriptorPool(self.database)

    def close(self) -> None:
        self.channel.close()

    def list_services(self) -> list[str]:
        return list(self.database.get_services())

    def call(self, full_method: str, body: str) -> dict:
        service_name, method_name = full_method.split("/")
        method = self.pool.FindServiceByName(service_name).FindMethodByName(method_name)
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        rpc = self.channel.unary_unary(
            f"/{service_name}/{method_name}",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        response = rpc(json_format.Parse(body, request_class()), timeout=30)
        return json_format.MessageToDict(response, preserving_proto_field_name=True)


def parse(argv: list[str]) -> tuple[str, str, str | None]:
    """(address, method or 'list', -d body) from a grpcurl command line."""
    assert argv[:2] == ["grpcurl", "-plaintext"], argv
    rest = argv[2:]
    body = None
    if rest[0] == "-d":
        body, rest = rest[1], rest[2:]
    assert len(rest) == 2, f"expected ADDRESS METHOD after the flags: {argv}"
    return rest[0], rest[1], body


def test_readme_addresses_are_the_default_cluster():
    default = config.load(config.DEFAULT_CONFIG)
    known = {default.controller.address, *(n.address for n in default.nodes)}
    for argv in readme_commands():
        assert parse(argv)[0] in known, f"README address not in {config.DEFAULT_CONFIG}: {argv}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpcurl")
    with Cluster(write_cluster(root / "cluster.toml", nodes=4, initial_balance=1000)) as running:
        yield running


def test_every_readme_grpcurl_command_works(cluster):
    default = config.load(config.DEFAULT_CONFIG)
    # The README speaks of the default cluster's addresses; this cluster has free ports.
    address_of = {default.controller.address: cluster.controller_address}
    address_of |= {n.address: cluster.node_address(n.id) for n in default.nodes}

    commands = readme_commands()
    assert len(commands) >= 6, "the README lost its grpcurl section"
    seen: dict[str, dict] = {}
    snapshot_id = None
    for argv in commands:
        address, method, body = parse(argv)
        client = ReflectionClient(address_of[address])
        try:
            if method == "list":
                services = client.list_services()
                assert {"snapmesh.v1.Controller", "grpc.health.v1.Health"} <= set(services)
                continue
            if body and "<id>" in body:
                assert snapshot_id, "GetSnapshot comes after TriggerSnapshot in the README"
                body = body.replace("<id>", snapshot_id)
            seen[method] = response = client.call(method, body or "{}")
        finally:
            client.close()
        if method.endswith("/TriggerSnapshot"):
            snapshot_id = response["snapshot_id"]

    snapshot = seen["snapmesh.v1.Controller/TriggerSnapshot"]
    assert snapshot["status"] == "COMPLETE"
    assert snapshot["conserved"] is True and snapshot["total"] == "4000"
    assert {n["node_id"] for n in snapshot["nodes"]} == {"p1", "p2", "p3", "p4"}
    assert len(snapshot["channels"]) == 12
    assert seen["snapmesh.v1.Controller/GetSnapshot"]["snapshot_id"] == snapshot_id
    listed = [s["snapshot_id"] for s in seen["snapmesh.v1.Controller/ListSnapshots"]["snapshots"]]
    assert snapshot_id in listed
    assert len(seen["snapmesh.v1.Controller/GetCluster"]["nodes"]) == 4
    transfer = seen["snapmesh.v1.Node/Transfer"]
    assert re.fullmatch(r"\S+", transfer["msg_id"]) and transfer["balance"] == "975"
    assert seen["snapmesh.v1.Node/GetState"] == {"node_id": "p1", "balance": "975"}
