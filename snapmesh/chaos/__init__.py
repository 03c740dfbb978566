"""The fault campaign (`snapmesh chaos`): a real cluster under a seeded random
schedule of faults while the bank workload and frequent snapshots run, then
quiescence, checks against the nodes' logs, and a table of figures.

- `schedule`: the pure part, the fault schedule drawn from a seed;
- `proxy`: the TCP proxy in front of each node (cut streams, partitions);
- `campaign`: applies the schedule to a cluster, times the recoveries, quiesces;
- `local` / `compose`: the two clusters (local processes, the Docker compose
  stack with `--compose`), each only how to apply a fault to itself;
- `checks`: the verdicts and the table;
- `main`: the command line.
"""
