"""The bank workload: money moving between nodes while snapshots are taken
(`workload`), and the text it prints (`render`). `snapmesh app` and `snapmesh
demo` run it; it talks to a cluster only through the controller's and the
nodes' gRPC APIs. `ledger` is apart: the bank's side of the controller (its fields
of the v1 messages and its conservation rule), pure, which the tracker falls back to;
so is `cut`, the bank's reading of a cut (replayed balances, conservation), which
the log checkers pass to snapmesh/checking/cut.py."""
