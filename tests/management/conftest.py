"""Fixtures for the operations tests (the qrouter-tool runner is tests/management/tooling.py)."""

from __future__ import annotations

import pytest

DEFAULT_TEST_TIMEOUT = 120


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "management" in item.nodeid and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT))


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """CA, server and client certificates (tests/certs.py), made once per run."""
    pytest.importorskip(
        "cryptography", reason="the TLS tests make their certificates with `cryptography`"
    )
    from tests.certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"))
