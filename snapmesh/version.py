"""The installed snapmesh's version: the package metadata's (pyproject.toml), one source."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    try:
        return metadata.version("snapmesh")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"
