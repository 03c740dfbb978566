"""The shells lane: one shell or tool in-process: no cluster, no Spark, no Docker. Every test here carries the `shells` marker."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == HERE:
            item.add_marker(pytest.mark.shells)
