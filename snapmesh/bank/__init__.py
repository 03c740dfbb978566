"""The bank workload: money moving between nodes while snapshots are taken
(`workload`), and the text it prints (`render`). `snapmesh app` and `snapmesh
demo` run it; it talks to a cluster only through the controller's and the
nodes' gRPC APIs. `cut` is apart: the bank's reading of a cut (replayed balances,
conservation), pure, which the log checkers pass to snapmesh/checking/cut.py."""
