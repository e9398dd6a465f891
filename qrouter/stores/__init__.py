"""Terminus stores (memory, LMDB, LevelDB): one interface, backends registered by name.

    from qrouter.stores import open_store
    with open_store("lmdb", "/var/lib/qrouter", sync="batched") as store:
        with store.batch() as b:
            b.put(b"t/...", b"...")

`BACKENDS` maps a name to ``"module:Class"``; the module (and so its driver, ``lmdb`` or
``plyvel``) is imported only when that store is opened, so ``import qrouter.stores`` costs nothing and
a router on the memory store needs neither package. The record layer the router persists is in
qrouter/stores/termini.py; the contract every backend meets is qrouter/stores/conformance.py.
"""

from __future__ import annotations

import importlib
import importlib.util

from qrouter.stores.base import SCHEMA_VERSION, SYNC_MODES, Batch, StoreError, TerminusStore

__all__ = [
    "BACKENDS",
    "DRIVERS",
    "SCHEMA_VERSION",
    "SYNC_MODES",
    "Batch",
    "StoreError",
    "TerminusStore",
    "available",
    "backend_class",
    "open_store",
]

BACKENDS: dict[str, str] = {
    "memory": "qrouter.stores.memory:MemoryStore",
    "lmdb": "qrouter.stores.lmdb_store:LmdbStore",
    "leveldb": "qrouter.stores.leveldb_store:LevelDbStore",
}

DRIVERS: dict[str, str | None] = {"memory": None, "lmdb": "lmdb", "leveldb": "plyvel"}
"""Backend name -> the pip package (= import name) its driver comes from."""


def backend_class(name: str) -> type[TerminusStore]:
    """The store class registered as `name`; StoreError if unknown or its driver is missing."""
    target = BACKENDS.get(name)
    if target is None:
        raise StoreError(f"unknown store {name!r}; choose one of {', '.join(BACKENDS)}")
    module_name, _, class_name = target.partition(":")
    module = importlib.import_module(module_name)
    cls: type[TerminusStore] = getattr(module, class_name)
    driver = DRIVERS.get(name)
    if driver is not None and importlib.util.find_spec(driver) is None:
        raise StoreError(f"the {name} store needs the {driver!r} package: pip install {driver}")
    return cls


def available(name: str) -> bool:
    """Whether `name` is a registered store whose driver is installed."""
    try:
        backend_class(name)
    except StoreError:
        return False
    return True


def open_store(
    name: str, path: str | None, *, sync: str = "batched", map_size: int | None = None
) -> TerminusStore:
    """Open (creating if the directory is empty or missing) the store `name` at `path`.
    `map_size`: the most an LMDB map may grow to (other backends have no such bound)."""
    if map_size is not None and name == "lmdb":
        from qrouter.stores.lmdb_store import LmdbStore

        return LmdbStore(path, sync=sync, max_map_size=map_size)
    return backend_class(name).open(path, sync=sync)
