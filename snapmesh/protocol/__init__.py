"""The pure protocol: every state machine snapmesh runs, with no I/O of its own.

The Chandy-Lamport core, the reliable link, the log record, recovery, the whole
node (its effects, its epoch and fence), overtaking markers, topologies,
chunking, the request-id window and the restore gate. Events go in, effects
come out, and time is passed in as a number.

The rule (checked by tests/checking/test_layers.py): nothing in this package imports
asyncio, grpc, socket, threading, time, random, os, the file system or any other
snapmesh layer. The gRPC processes (`services/`), the simulator (`snapmesh.sim`)
and the tests drive the same code.
"""
