"""Reading what a cluster did, to check it: transfer logs, stored snapshots,
snapshot messages, Prometheus scrapes, and the checkers.

`cut` is the one definition of a snapshot consistent with the logs (pure: wal
records in, problems out; it imports no I/O). `trace` and `steps` check a list of
trace events (after the run, or step by step); `logcheck` checks real nodes' logs
against their snapshots with both. None of them knows an app: each takes the
app's part from its caller (`payloads.PAYLOADS` for any app's bytes; the bank's
in snapmesh/bank/), and imports none.
"""
