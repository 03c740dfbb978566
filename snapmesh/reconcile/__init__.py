"""Reconciliation: check exported snapshots against the nodes' transfer logs (Spark).

``transforms`` holds the pure DataFrame checks, ``main`` the thin command
(`snapmesh reconcile`), ``synth`` the synthetic data generator (`snapmesh synth`) and
``baseline`` a single-process plain-Python computation of the same verdicts.
"""
