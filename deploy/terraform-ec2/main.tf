# snapmesh on EC2. With instance_count 1 (the default): one instance, Docker Compose
# runs the nodes, the controller, the app (and Prometheus + Grafana) from
# deploy/compose/. With instance_count N > 1: N instances in one VPC form a Docker
# Swarm; the first (aws_instance.snapmesh) is the manager and runs the controller,
# Prometheus and Grafana, the others (aws_instance.worker) join it, and the nodes
# are spread over all N by label (deploy/compose/generate.py --hosts N). Only SSH
# and the controller's gRPC port are admitted, and only from var.allowed_cidr; the
# Swarm ports only between the instances; node, metrics, Prometheus and Grafana
# ports are never published beyond them.
#
# Data safety: each instance's Docker volumes (transfer logs, snapshots, the CA)
# live on its own EBS volume (aws_ebs_volume.data), which survives the instance's
# replacement; the AMI is resolved once and then ignored, as is user_data, so
# neither a new Debian AMI nor a changed repo_ref replaces an instance. Upgrades:
# docs/deploy.md, "Upgrading".

terraform {
  required_version = ">= 1.3"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0, < 7.0"
    }
  }
}

provider "aws" {
  region = var.region
  default_tags {
    tags = merge({ Project = "snapmesh" }, var.tags)
  }
}

locals {
  controller_port      = 50050
  swarm                = var.instance_count > 1
  join_token_parameter = "/${var.name}/swarm/worker-join-token"
  # The AMI every instance boots: ami_id, or the latest Debian 12 when first applied
  # (lifecycle.ignore_changes keeps the one an instance was made with).
  ami = var.ami_id != null ? var.ami_id : data.aws_ami.debian12[0].id
}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

# ------------------------------------------------------------------ network

data "aws_vpc" "default" {
  count   = var.subnet_id == null ? 1 : 0
  default = true
}

data "aws_subnets" "default" {
  count = var.subnet_id == null ? 1 : 0
  filter {
    name   = "vpc-id"
    values = [data.aws_vpc.default[0].id]
  }
  filter {
    name   = "default-for-az"
    values = ["true"]
  }
}

data "aws_subnet" "selected" {
  id = var.subnet_id != null ? var.subnet_id : sort(data.aws_subnets.default[0].ids)[0]
}

resource "aws_security_group" "snapmesh" {
  name_prefix = "${var.name}-"
  description = "snapmesh: SSH and the controller gRPC port from allowed_cidr only"
  vpc_id      = data.aws_subnet.selected.vpc_id
  tags        = { Name = var.name }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "ssh" {
  security_group_id = aws_security_group.snapmesh.id
  description       = "SSH from allowed_cidr"
  cidr_ipv4         = var.allowed_cidr
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
}

resource "aws_vpc_security_group_ingress_rule" "controller_grpc" {
  security_group_id = aws_security_group.snapmesh.id
  description       = "snapmesh controller gRPC (grpcurl) from allowed_cidr"
  cidr_ipv4         = var.allowed_cidr
  ip_protocol       = "tcp"
  from_port         = local.controller_port
  to_port           = local.controller_port
}

# The Swarm's ports, only between the instances (only with instance_count > 1):
# 2377/tcp cluster management, 7946/tcp+udp node gossip, 4789/udp overlay traffic.
locals {
  swarm_ports = {
    manage      = { protocol = "tcp", port = 2377 }
    gossip_tcp  = { protocol = "tcp", port = 7946 }
    gossip_udp  = { protocol = "udp", port = 7946 }
    overlay_udp = { protocol = "udp", port = 4789 }
  }
}

resource "aws_vpc_security_group_ingress_rule" "swarm" {
  for_each                     = local.swarm ? local.swarm_ports : {}
  security_group_id            = aws_security_group.snapmesh.id
  description                  = "Docker Swarm ${each.key} between the snapmesh instances only"
  referenced_security_group_id = aws_security_group.snapmesh.id
  ip_protocol                  = each.value.protocol
  from_port                    = each.value.port
  to_port                      = each.value.port
}

resource "aws_vpc_security_group_egress_rule" "swarm" {
  for_each                     = local.swarm ? local.swarm_ports : {}
  security_group_id            = aws_security_group.snapmesh.id
  description                  = "Docker Swarm ${each.key} between the snapmesh instances only"
  referenced_security_group_id = aws_security_group.snapmesh.id
  ip_protocol                  = each.value.protocol
  from_port                    = each.value.port
  to_port                      = each.value.port
}

# The overlay network carries the nodes' gRPC (mutual TLS) and metrics traffic
# inside VXLAN (4789/udp above); nothing else is opened between the instances.

# Outbound: only what user_data needs (Debian's apt mirror over http, the git
# repository, PyPI and the container registry over https). DNS to the VPC
# resolver and the metadata service are not filtered by security groups.
resource "aws_vpc_security_group_egress_rule" "http" {
  security_group_id = aws_security_group.snapmesh.id
  description       = "HTTP out (Debian apt mirror)"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 80
  to_port           = 80
}

resource "aws_vpc_security_group_egress_rule" "https" {
  security_group_id = aws_security_group.snapmesh.id
  description       = "HTTPS out (git clone, PyPI, Docker Hub)"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

# -------------------------------------------------------------- instance role
# SSM Session Manager (a shell without opening more ports) and, with a Swarm, the
# one SSM parameter that carries the worker join token, under a KMS key only this
# role may use.

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "snapmesh" {
  name_prefix        = "${var.name}-"
  description        = "snapmesh instance: SSM Session Manager only"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
}

resource "aws_iam_role_policy_attachment" "ssm" {
  role       = aws_iam_role.snapmesh.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

# The deployment's key: it encrypts the data volumes and, with a Swarm, the worker
# join token (a SecureString the manager writes and the workers read). Besides the
# account's administrators, only the instances' role may use it, and only through
# SSM; the token is never in Terraform's state or outputs.
resource "aws_kms_key" "snapmesh" {
  description             = "${var.name}: the data volumes and the Swarm worker join token"
  enable_key_rotation     = true
  deletion_window_in_days = 7
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "AccountAdministers"
        Effect    = "Allow"
        Principal = { AWS = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root" }
        Action    = "kms:*"
        Resource  = "*"
      },
      {
        Sid       = "InstancesUseForTheJoinToken"
        Effect    = "Allow"
        Principal = { AWS = aws_iam_role.snapmesh.arn }
        Action    = ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey"]
        Resource  = "*"
        Condition = { StringEquals = { "kms:ViaService" = "ssm.${var.region}.amazonaws.com" } }
      },
    ]
  })
}

data "aws_iam_policy_document" "join_token" {
  count = local.swarm ? 1 : 0
  statement {
    sid       = "JoinTokenParameter"
    actions   = ["ssm:PutParameter", "ssm:GetParameter"]
    resources = ["arn:${data.aws_partition.current.partition}:ssm:${var.region}:${data.aws_caller_identity.current.account_id}:parameter${local.join_token_parameter}"]
  }
  statement {
    sid       = "JoinTokenKey"
    actions   = ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.snapmesh.arn]
  }
}

resource "aws_iam_role_policy" "join_token" {
  count  = local.swarm ? 1 : 0
  name   = "swarm-join-token"
  role   = aws_iam_role.snapmesh.id
  policy = data.aws_iam_policy_document.join_token[0].json
}

resource "aws_iam_instance_profile" "snapmesh" {
  name_prefix = "${var.name}-"
  role        = aws_iam_role.snapmesh.name
}

# ------------------------------------------------------------------ instance

data "aws_ami" "debian12" {
  count       = var.ami_id == null ? 1 : 0
  most_recent = true
  owners      = ["136693071363"] # Debian
  filter {
    name   = "name"
    values = ["debian-12-amd64-*"]
  }
  filter {
    name   = "architecture"
    values = ["x86_64"]
  }
  filter {
    name   = "virtualization-type"
    values = ["hvm"]
  }
}

# One data volume per instance (index 0: the manager / single instance), in the
# subnet's zone. Not replaced with its instance: a replaced instance mounts it again.
resource "aws_ebs_volume" "data" {
  count             = var.instance_count
  availability_zone = data.aws_subnet.selected.availability_zone
  encrypted         = true
  kms_key_id        = aws_kms_key.snapmesh.arn
  type              = "gp3"
  size              = var.data_volume_size_gb
  tags              = { Name = "${var.name}-data-h${count.index + 1}" }
}

resource "aws_volume_attachment" "data" {
  count                          = var.instance_count
  device_name                    = "/dev/sdf"
  volume_id                      = aws_ebs_volume.data[count.index].id
  instance_id                    = count.index == 0 ? aws_instance.snapmesh.id : aws_instance.worker[count.index - 1].id
  stop_instance_before_detaching = true
}

# The single instance, or the Swarm manager (h1).
resource "aws_instance" "snapmesh" {
  #checkov:skip=CKV_AWS_88:The instance needs a public IP: users reach the controller's gRPC port with grpcurl from allowed_cidr, and the security group admits nothing else.
  ami                         = local.ami
  instance_type               = var.instance_type
  subnet_id                   = data.aws_subnet.selected.id
  vpc_security_group_ids      = [aws_security_group.snapmesh.id]
  associate_public_ip_address = true
  key_name                    = var.key_name
  iam_instance_profile        = aws_iam_instance_profile.snapmesh.name
  monitoring                  = true
  ebs_optimized               = true

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required" # IMDSv2 only
    http_put_response_hop_limit = 1          # containers on bridge networks cannot reach it
    instance_metadata_tags      = "disabled"
  }

  # The system and the images only: the data is on aws_ebs_volume.data.
  root_block_device {
    encrypted             = true
    volume_type           = "gp3"
    volume_size           = var.root_volume_size_gb
    delete_on_termination = true
  }

  user_data = templatefile("${path.module}/user_data.sh.tftpl", {
    role                 = local.swarm ? "manager" : "single"
    host                 = "h1"
    instance_count       = var.instance_count
    manager_ip           = ""
    data_volume_id       = aws_ebs_volume.data[0].id
    join_token_parameter = local.join_token_parameter
    kms_key_id           = aws_kms_key.snapmesh.arn
    region               = var.region
    repo_url             = var.repo_url
    repo_ref             = var.repo_ref
    app_module           = var.app_module
    app_params           = jsonencode(var.app_params)
    app_source           = var.app_source
    nodes                = var.nodes
    enable_monitoring    = var.enable_monitoring
    controller_port      = local.controller_port
  })
  user_data_replace_on_change = false

  # Neither a newer Debian AMI nor a changed user_data (repo_ref, nodes, ...) replaces
  # the instance; docs/deploy.md, "Upgrading", says how to upgrade on purpose.
  lifecycle {
    ignore_changes = [ami, user_data]
  }

  tags = { Name = var.name, Role = local.swarm ? "swarm-manager" : "single" }
}

# Swarm workers h2..hN (instance_count > 1).
resource "aws_instance" "worker" {
  #checkov:skip=CKV_AWS_88:Workers need a route out for apt, git and pip; a public IP gives it in the default VPC without a NAT gateway, and the security group admits nothing from outside but SSH from allowed_cidr.
  count                       = var.instance_count - 1
  ami                         = local.ami
  instance_type               = var.instance_type
  subnet_id                   = data.aws_subnet.selected.id
  vpc_security_group_ids      = [aws_security_group.snapmesh.id]
  associate_public_ip_address = true
  key_name                    = var.key_name
  iam_instance_profile        = aws_iam_instance_profile.snapmesh.name
  monitoring                  = true
  ebs_optimized               = true

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  root_block_device {
    encrypted             = true
    volume_type           = "gp3"
    volume_size           = var.root_volume_size_gb
    delete_on_termination = true
  }

  user_data = templatefile("${path.module}/user_data.sh.tftpl", {
    role                 = "worker"
    host                 = "h${count.index + 2}"
    instance_count       = var.instance_count
    manager_ip           = aws_instance.snapmesh.private_ip
    data_volume_id       = aws_ebs_volume.data[count.index + 1].id
    join_token_parameter = local.join_token_parameter
    kms_key_id           = aws_kms_key.snapmesh.arn
    region               = var.region
    repo_url             = var.repo_url
    repo_ref             = var.repo_ref
    app_module           = var.app_module
    app_params           = jsonencode(var.app_params)
    app_source           = var.app_source
    nodes                = var.nodes
    enable_monitoring    = var.enable_monitoring
    controller_port      = local.controller_port
  })
  user_data_replace_on_change = false

  lifecycle {
    ignore_changes = [ami, user_data]
  }

  tags = { Name = "${var.name}-h${count.index + 2}", Role = "swarm-worker" }
}
