"""Guaranteed topics in real router processes (qrouter/guarantee.py, docs/exactly-once.md)."""

from __future__ import annotations

import pytest

from tests.tools_alias import alias_tools_package

alias_tools_package()  # the management client of qrouter-tool reads the routers' records

DEFAULT_TEST_TIMEOUT = 180


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/guarantee/" in item.nodeid and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT))
