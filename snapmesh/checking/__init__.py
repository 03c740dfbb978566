"""Reading what a cluster did, to check it: transfer logs, stored snapshots,
snapshot messages, Prometheus scrapes, and the snapshot-versus-log checker."""
