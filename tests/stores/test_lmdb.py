"""The store conformance suite (qrouter/stores/conformance.py) on the lmdb backend."""

from pathlib import Path

import pytest

from qrouter.stores import StoreError, open_store
from qrouter.stores.conformance import StoreConformance


class TestLmdbStore(StoreConformance):
    backend = "lmdb"


def test_map_grows_when_full(tmp_path: Path) -> None:
    pytest.importorskip("lmdb")
    from qrouter.stores.lmdb_store import LmdbStore

    path = str(tmp_path / "store")
    store = LmdbStore(path, map_size=1 << 20)
    value = bytes(range(256)) * 4096  # 1 MiB
    with store.batch() as b:  # 8 MiB into a 1 MiB map: grows, and retries the whole batch
        for i in range(8):
            b.put(b"k%d" % i, value)
    assert store.map_size >= 8 << 20
    assert len(list(store.scan())) == 8
    store.close()
    store = LmdbStore(path, map_size=1 << 20)  # an existing, larger map keeps its size
    assert store.map_size >= 8 << 20 and store.get(b"k7") == value
    store.close()


def test_foreign_lmdb_database(tmp_path: Path) -> None:
    lmdb = pytest.importorskip("lmdb")
    env = lmdb.open(str(tmp_path / "db"))
    with env.begin(write=True) as txn:
        txn.put(b"someone", b"else's")
    env.close()
    with pytest.raises(StoreError, match="not written by qrouter"):
        open_store("lmdb", str(tmp_path / "db"))


def test_a_leveldb_directory_is_named(tmp_path: Path) -> None:
    plyvel = pytest.importorskip("plyvel")
    plyvel.DB(str(tmp_path / "db"), create_if_missing=True).close()
    with pytest.raises(StoreError, match="it looks like a leveldb store"):
        open_store("lmdb", str(tmp_path / "db"))


def test_a_map_at_its_limit_fails_the_commit(tmp_path: Path) -> None:
    # store_map_size: the map grows up to it and no further; the failed commit left nothing
    pytest.importorskip("lmdb")
    from qrouter.stores.lmdb_store import LmdbStore

    store = LmdbStore(str(tmp_path / "s"), max_map_size=1 << 20)
    try:
        store.commit_writes({b"u/a%04d" % i: bytes(4096) for i in range(50)})
        with pytest.raises(StoreError, match="map is full at 1048576 bytes"):
            store.commit_writes({b"u/b%04d" % i: bytes(4096) for i in range(300)})
        assert store.get(b"u/b0000") is None and store.get(b"u/a0049") is not None
        assert store.map_size == 1 << 20
    finally:
        store.close()
