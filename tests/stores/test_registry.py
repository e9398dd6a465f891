"""The store registry: names, lazy drivers, and the errors for what is not there."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qrouter import stores
from qrouter.stores import StoreError, available, backend_class, open_store


def test_names() -> None:
    assert set(stores.BACKENDS) == {"memory", "lmdb", "leveldb"}
    assert backend_class("memory").durability == 0
    assert available("memory") and not available("redis")


def test_unknown_store() -> None:
    with pytest.raises(StoreError, match="unknown store 'redis'; choose one of memory, lmdb"):
        open_store("redis", None)


def test_missing_driver_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(stores.DRIVERS, "lmdb", "no_such_driver_pkg")
    with pytest.raises(StoreError, match="pip install no_such_driver_pkg"):
        open_store("lmdb", "/nonexistent")
    assert not available("lmdb")


def test_import_loads_no_driver() -> None:
    code = "import qrouter.stores, qrouter.stores.termini, sys; print('lmdb' in sys.modules, 'plyvel' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_memory_store_ignores_path_and_sync() -> None:
    with open_store("memory", None, sync="always") as store:
        store.put(b"k", b"v")
        assert store.get(b"k") == b"v"
