"""The store conformance suite (qrouter/stores/conformance.py) on the leveldb backend."""

from pathlib import Path

import pytest

from qrouter.stores import StoreError, open_store
from qrouter.stores.conformance import StoreConformance


class TestLevelDbStore(StoreConformance):
    backend = "leveldb"


def test_foreign_leveldb_database(tmp_path: Path) -> None:
    plyvel = pytest.importorskip("plyvel")
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    db.put(b"someone", b"else's")
    db.close()
    with pytest.raises(StoreError, match="not written by qrouter"):
        open_store("leveldb", str(tmp_path / "db"))


def test_damaged_log_is_reported_not_skipped(tmp_path: Path) -> None:
    # paranoid_checks: LevelDB would otherwise drop the bad log records on recovery.
    pytest.importorskip("plyvel")
    path = tmp_path / "store"
    store = open_store("leveldb", str(path))
    with store.batch() as b:
        for i in range(100):
            b.put(b"k%03d" % i, b"v" * 100)
    store.close()
    (log,) = path.glob("*.log")
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF
    log.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="cannot open"):
        open_store("leveldb", str(path))
