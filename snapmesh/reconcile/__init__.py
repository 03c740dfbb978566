"""Reconciliation: check exported snapshots against the nodes' transfer logs (Spark).

The steps: ``parse`` (lines and snapshot files to typed rows), ``checksums`` (every
check by aggregates), ``log_checks`` and ``snapshot_checks`` (the exact checks, by
joins, for what the checksums do not settle), ``verdicts`` (the rows). ``schema`` holds
the record schema, ``segments`` the log files (sealed segments, Parquet), ``ingest``
the conversion to Parquet (`snapmesh reconcile ingest`), ``main`` the thin command
(`snapmesh reconcile`), ``session`` its Spark session and exit statuses, ``cds`` and
``warmup`` the driver JVM's class archive (`snapmesh reconcile prepare`),
``standalone`` a Spark standalone cluster from the pip pyspark, ``synth`` the
synthetic data generator (`snapmesh synth`) and ``baseline`` a single-process
plain-Python computation of the same verdicts (through `snapmesh.checking.cut`).
An app's snapshots (snapmesh.app): ``apps`` checks their payloads and states
against the logs, ``invariants`` runs the app's SQL invariants (`reconcile --app`).
The rules: docs/reconcile.md "The rules".
"""
