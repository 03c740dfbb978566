"""What every snapmesh server process shares: the grpc.aio runtime with health,
reflection and metrics, the data-dir lock, and files that survive a crash."""
