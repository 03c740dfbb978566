"""The checking lane: the pure checks: checking/, the trace judgement, the layer, lane and docs rules.
Every test here carries the `checking` marker."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == HERE:
            item.add_marker(pytest.mark.checking)
