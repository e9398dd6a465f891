"""The contract every `TerminusStore` meets, as a pytest class each backend's test subclasses:

    from qrouter.stores.conformance import StoreConformance

    class TestLmdbStore(StoreConformance):
        backend = "lmdb"

It ships inside the package (dogpile.cache / py-evm style) so that a new backend is tested by
exactly what the link registry relies on, and nothing is tested only for one backend.

Hooks: `backend` (registry name) and `make_store(tmp_path, **options)` — override it to pass
backend options; calling it twice with the same `tmp_path` must reopen the same store. Tests
that need a store to survive close/reopen skip on durability-0 backends (the memory store:
nothing survives a restart, by design). A missing driver skips the class, unless
``QROUTER_STORE`` names this backend: then the tox environment meant to test it is broken and
the tests fail.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from qrouter.stores import DRIVERS, StoreError, TerminusStore, backend_class
from qrouter.stores.base import LOG_FILE, MAX_KEY_SIZE, META_KEY, SCHEMA_VERSION, encode_meta
from qrouter.stores.termini import (
    TerminusKey,
    TerminusRecord,
    UnsettledRecord,
    delete_terminus,
    drop_unsettled,
    encode_unsettled,
    fold_log,
    load_termini,
    load_terminus,
    log_delete_entry,
    log_delete_ref_entry,
    log_drop_entry,
    log_patch_entry,
    log_patch_ref_entry,
    log_put_entry,
    put_unsettled,
    save_terminus,
    terminus_key,
    unsettled_key,
    unsettled_prefix,
)

MIB = 1 << 20
NO_RESTART = "durability 0: nothing survives a restart, by design"


class StoreConformance:
    backend: ClassVar[str]

    # ---- hooks and fixtures ---------------------------------------------------------------

    def make_store(self, tmp_path: Path, **options: Any) -> TerminusStore:
        return backend_class(self.backend).open(str(tmp_path / "store"), **options)

    @pytest.fixture(autouse=True)
    def _require_driver(self) -> None:
        driver = DRIVERS.get(self.backend)
        if driver is None or importlib.util.find_spec(driver) is not None:
            return
        if os.environ.get("QROUTER_STORE") == self.backend:
            pytest.fail(f"QROUTER_STORE={self.backend} but {driver!r} is not installed")
        pytest.skip(f"{driver!r} is not installed (pip install {driver})")

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[TerminusStore]:
        store = self.make_store(tmp_path)
        yield store
        store.close()

    def reopen(self, store: TerminusStore, tmp_path: Path, **options: Any) -> TerminusStore:
        """Close `store` and open its path again; skips where nothing survives a restart."""
        self.needs_restart()
        store.close()
        return self.make_store(tmp_path, **options)

    def needs_restart(self) -> None:
        if not self.durable_restart():
            pytest.skip(NO_RESTART)

    def durable_restart(self) -> bool:
        return backend_class(self.backend).durability >= 1

    # ---- capability, basic operations -----------------------------------------------------

    def test_capability(self, store: TerminusStore) -> None:
        assert store.name == self.backend
        assert store.durability in (0, 1, 2)
        assert store.sync == "batched"
        assert store.commit_count == 0  # the schema record written on creation is not counted

    def test_put_get_overwrite_delete(self, store: TerminusStore) -> None:
        assert store.get(b"k") is None
        store.put(b"k", b"v1")
        assert store.get(b"k") == b"v1"
        store.put(b"k", b"v2")
        assert store.get(b"k") == b"v2"
        store.delete(b"k")
        assert store.get(b"k") is None
        store.delete(b"k")  # deleting what is absent is fine
        store.put(b"empty", b"")
        assert store.get(b"empty") == b""

    def test_commit_writes(self, store: TerminusStore) -> None:
        """The router's group commit: puts and deletes (disjoint keys) in one transaction."""
        store.put(b"u/old", b"gone soon")
        before = store.commit_count
        store.commit_writes({b"u/a": b"1", b"u/b": b"2" * 5000}, {b"u/old", b"u/absent"})
        assert store.commit_count == before + 1
        assert [k for k, _ in store.scan(b"u/")] == [b"u/a", b"u/b"]
        assert store.get(b"u/b") == b"2" * 5000
        store.commit_writes({}, {b"u/a"})
        store.commit_writes({}, set())  # nothing to do: no transaction
        assert [k for k, _ in store.scan(b"u/")] == [b"u/b"]

    def test_key_rules(self, store: TerminusStore) -> None:
        store.put(b"k" * MAX_KEY_SIZE, b"v")
        assert store.get(b"k" * MAX_KEY_SIZE) == b"v"
        for bad in (b"", b"k" * (MAX_KEY_SIZE + 1), META_KEY, b"\x00x"):
            with pytest.raises(StoreError):
                store.put(bad, b"v")
            with pytest.raises(StoreError):
                store.get(bad)
        with pytest.raises(StoreError):
            list(store.scan(b"\x00"))
        with pytest.raises(TypeError):
            store.put("k", b"v")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.put(b"k", "v")  # type: ignore[arg-type]

    def test_scan_order_and_prefix(self, store: TerminusStore) -> None:
        keys = [b"a", b"a\x00", b"a\xff", b"a\xff\x01", b"ab", b"b", b"\x01", b"\xff\xff", b"t/1"]
        shuffled = keys[:]
        random.Random(7).shuffle(shuffled)
        for k in shuffled:
            store.put(k, b"v:" + k)
        got = list(store.scan())
        assert got == [(k, b"v:" + k) for k in sorted(keys)]
        assert all(type(k) is bytes and type(v) is bytes for k, v in got)
        assert [k for k, _ in store.scan(b"a")] == [b"a", b"a\x00", b"ab", b"a\xff", b"a\xff\x01"]
        assert [k for k, _ in store.scan(b"a\xff")] == [b"a\xff", b"a\xff\x01"]
        assert list(store.scan(b"zz")) == []

    def test_scan_hides_the_schema_record(self, store: TerminusStore) -> None:
        assert list(store.scan()) == []

    def test_scan_while_writing(self, store: TerminusStore) -> None:
        with store.batch() as b:
            for i in range(1000):
                b.put(b"k%04d" % i, b"v")
        seen = []
        for key, _ in store.scan(b"k"):
            seen.append(key)
            store.delete(key)  # writes during a scan: each key still seen once, in order
            store.put(b"z" + key, b"v")
        assert seen == sorted(set(seen)) and len(seen) == 1000
        assert list(store.scan(b"k")) == []

    def test_closed_store(self, tmp_path: Path) -> None:
        store = self.make_store(tmp_path)
        store.close()
        store.close()
        for call in (lambda: store.get(b"k"), lambda: store.put(b"k", b"v"), store.flush):
            with pytest.raises(StoreError, match="closed"):
                call()
        with pytest.raises(StoreError, match="closed"):
            list(store.scan())

    # ---- batches --------------------------------------------------------------------------

    def test_batch_is_invisible_until_commit(self, store: TerminusStore) -> None:
        store.put(b"old", b"1")
        with store.batch() as b:
            b.put(b"new", b"2")
            b.delete(b"old")
            assert store.get(b"new") is None and store.get(b"old") == b"1"
            assert list(store.scan()) == [(b"old", b"1")]
        assert list(store.scan()) == [(b"new", b"2")]

    def test_batch_exception_writes_nothing(self, store: TerminusStore) -> None:
        store.put(b"keep", b"1")
        count = store.commit_count
        with pytest.raises(RuntimeError, match="boom"):
            with store.batch() as b:
                b.put(b"a", b"1")
                b.delete(b"keep")
                raise RuntimeError("boom")
        assert list(store.scan()) == [(b"keep", b"1")]
        assert store.commit_count == count
        with pytest.raises(StoreError, match="batch used after"):
            b.put(b"late", b"x")

    def test_batch_order_and_delete_prefix(self, store: TerminusStore) -> None:
        for k in (b"p/1", b"p/2", b"q/1", b"p"):
            store.put(k, b"old")
        with store.batch() as b:
            b.put(b"p/3", b"early")  # undone by the delete_prefix below
            b.put(b"x", b"1")
            b.put(b"x", b"2")  # last write of a key wins
            b.delete_prefix(b"p/")
            b.put(b"p/4", b"late")  # after the delete_prefix: kept
        assert list(store.scan()) == [
            (b"p", b"old"),
            (b"p/4", b"late"),
            (b"q/1", b"old"),
            (b"x", b"2"),
        ]
        with pytest.raises(StoreError):
            with store.batch() as b:
                b.delete_prefix(b"")

    def test_commit_stats(self, store: TerminusStore) -> None:
        store.put(b"a", b"1")
        store.delete(b"a")
        with store.batch() as b:
            b.put(b"b", b"1")
            b.put(b"c", b"1")
        with store.batch():
            pass  # an empty batch commits nothing
        assert store.commit_count == 3
        assert store.last_commit_seconds >= 0.0
        assert store.commit_seconds_total >= store.last_commit_seconds

    @pytest.mark.parametrize("sync", ["batched", "always"])
    def test_sync_modes(self, tmp_path: Path, sync: str) -> None:
        store = self.make_store(tmp_path, sync=sync, flush_interval=0.0)
        assert store.sync == sync
        for i in range(5):
            store.put(b"k%d" % i, b"v")
        store.flush()
        store = self.reopen(store, tmp_path, sync=sync)
        assert len(list(store.scan())) == 5
        store.close()

    def test_bad_sync_mode(self, tmp_path: Path) -> None:
        with pytest.raises(StoreError, match="sync must be"):
            self.make_store(tmp_path, sync="sometimes")

    # ---- size -----------------------------------------------------------------------------

    def test_large_values(self, store: TerminusStore, tmp_path: Path) -> None:
        big = random.Random(1).randbytes(MIB)
        store.put(b"one", big)
        assert store.get(b"one") == big
        with store.batch() as b:
            for i in range(40):  # 40 MiB in one commit: more than one scan chunk's worth
                b.put(b"many/%02d" % i, big[i:] + big[:i])
        got = list(store.scan(b"many/"))
        assert [k for k, _ in got] == [b"many/%02d" % i for i in range(40)]
        assert all(v == big[i:] + big[:i] for i, (_, v) in enumerate(got))
        store = self.reopen(store, tmp_path)
        assert store.get(b"one") == big and store.get(b"many/39") == big[39:] + big[:39]
        store.close()

    def test_many_keys(self, store: TerminusStore, tmp_path: Path) -> None:
        keys = [b"key/%05d" % i for i in random.Random(2).sample(range(10_000), 10_000)]
        with store.batch() as b:
            for k in keys:
                b.put(k, k[::-1])
        got = list(store.scan())
        assert [k for k, _ in got] == sorted(keys)
        assert all(v == k[::-1] for k, v in got)
        assert len(list(store.scan(b"key/01"))) == 1000
        with store.batch() as b:
            b.delete_prefix(b"key/0")
        assert len(list(store.scan())) == 0
        with store.batch() as b:
            for k in keys:
                b.put(k, b"v")
        store = self.reopen(store, tmp_path)
        assert len(list(store.scan(b"key/"))) == 10_000
        store.close()

    # ---- restart, schema, paths -----------------------------------------------------------

    def test_persists_across_reopen(self, store: TerminusStore, tmp_path: Path) -> None:
        store.put(b"a", b"1")
        store.put(b"gone", b"x")
        with store.batch() as b:
            b.put(b"b", b"2")
            b.delete(b"gone")
        store = self.reopen(store, tmp_path)
        assert list(store.scan()) == [(b"a", b"1"), (b"b", b"2")]
        assert store.commit_count == 0
        store.close()

    def test_newer_schema_is_refused(self, store: TerminusStore, tmp_path: Path) -> None:
        self.needs_restart()
        store._commit([], {META_KEY: encode_meta(SCHEMA_VERSION + 1)})
        store.close()
        with pytest.raises(StoreError, match="newer qrouter"):
            self.make_store(tmp_path)

    def test_corrupt_schema_record(self, store: TerminusStore, tmp_path: Path) -> None:
        self.needs_restart()
        store._commit([], {META_KEY: b"\xde\xad{"})
        store.close()
        with pytest.raises(StoreError, match="schema record is corrupt"):
            self.make_store(tmp_path)

    def test_data_without_schema_record(self, store: TerminusStore, tmp_path: Path) -> None:
        self.needs_restart()
        store.put(b"a", b"1")
        store._commit([], {META_KEY: None})
        store.close()
        with pytest.raises(StoreError, match="not written by qrouter"):
            self.make_store(tmp_path)

    def test_fresh_paths(self, tmp_path: Path) -> None:
        self.needs_restart()
        (tmp_path / "store").mkdir()  # an empty directory is a fresh store
        self.make_store(tmp_path).close()
        nested = tmp_path / "a" / "b"  # a missing one is created, parents too
        self.make_store(nested).close()
        assert (nested / "store").is_dir()

    def test_foreign_paths(self, tmp_path: Path) -> None:
        self.needs_restart()
        cls = backend_class(self.backend)
        with pytest.raises(StoreError, match="a directory path is needed"):
            cls.open(None)
        (tmp_path / "store").write_text("not a directory")
        with pytest.raises(StoreError, match="not a directory"):
            self.make_store(tmp_path)
        other = tmp_path / "other"
        (other / "store").mkdir(parents=True)
        (other / "store" / "notes.txt").write_text("hello")
        with pytest.raises(StoreError, match="not a qrouter .* store: it holds notes.txt"):
            self.make_store(other)
        assert os.listdir(other / "store") == ["notes.txt"]  # nothing written into it

    def test_garbage_files(self, store: TerminusStore, tmp_path: Path) -> None:
        store.put(b"a", b"1")
        store = self.reopen(store, tmp_path)
        store.close()
        for path in (tmp_path / "store").iterdir():
            if path.name != "qrouter.lock" and path.is_file():
                path.write_bytes(b"garbage!" * max(8, path.stat().st_size // 8))
        with pytest.raises(StoreError) as info:
            store = self.make_store(tmp_path)
            list(store.scan())
        assert "\n" not in str(info.value)

    # ---- one opener at a time -------------------------------------------------------------

    def test_second_open_is_refused(self, store: TerminusStore, tmp_path: Path) -> None:
        self.needs_restart()
        store.put(b"a", b"1")
        with pytest.raises(StoreError, match="in use"):
            self.make_store(tmp_path)
        assert store.get(b"a") == b"1"  # the refused opener did not disturb the first
        script = "import sys, stores; stores.open_store(sys.argv[1], sys.argv[2])"
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        proc = subprocess.run(
            [sys.executable, "-c", script, self.backend, str(tmp_path / "store")],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert proc.returncode != 0 and "in use" in proc.stderr

    def test_concurrent_reopen(self, tmp_path: Path) -> None:
        self.needs_restart()
        results: list[TerminusStore | StoreError] = []
        barrier = threading.Barrier(8)

        def race() -> None:
            barrier.wait()
            try:
                results.append(self.make_store(tmp_path))
            except StoreError as exc:
                results.append(exc)

        threads = [threading.Thread(target=race) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        opened = [r for r in results if isinstance(r, TerminusStore)]
        assert len(opened) == 1, results
        assert all("in use" in str(r) for r in results if isinstance(r, StoreError))
        store = opened[0]
        for i in range(20):  # close and reopen in a loop: nothing lost, nothing left locked
            store.put(b"k%02d" % i, b"v")
            store = self.reopen(store, tmp_path)
        assert len(list(store.scan())) == 20
        store.close()

    # ---- the termini record layer ---------------------------------------------------------

    def _terminus(self, name: str = "sub-1", role: str = "sender") -> TerminusRecord:
        key = TerminusKey("router-A", "client-é", name, role)  # type: ignore[arg-type]
        return TerminusRecord(
            key,
            address="topic/x",
            source={
                "address": "topic/x",
                "durable": 2,
                "expiry_policy": "never",
                "timeout": 0,
                "dynamic": False,
                "distribution_mode": "copy",
                "filter": {"apache.org:selector-filter:string": b"\x00\xa3\x05"},
                "capabilities": ["topic", "shared"],
            },
            durability=2,
            expiry_policy="never",
            timeout=3600,
            suspended_at=1_700_000_000.25,
            unsettled={
                b"t1": UnsettledRecord(state=b"\x00\x53\x24\x45", message=b"m1"),
                b"": UnsettledRecord(),
                b"\xff" * 32: UnsettledRecord(state=None, message=b"", settled=True),
            },
        )

    def test_termini_round_trip(self, store: TerminusStore, tmp_path: Path) -> None:
        first, other = self._terminus(), self._terminus("sub-1", "receiver")
        other.unsettled = {b"t1": UnsettledRecord(message=b"other")}
        with store.batch() as b:
            save_terminus(b, first)
            save_terminus(b, other)
        assert load_termini(store) == [other, first]  # sorted by key: receiver < sender
        assert load_terminus(store, first.key) == first
        key = first.key
        with store.batch() as b:
            put_unsettled(b, key, b"t2", UnsettledRecord(message=b"m" * MIB))
            drop_unsettled(b, key, b"t1")
        rec = load_terminus(store, key)
        assert rec is not None and set(rec.unsettled) == {b"", b"t2", b"\xff" * 32}
        first.suspended_at, first.unsettled = None, {}
        with store.batch() as b:  # the terminus alone: stored deliveries stay
            save_terminus(b, first, with_unsettled=False)
        rec = load_terminus(store, key)
        assert rec is not None and rec.suspended_at is None and len(rec.unsettled) == 3
        store = self.reopen(store, tmp_path)
        assert load_termini(store)[1].unsettled[b"t2"].message == b"m" * MIB
        with store.batch() as b:
            delete_terminus(b, key)
        assert load_termini(store) == [other]  # the other terminus and its delivery untouched
        store.close()

    def test_termini_empty_store(self, store: TerminusStore) -> None:
        assert load_termini(store) == []
        assert load_terminus(store, self._terminus().key) is None

    @pytest.mark.parametrize(
        "which, value",
        [
            ("terminus", b"T\x01garbage"),
            ("terminus", b"T\x09"),  # a newer record version
            ("terminus", b""),
            ("unsettled", b"U\x01\x00\x00\x00\x00\x09"),  # state length past the end
            ("unsettled", b"X"),
        ],
    )
    def test_termini_corrupt_record(self, store: TerminusStore, which: str, value: bytes) -> None:
        rec = self._terminus()
        with store.batch() as b:
            save_terminus(b, rec)
        skey = terminus_key(rec.key) if which == "terminus" else unsettled_key(rec.key, b"t1")
        store.put(skey, value)
        with pytest.raises(StoreError, match="is corrupt") as info:
            load_termini(store)
        assert repr(skey) in str(info.value)

    def test_record_log_replays_over_the_records(
        self, store: TerminusStore, tmp_path: Path
    ) -> None:
        """The router's record log (qrouter/stores/termini.py): puts, deletes and dropped termini in
        the order logged, read in memory by load_termini and folded into the records at
        start-up; a put for a terminus no longer stored is dropped."""
        a, b_rec, gone = self._terminus("a"), self._terminus("b"), self._terminus("gone")
        a.unsettled = {b"keep": UnsettledRecord(message=b"k"), b"del": UnsettledRecord()}
        b_rec.unsettled = {b"old": UnsettledRecord(message=b"o")}
        with store.batch() as b:
            save_terminus(b, a)
            save_terminus(b, b_rec)

        def put(rec: TerminusRecord, tag: bytes, message: bytes) -> bytes:
            value = encode_unsettled(UnsettledRecord(message=message))
            return log_put_entry(unsettled_key(rec.key, tag), value)

        entries = [
            put(a, b"new", b"n1") + log_delete_entry(unsettled_key(a.key, b"del")),
            put(b_rec, b"b1", b"gone too") + put(gone, b"g", b"orphan"),
            # b's terminus deleted and made again: what it had before stays gone
            log_drop_entry(unsettled_prefix(b_rec.key)) + put(b_rec, b"b2", b"second life"),
            put(a, b"new", b"n2"),  # a later put of the same record wins
        ]
        for blob in entries:
            store.log_append(blob)
        expected = {
            "a": {b"keep": b"k", b"new": b"n2"},
            "b": {b"b2": b"second life"},
        }

        def seen(recs: list[TerminusRecord]) -> dict[str, dict[bytes, bytes | None]]:
            return {r.key.link_name: {t: u.message for t, u in r.unsettled.items()} for r in recs}

        assert seen(load_termini(store)) == expected  # read in memory, the log left as it is
        assert store.log_read() == entries
        if self.durable_restart():
            store = self.reopen(store, tmp_path)  # the log itself survives a restart
            assert store.log_read() == entries
        assert fold_log(store) == 4
        assert store.log_read() == []
        assert seen(load_termini(store)) == expected
        assert fold_log(store) == 0
        if self.durable_restart():
            store = self.reopen(store, tmp_path)
            assert seen(load_termini(store)) == expected and store.log_read() == []
        store.close()

    def test_record_log_torn_tail_and_corrupt_file(
        self, store: TerminusStore, tmp_path: Path
    ) -> None:
        """A crash mid-append leaves a torn last entry: dropped (its output never left). A bad
        entry before the last is corruption, and says so."""
        if store.marker_file is None or not store.path:
            pytest.skip("a store without a directory keeps its record log in memory")
        log_path = Path(store.path) / LOG_FILE
        entries = [log_delete_entry(b"u/" + bytes(32) + b"/%d" % i) for i in range(3)]
        for blob in entries:
            store.log_append(blob)
        whole = log_path.read_bytes()
        for cut in (1, 5, len(entries[2]) + 2):
            log_path.write_bytes(whole[:-cut])
            assert store.log_read() == entries[:2], cut
        damaged = bytearray(whole)
        damaged[-1] ^= 0xFF  # the last entry's crc fails: torn, dropped
        log_path.write_bytes(bytes(damaged))
        assert store.log_read() == entries[:2]
        damaged = bytearray(whole)
        damaged[10] ^= 0xFF  # inside the first entry
        log_path.write_bytes(bytes(damaged))
        with pytest.raises(StoreError, match="record log .* is corrupt at byte 0"):
            store.log_read()
        log_path.write_bytes(whole)
        store.log_clear()
        assert store.log_read() == [] and log_path.stat().st_size == 0
        store.log_append(entries[0])  # appends after a clear start at the beginning
        assert store.log_read() == entries[:1]

    def test_record_log_torn_tail_with_garbage_after_it(
        self, store: TerminusStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A torn last entry followed by bytes that hold no entry (half a frame the file
        system kept) is still a torn tail; a bad entry with an intact one after it is
        corruption; a failed append is cut off, so the next one does not follow a torn one."""
        if store.marker_file is None or not store.path:
            pytest.skip("a store without a directory keeps its record log in memory")
        log_path = Path(store.path) / LOG_FILE
        entries = [log_delete_entry(b"u/" + bytes(32) + b"/%d" % i) for i in range(3)]
        for blob in entries:
            store.log_append(blob)
        whole = log_path.read_bytes()
        log_path.write_bytes(whole[:-3] + b"\x00\x00\x10\x00\xde\xad")
        assert store.log_read() == entries[:2]
        first = len(whole) // 3  # the three entries have the same size
        damaged = bytearray(whole)
        damaged[first + 2] ^= 0x01  # the second entry's length field: the third is intact
        log_path.write_bytes(bytes(damaged))
        with pytest.raises(StoreError, match=f"corrupt at byte {first}"):
            store.log_read()
        log_path.write_bytes(whole)
        store.log_clear()
        store.log_append(entries[0])

        def short(fd: int, buffers: list[bytes]) -> int:
            return os.write(fd, buffers[0][:5])  # a disk that filled up mid-write

        monkeypatch.setattr(os, "writev", short)
        with pytest.raises(StoreError, match="record log write failed"):
            store.log_append(entries[1])
        monkeypatch.undo()
        store.log_append(entries[2])
        assert store.log_read() == [entries[0], entries[2]]

    def test_record_log_corrupt_entry(self, store: TerminusStore) -> None:
        rec = self._terminus()
        with store.batch() as b:
            save_terminus(b, rec)
        good = log_delete_entry(unsettled_key(rec.key, b"t1"))
        for blob in (
            good[:-1],
            good + b"Q\x00\x00",
            good + b"D\x00",
            log_put_entry(b"u/x", b"v")[:-1],
        ):
            store.log_clear()
            store.log_append(blob)
            with pytest.raises(StoreError, match="log entry .* is corrupt"):
                load_termini(store)
            with pytest.raises(StoreError, match="log entry .* is corrupt"):
                fold_log(store)

    def test_record_log_keeps_guaranteed_topics_records(
        self, store: TerminusStore, tmp_path: Path
    ) -> None:
        """A guaranteed topic's records (eo/..., eot/...: qrouter/_fast/eo_log.pxi) belong to
        no terminus: the fold keeps their logged puts and applies their deletes, next to a
        durable link's records, and the termini do not see them."""
        rec = self._terminus("a")
        with store.batch() as b:
            save_terminus(b, rec)
        store.put(b"eo/t/o/old", b"checkpointed")
        store.put(b"eo/t/m/old", b"old body")
        entries = [
            log_put_entry(b"eot/t", b"")
            + log_put_entry(b"eo/t/o/new", b"state 1")
            + log_put_entry(b"eo/t/m/new", b"body"),
            log_delete_entry(b"eo/t/o/old")
            + log_delete_entry(b"eo/t/m/old")
            + log_put_entry(unsettled_key(rec.key, b"d"), encode_unsettled(UnsettledRecord()))
            + log_put_entry(b"eo/t/o/new", b"state 2"),
            # a terminus dropped: only its own records go
            log_drop_entry(unsettled_prefix(rec.key)),
        ]
        for blob in entries:
            store.log_append(blob)
        assert [(t.key.link_name, dict(t.unsettled)) for t in load_termini(store)] == [("a", {})]
        assert fold_log(store) == 3
        assert store.log_read() == []
        assert list(store.scan(b"eo/")) == [(b"eo/t/m/new", b"body"), (b"eo/t/o/new", b"state 2")]
        assert list(store.scan(b"eot/")) == [(b"eot/t", b"")]
        assert list(store.scan(unsettled_prefix(rec.key))) == []
        store.close()

    def test_record_log_patches_a_logged_record(self, store: TerminusStore) -> None:
        """A patch entry (an origin record's state change, eo_core.pyx `_log_state`) changes
        bytes of the value the log put before it, in order with the other entries; one
        with no put before it, or past its record's end, is corruption, never skipped."""
        entries = [
            log_put_entry(b"eo/t/o/a", b"state 000") + log_put_entry(b"eo/t/o/b", b"b 0"),
            log_patch_entry(b"eo/t/o/a", [(6, ord("1")), (8, ord("2"))])
            + log_delete_entry(b"eo/t/o/b"),
            log_patch_entry(b"eo/t/o/a", [(7, ord("3"))]),
        ]
        for blob in entries:
            store.log_append(blob)
        assert fold_log(store) == 3
        assert list(store.scan(b"eo/")) == [(b"eo/t/o/a", b"state 132")]
        for blob in (
            log_patch_entry(b"eo/t/o/z", [(0, 1)]),  # no put before it
            log_put_entry(b"eo/t/o/z", b"ab") + log_patch_entry(b"eo/t/o/z", [(2, 1)]),
            log_put_entry(b"eo/t/o/z", b"ab") + log_patch_entry(b"eo/t/o/z", [(0, 1)])[:-1],
        ):
            store.log_clear()
            store.log_append(blob)
            with pytest.raises(StoreError, match="log entry .* is corrupt"):
                fold_log(store)

    def test_record_log_names_records_by_number(self, store: TerminusStore) -> None:
        """Patches and deletes that name their record by number (eo_core.pyx `LogRefs`): the
        n-th put of a guaranteed topic's key since the log began, counted across entries and
        over every such put (a topic's mark, a key put again), a durable link's put not
        counted; a number no put had yet is corruption, never skipped."""
        rec = self._terminus("a")
        with store.batch() as b:
            save_terminus(b, rec)
        entries = [
            log_put_entry(b"eot/t", b"")  # 0
            + log_put_entry(b"eo/t/o/a", b"state 000")  # 1
            + log_put_entry(unsettled_key(rec.key, b"d"), encode_unsettled(UnsettledRecord()))
            + log_put_entry(b"eo/t/m/a", b"body a")  # 2
            + log_put_entry(b"eo/t/o/b", b"b 0"),  # 3
            log_patch_ref_entry(1, [(6, ord("1")), (8, ord("2"))])
            + log_put_entry(b"eo/t/o/b", b"b 1")  # 4 (b again, whole)
            + log_patch_ref_entry(4, [(2, ord("2"))]),
            log_delete_ref_entry(3)  # (b, by an older put's number)
            + log_patch_ref_entry(1, [(7, ord("3"))])
            + log_delete_ref_entry(2),
        ]
        for blob in entries:
            store.log_append(blob)
        assert fold_log(store) == 3
        assert list(store.scan(b"eo/")) == [(b"eo/t/o/a", b"state 132")]
        assert list(store.scan(b"eot/")) == [(b"eot/t", b"")]
        for blob in (
            log_put_entry(b"eo/t/o/z", b"ab") + log_delete_ref_entry(1),  # no put numbered 1
            log_put_entry(b"eo/t/o/z", b"ab") + log_patch_ref_entry(0, [(2, 1)]),  # past its end
            log_put_entry(b"eo/t/o/z", b"ab") + log_patch_ref_entry(0, [(0, 1)])[:-1],  # torn
            log_put_entry(b"eo/t/o/z", b"ab") + log_delete_ref_entry(0)[:-1],
            # (a durable link's put takes no number)
            log_put_entry(unsettled_key(rec.key, b"d"), encode_unsettled(UnsettledRecord()))
            + log_delete_ref_entry(0),
        ):
            store.log_clear()
            store.log_append(blob)
            with pytest.raises(StoreError, match="log entry .* is corrupt"):
                fold_log(store)

    def test_termini_key_mismatch_and_orphans(self, store: TerminusStore) -> None:
        a, b_rec = self._terminus("a"), self._terminus("b")
        with store.batch() as b:
            save_terminus(b, a)
        store.put(terminus_key(b_rec.key), store.get(terminus_key(a.key)) or b"")
        with pytest.raises(StoreError, match="key mismatch"):
            load_termini(store)
        store.delete(terminus_key(b_rec.key))
        store.delete(terminus_key(a.key))  # deliveries left without their terminus
        with pytest.raises(StoreError, match="delivery of no terminus"):
            load_termini(store)
