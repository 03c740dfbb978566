"""The fault fuzzer: seeded runs of the simulated world (snapmesh.sim) under faults, checked after each."""
