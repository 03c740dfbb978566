"""The deploy lane: the Docker engine, the wheel in a fresh venv, Helm, Terraform. Every test here carries the `deploy` marker."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == HERE:
            item.add_marker(pytest.mark.deploy)
