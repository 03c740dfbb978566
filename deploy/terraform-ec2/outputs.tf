output "public_ip" {
  description = "Public IPv4 address of the instance."
  value       = aws_instance.snapmesh.public_ip
}

output "manager_address" {
  description = "The Swarm manager's (or the single instance's) public and private IPv4 addresses; the controller runs there."
  value       = "${aws_instance.snapmesh.public_ip} (private ${aws_instance.snapmesh.private_ip})"
}

output "worker_public_ips" {
  description = "Public IPv4 addresses of the Swarm workers h2..hN (empty with instance_count = 1)."
  value       = aws_instance.worker[*].public_ip
}

output "ami_id" {
  description = "The AMI the manager booted (pin it with -var ami_id=... for reproducible re-creations)."
  value       = aws_instance.snapmesh.ami
}

output "instance_id" {
  description = "EC2 instance id (for SSM Session Manager: aws ssm start-session --target <id>)."
  value       = aws_instance.snapmesh.id
}

output "controller_address" {
  description = "The controller's gRPC address, reachable from allowed_cidr only."
  value       = "${aws_instance.snapmesh.public_ip}:${local.controller_port}"
}

output "fetch_client_files" {
  description = "Copies the client's certificate, key, the CA and the token (made on the instance at deploy time) to ./snapmesh-tls (needs key_name)."
  value       = "scp -r admin@${aws_instance.snapmesh.public_ip}:/opt/snapmesh/deploy/compose/tls ./snapmesh-tls"
}

output "grpcurl_command" {
  description = "After fetch_client_files: triggers a snapshot and waits for it, over mutual TLS with the token (run it with eval)."
  value       = "grpcurl -cacert snapmesh-tls/ca.pem -cert snapmesh-tls/client.pem -key snapmesh-tls/client-key.pem -servername controller -H \"authorization: Bearer $(cat snapmesh-tls/token)\" -d '{\"wait\": true}' ${aws_instance.snapmesh.public_ip}:${local.controller_port} snapmesh.v1.Controller/TriggerSnapshot"
}

output "ssh_command" {
  description = "SSH in (needs key_name); cloud-init's log is /var/log/cloud-init-output.log."
  value       = "ssh admin@${aws_instance.snapmesh.public_ip}"
}

output "grafana_tunnel" {
  description = "With enable_monitoring: forward Grafana (and Prometheus) to this machine, then open http://localhost:3000."
  value       = "ssh -N -L 3000:127.0.0.1:3000 -L 9090:127.0.0.1:9090 admin@${aws_instance.snapmesh.public_ip}"
}
