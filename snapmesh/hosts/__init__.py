"""The multi-host bench on one machine: one Linux network namespace per process,
faults at the network layer between named hosts.

- `plan`: the pure part, the topology and each fault as the commands to run;
- `net`: runs them, and takes it all down again;
- `delayer`: the one-way delay (NFQUEUE; this kernel has no netem);
- `probe`: the round-trip probe;
- `cluster`: a snapmesh cluster on the bench (`snapmesh cluster up --hosts`);
- `launch`: `snapmesh cluster up --hosts`.
"""
