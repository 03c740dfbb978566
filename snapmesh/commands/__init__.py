"""The `snapmesh` subcommands that talk to a running cluster (health, restore,
snapshot), their shared argument parsing and error words, and protogen."""
