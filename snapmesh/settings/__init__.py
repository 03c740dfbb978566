"""How a cluster is set up: the cluster file and the free ports it is given,
mutual TLS with the control-plane token, and the command-line parsing every
subcommand shares."""
