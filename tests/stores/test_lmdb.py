"""The store conformance suite (stores/conformance.py) on the lmdb backend."""

from pathlib import Path

import pytest

from stores import StoreError, open_store
from stores.conformance import StoreConformance


class TestLmdbStore(StoreConformance):
    backend = "lmdb"


def test_map_grows_when_full(tmp_path: Path) -> None:
    pytest.importorskip("lmdb")
    from stores.lmdb_store import LmdbStore

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
