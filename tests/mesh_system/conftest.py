"""Mesh system tests: real `qrouter` processes joined by inter-router connections."""

from __future__ import annotations

import pytest

DEFAULT_TEST_TIMEOUT = 120


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "mesh_system" in item.nodeid and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT))
