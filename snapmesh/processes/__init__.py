"""Starting and supervising processes: local clusters on loopback (`cluster up`),
children that die with their parent, and which Docker Compose to run.
`snapmesh/hosts/` puts the same processes on hosts of their own."""
