"""The protocol lane: the pure machines (snapmesh/protocol, snapmesh/app) and the simulator and fuzzer over them.
Every test here carries the `protocol` marker."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == HERE:
            item.add_marker(pytest.mark.protocol)
