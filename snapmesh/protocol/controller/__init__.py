"""The controller's machines: the tracker of snapshots, the journal's records, restores and retention."""
