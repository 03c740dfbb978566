"""snapmesh: consistent global snapshots (Chandy-Lamport) for a cluster of gRPC services."""
