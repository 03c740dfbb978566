"""The node's data-dir lock: now in snapmesh.datalock (the controller takes one too)."""

from snapmesh.datalock import DataDirLock, DataDirLocked

__all__ = ["DataDirLock", "DataDirLocked"]
