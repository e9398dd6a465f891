"""Fixtures shared by every test folder.

* ``router`` — a factory: ``router(listeners=..., addresses=..., config=...)``
  starts a real qrouter process in the test's tmp_path (see tests/harness.py),
  waits for its ports, and at teardown stops it with SIGTERM and checks exit
  status 0. When the test failed, the log of every router it started is printed.
* ``blocking`` — a factory for ``proton.utils.BlockingConnection`` with a
  bounded timeout, closed at teardown.
* ``certs`` — CA, server and client certificates (tests/certs.py), made once per run.

Every test of the folders in DEFAULT_TIMEOUTS is bounded by pytest-timeout even when it
forgets its own mark (the rest by pyproject.toml's ``timeout``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import DEFAULT_TIMEOUT, Process, Router

# seconds a test of tests/<folder> may take without a timeout mark of its own; the tests' own
# waits are all shorter than this
DEFAULT_TIMEOUTS = {
    "broker": 120,
    "client": 120,
    "guarantee": 180,
    "interop": 90,
    "management": 120,
    "mesh_system": 120,
}
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.relative_to(TESTS).parts[0]
        except ValueError:
            continue
        seconds = DEFAULT_TIMEOUTS.get(folder)
        if seconds is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # Keep each phase's report on the item so fixtures can tell at teardown
    # whether the test failed (and print the router logs then).
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _test_failed(request: pytest.FixtureRequest) -> bool:
    for when in ("setup", "call"):
        rep = getattr(request.node, f"rep_{when}", None)
        if rep is not None and rep.failed:
            return True
    return False


@pytest.fixture
def router(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Router]]:
    """Start routers; each keeps its files under tmp_path/<name>/."""
    made: list[Process] = []

    def make(name: str | None = None, **kwargs: Any) -> Router:
        name = name or ("router" if not made else f"router{len(made)}")
        timeout = kwargs.pop("timeout", DEFAULT_TIMEOUT)
        wait = kwargs.pop("wait", True)
        cls = kwargs.pop("cls", Router)  # e.g. harness.MeshRouter
        r = cls(tmp_path / name, name=name, wait=False, **kwargs)
        made.append(r)
        if wait:
            r.wait_ports(timeout)
        return r

    yield make

    failed = _test_failed(request)
    first: BaseException | None = None
    for proc in reversed(made):
        try:
            proc.teardown()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            first = first or exc
        if failed:
            print(f"\n===== {proc.name}: {proc.outfile} =====\n{proc.log_tail(200)}")
    if first is not None:
        raise first


@pytest.fixture
def blocking() -> Iterator[Callable[..., Any]]:
    """``blocking(url, **kw)`` -> an open BlockingConnection (timeout 10 s)."""
    from proton.utils import BlockingConnection

    conns: list[Any] = []

    def make(url: str, timeout: float = 10.0, **kwargs: Any) -> Any:
        conn = BlockingConnection(url, timeout=timeout, **kwargs)
        conns.append(conn)
        return conn

    yield make
    for conn in reversed(conns):
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - a router that died is reported by `router`
            pass


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """CA, server and client certificates (tests/certs.py), made once per run."""
    pytest.importorskip(
        "cryptography", reason="the TLS tests make their certificates with `cryptography`"
    )
    from tests.certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"))
