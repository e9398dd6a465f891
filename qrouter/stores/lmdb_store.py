"""The LMDB store (the ``lmdb`` package): a B+tree in one memory-mapped file, durability 2.

Why LMDB: reads are served from the map with no copy into a cache and a commit is one
copy-on-write of the touched pages, so small group commits are cheap; the file is always
consistent (no recovery step, no compaction pauses).

Files: ``<dir>/data.mdb`` and ``<dir>/lock.mdb`` (LMDB's reader table), plus our
``qrouter.lock``.

Map size: LMDB needs an upper bound on the file size up front. We start at `map_size`
(256 MiB of address space; the file only grows as pages are used) and when a commit fails with
``MapFullError`` double it and retry the whole batch — the failed transaction was aborted, so
nothing of it was applied.

Sync modes (see qrouter/stores/base.py for the contract):

* ``always``: the environment is opened with ``sync=True, metasync=True`` (LMDB's default):
  every commit fsyncs the data pages and then the meta page before it returns.
* ``batched``: opened with ``sync=False`` (MDB_NOSYNC): a commit writes its pages to the OS
  and returns; ``env.sync(force=True)`` runs at the first commit after `flush_interval`
  seconds, on `flush()` and on `close()`. A SIGKILL of the router loses nothing. A power
  failure loses the commits since the last sync; LMDB's documentation adds that on a file
  system that does not keep write order, it can also leave the file unreadable — opening it
  then fails with a `StoreError` (it is never silently reset). Where power failure matters,
  use ``always``.

  Why not ``metasync=False`` (MDB_NOMETASYNC) for ``batched``, which keeps the file intact on
  power failure: it still fsyncs the data pages on every commit. Measured here (100 puts and
  100 deletes per commit, ext4 on virtio): 92 us per commit with ``sync=False``, 256 us with
  ``metasync=False``, 368 us with full sync — it would cost most of what ``always`` costs.

  ``batched`` also opens the map writable (``writemap=True``, MDB_WRITEMAP): a commit writes
  its pages in place in the shared mapping instead of copying them into malloc'd buffers and
  then ``pwrite``-ing them. For the router's group commit (two puts and two deletes per
  message) that is about a quarter less CPU per commit; a SIGKILL loses nothing (the pages
  are in the OS's page cache the moment they are written) and the power-failure story is the
  one above. The costs: a stray write through a bad pointer in this process could reach the
  file (LMDB's own warning; everything in this process that touches the map is LMDB's
  code), and LMDB sets the file's length to the map size at open, so ``ls`` shows 256 MiB
  (sparse: ``du`` shows the pages in use). ``always`` keeps the default (no writemap).
"""

from __future__ import annotations

import os
import time
from typing import Any

from qrouter.stores.base import StoreError, TerminusStore

DEFAULT_MAP_SIZE = 256 << 20
MAX_MAP_SIZE = 1 << 40  # 1 TiB: past this, a full map is a runaway writer, not growth


def _driver() -> Any:
    try:
        import lmdb
    except ImportError as exc:
        raise StoreError("the lmdb store needs the 'lmdb' package: pip install lmdb") from exc
    return lmdb


class LmdbStore(TerminusStore):
    name = "lmdb"
    durability = 2
    marker_file = "data.mdb"

    def __init__(
        self,
        path: str | None,
        *,
        sync: str = "batched",
        flush_interval: float = 1.0,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int | None = None,
    ) -> None:
        super().__init__(path, sync=sync, flush_interval=flush_interval)
        # the most the map may grow to: the router's store_map_size, else
        # QROUTER_STORE_MAP_SIZE (bytes), else 1 TiB. Past it a commit fails with a
        # StoreError ("map is full"), which the router treats as a store failure.
        if max_map_size is None:
            env = os.environ.get("QROUTER_STORE_MAP_SIZE")
            max_map_size = int(env) if env else MAX_MAP_SIZE
        self.max_map_size = max(max_map_size, 1 << 16)
        map_size = min(map_size, self.max_map_size)
        self._lmdb = _driver()
        directory = self._prepare_dir()
        always = sync == "always"
        try:
            self._env = self._lmdb.open(
                directory,
                map_size=map_size,
                subdir=True,
                create=True,
                sync=always,
                metasync=always,
                writemap=not always,
                max_dbs=0,
                # Our flock already keeps a second opener out; LMDB's own reader lock stays on
                # so that a read-only inspector (qrouter-tool) could still attach safely.
                lock=True,
            )
        except self._lmdb.Error as exc:
            raise self._fail_open(exc) from exc
        try:
            self._check_schema()
        except StoreError:
            self._env.close()
            self._closed = True
            self._unlock()
            raise
        except self._lmdb.Error as exc:
            self._env.close()
            raise self._fail_open(exc) from exc

    def _get(self, key: bytes) -> bytes | None:
        try:
            with self._env.begin(buffers=False) as txn:
                value: bytes | None = txn.get(key)
                return value
        except self._lmdb.Error as exc:
            raise self._driver_error("read failed", exc) from exc

    def _scan_chunk(
        self, start: bytes, prefix: bytes, max_items: int, max_bytes: int
    ) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        size = 0
        try:
            with self._env.begin(buffers=False) as txn:
                cur = txn.cursor()
                if not cur.set_range(start):
                    return out
                for key, value in cur:
                    if not key.startswith(prefix):
                        break
                    out.append((key, value))
                    size += len(value)
                    if len(out) >= max_items or size >= max_bytes:
                        break
        except self._lmdb.Error as exc:
            raise self._driver_error("read failed", exc) from exc
        return out

    def _commit(self, prefixes: list[bytes], writes: dict[bytes, bytes | None]) -> None:
        lmdb = self._lmdb
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for prefix in prefixes:
                        cur = txn.cursor()
                        if cur.set_range(prefix):
                            # delete() moves to the next entry; an unpositioned key() is b"".
                            while cur.key().startswith(prefix) and cur.delete():
                                pass
                    for key, value in writes.items():
                        if value is None:
                            txn.delete(key)
                        else:
                            txn.put(key, value)
                break
            except lmdb.MapFullError:
                self._grow()  # the transaction was aborted: retry it whole in a bigger map
            except lmdb.Error as exc:
                raise self._driver_error("commit failed", exc) from exc
        if self.sync == "batched" and self._flush_due():
            self._flush()
            self._flushed()

    def commit_writes(self, puts: dict[bytes, bytes], deletes: set[bytes] | None = None) -> None:
        """The router's group commit, the fast way: the puts go to LMDB in one C loop
        (cursor.putmulti over the dict's items), the deletes one by one."""
        if not puts and not deletes:
            return
        self._check_usable()
        lmdb = self._lmdb
        t0 = time.perf_counter()
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    if puts:
                        txn.cursor().putmulti(puts.items())
                    if deletes:
                        for key in deletes:
                            txn.delete(key)
                break
            except lmdb.MapFullError:
                self._grow()
            except lmdb.Error as exc:
                raise self._driver_error("commit failed", exc) from exc
        if self.sync == "batched" and self._flush_due():
            self._flush()
            self._flushed()
        elapsed = time.perf_counter() - t0
        self.commit_count += 1
        self.last_commit_seconds = elapsed
        self.commit_seconds_total += elapsed

    def _grow(self) -> None:
        now = int(self._env.info()["map_size"])
        size = min(now * 2, self.max_map_size)
        if size <= now:
            raise StoreError(f"{self.describe()}: map is full at {now} bytes (store_map_size)")
        try:
            self._env.set_mapsize(size)
        except self._lmdb.Error as exc:
            raise self._driver_error("cannot grow the map", exc) from exc

    @property
    def map_size(self) -> int:
        return int(self._env.info()["map_size"])

    def _flush(self) -> None:
        try:
            self._env.sync(True)
        except self._lmdb.Error as exc:
            raise self._driver_error("sync failed", exc) from exc

    def _close(self) -> None:
        try:
            self._flush()
        finally:
            self._env.close()
