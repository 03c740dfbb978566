"""Spark's processes: the session (local or a cluster), the class-data archive, a standalone master and worker."""
