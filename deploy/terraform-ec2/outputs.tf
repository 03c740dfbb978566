output "public_ip" {
  description = "Public IPv4 address of the instance."
  value       = aws_instance.snapmesh.public_ip
}

output "instance_id" {
  description = "EC2 instance id (for SSM Session Manager: aws ssm start-session --target <id>)."
  value       = aws_instance.snapmesh.id
}

output "controller_address" {
  description = "The controller's gRPC address, reachable from allowed_cidr only."
  value       = "${aws_instance.snapmesh.public_ip}:${local.controller_port}"
}

output "grpcurl_command" {
  description = "Triggers a snapshot and waits for it (server reflection is on, so no .proto file is needed)."
  value       = "grpcurl -plaintext -d '{\"wait\": true}' ${aws_instance.snapmesh.public_ip}:${local.controller_port} snapmesh.v1.Controller/TriggerSnapshot"
}

output "ssh_command" {
  description = "SSH in (needs key_name); cloud-init's log is /var/log/cloud-init-output.log."
  value       = "ssh admin@${aws_instance.snapmesh.public_ip}"
}

output "grafana_tunnel" {
  description = "With enable_monitoring: forward Grafana (and Prometheus) to this machine, then open http://localhost:3000."
  value       = "ssh -N -L 3000:127.0.0.1:3000 -L 9090:127.0.0.1:9090 admin@${aws_instance.snapmesh.public_ip}"
}
