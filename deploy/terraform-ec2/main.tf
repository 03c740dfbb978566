# snapmesh on one EC2 instance: Docker Compose runs the nodes, the controller,
# the app (and Prometheus + Grafana) from deploy/compose/. Only SSH and the
# controller's gRPC port are admitted, and only from var.allowed_cidr; node,
# metrics, Prometheus and Grafana ports are never published beyond the instance.

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
  controller_port = 50050
}

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
# No permissions but SSM Session Manager: a shell without opening more ports.

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

resource "aws_instance" "snapmesh" {
  #checkov:skip=CKV_AWS_88:The instance needs a public IP: users reach the controller's gRPC port with grpcurl from allowed_cidr, and the security group admits nothing else.
  ami                         = var.ami_id != null ? var.ami_id : data.aws_ami.debian12[0].id
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

  root_block_device {
    encrypted             = true
    volume_type           = "gp3"
    volume_size           = var.root_volume_size_gb
    delete_on_termination = true
  }

  user_data = templatefile("${path.module}/user_data.sh.tftpl", {
    repo_url          = var.repo_url
    repo_ref          = var.repo_ref
    nodes             = var.nodes
    enable_monitoring = var.enable_monitoring
    controller_port   = local.controller_port
  })
  user_data_replace_on_change = true

  tags = { Name = var.name }
}
