"""The `snapmesh` subcommands that talk to a running cluster (health, restore,
snapshot), the words their errors are explained in, and protogen."""
