variable "region" {
  description = "AWS region to deploy into."
  type        = string
  default     = "us-east-1"
}

variable "allowed_cidr" {
  description = "The only network admitted to SSH (22) and the controller's gRPC port (50050), e.g. your address as 203.0.113.7/32. No default: you must choose it; 0.0.0.0/0 is refused."
  type        = string

  validation {
    condition     = can(cidrhost(var.allowed_cidr, 0)) && !contains(["0.0.0.0/0", "::/0"], var.allowed_cidr)
    error_message = "The allowed_cidr must be a CIDR block (e.g. 203.0.113.7/32) narrower than the whole Internet."
  }
}

variable "instance_type" {
  description = "EC2 instance type. 4 GiB of memory runs 4 nodes, the controller, the app and the Spark reconciliation job."
  type        = string
  default     = "t3.medium"
}

variable "subnet_id" {
  description = "Subnet to launch in (it must give the instance a route to the Internet). null: a default subnet of the region's default VPC."
  type        = string
  default     = null
}

variable "ami_id" {
  description = "AMI to boot (Debian 12 or another Debian-family image with apt). null: the latest official Debian 12 (bookworm) amd64 AMI at the first apply, then kept (a newer one never replaces an instance). Pin it for reproducible deployments; changing it does not replace running instances (see docs/deploy.md, Upgrading)."
  type        = string
  default     = null
}

variable "key_name" {
  description = "Name of an existing EC2 key pair for SSH. null: no key (use SSM Session Manager instead)."
  type        = string
  default     = null
}

variable "repo_url" {
  description = "Git URL of the snapmesh repository the instance clones (https; must be readable without credentials)."
  type        = string
}

variable "repo_ref" {
  description = "Branch, tag or commit of repo_url to deploy."
  type        = string
  default     = "main"
}

variable "nodes" {
  description = "Number of snapmesh nodes in the compose stack (deploy/compose/generate.py --nodes)."
  type        = number
  default     = 4

  validation {
    condition     = var.nodes >= 2 && var.nodes <= 99 && floor(var.nodes) == var.nodes
    error_message = "The number of nodes must be a whole number between 2 and 99."
  }
}

variable "enable_monitoring" {
  description = "Also start Prometheus and Grafana (compose profile \"monitoring\"). Their ports stay on the instance's loopback: reach them through an SSH tunnel."
  type        = bool
  default     = true
}

variable "root_volume_size_gb" {
  description = "Size of each instance's encrypted root volume in GiB (the system and the Docker images; the data is on the data volume)."
  type        = number
  default     = 30
}

variable "data_volume_size_gb" {
  description = "Size of each instance's encrypted data volume in GiB: Docker's named volumes (transfer logs, snapshots, the CA and certificates, Prometheus data). It survives the instance's replacement."
  type        = number
  default     = 20
}

variable "instance_count" {
  description = "Number of instances. 1: one instance running the compose stack. N > 1: a Docker Swarm of N instances in one VPC; the first is the manager (controller, Prometheus, Grafana), the others join it as workers, and the nodes are spread over all N by label."
  type        = number
  default     = 1

  validation {
    condition     = var.instance_count >= 1 && var.instance_count <= 20 && floor(var.instance_count) == var.instance_count
    error_message = "The instance_count must be a whole number between 1 and 20."
  }
}

variable "name" {
  description = "Name tag and prefix of every resource."
  type        = string
  default     = "snapmesh"
}

variable "tags" {
  description = "Extra tags for every resource."
  type        = map(string)
  default     = {}
}

variable "app_module" {
  description = "The app every node runs (docs/apps.md, \"Deploying your app\"): a built-in (kvshard) or module:attr. \"\": the bank. Every container gets it as SNAPMESH_APP: the nodes, the controller (its invariant checks), the load generator, the page and the reconcile jobs."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^$|^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*)?$", var.app_module))
    error_message = "The app_module must be module:attr (a Python module and an attribute in it) or a built-in app such as kvshard."
  }
}

variable "app_params" {
  description = "The app's [app] params (an object), given to every container as SNAPMESH_APP_PARAMS (JSON)."
  type        = any
  default     = {}

  validation {
    condition     = can(keys(var.app_params)) && length(regexall("'", jsonencode(var.app_params))) == 0
    error_message = "The app_params must be an object (the app's params) with no single quote in it."
  }
}

variable "app_source" {
  description = "How your module reaches the instances: the path, in repo_url, of its one file (e.g. examples/token_ring.py). Every instance builds it into snapmesh-app:latest FROM the snapmesh image it builds (deploy/compose/Dockerfile.app-example), and the manager or single instance into snapmesh-app-reconcile:latest FROM the reconcile image; the containers run those. \"\": app_module is built in (kvshard) or already in the snapmesh package."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^$|^[A-Za-z0-9_./-]+\\.py$", var.app_source)) && length(regexall("\\.\\.", var.app_source)) == 0
    error_message = "The app_source must be a relative path to a .py file inside the repository (no \"..\")."
  }
}
