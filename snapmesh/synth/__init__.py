"""Synthetic transfer logs and snapshots (`snapmesh synth`), written through the log's own encoder."""
