"""The LevelDB store (the ``plyvel`` package): a log-structured merge tree, durability 2.

Why LevelDB as well as LMDB: its commits are appends to a write-ahead log, so small frequent
batches cost one sequential write, and the files never need a map size. Compaction runs in a
background thread.

Files: LevelDB's ``CURRENT``, ``MANIFEST-*``, ``*.log``, ``*.ldb``, ``LOCK``, ``LOG``, plus our
``qrouter.lock``. The database is opened with ``paranoid_checks=True`` so that a damaged log or
table is reported (`StoreError`) instead of LevelDB skipping the bad records on recovery —
which, for a store, would be a silent partial reset.

Compression is off: the values are AMQP messages that live until their outcome is known,
mostly a few milliseconds, and snappy cost a quarter of the store's CPU (compressing each
flushed table and decompressing it again in compaction) for little space.

Sync modes (see qrouter/stores/base.py for the contract): each commit is one ``WriteBatch`` written
with ``sync=True`` under ``always`` (the log is fsynced before the commit returns). Under
``batched`` it is written with ``sync=False`` except the first commit after `flush_interval`
seconds, which syncs — an fsync of the log covers every record before it. `flush()` and
`close()` write an empty synced batch for the same effect. A SIGKILL of the router loses
nothing (the log records are in the OS); a power failure loses the commits since the last
synced one, and recovery drops a torn last record by its checksum, so the store stays readable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from qrouter.stores.base import StoreError, TerminusStore


def _driver() -> Any:
    try:
        import plyvel
    except ImportError as exc:
        raise StoreError(
            "the leveldb store needs the 'plyvel' package: pip install plyvel"
        ) from exc
    return plyvel


class LevelDbStore(TerminusStore):
    name = "leveldb"
    durability = 2
    marker_file = "CURRENT"

    def __init__(
        self, path: str | None, *, sync: str = "batched", flush_interval: float = 1.0
    ) -> None:
        super().__init__(path, sync=sync, flush_interval=flush_interval)
        self._plyvel = _driver()
        directory = self._prepare_dir()
        try:
            self._db = self._plyvel.DB(
                directory, create_if_missing=True, paranoid_checks=True, compression=None
            )
        except self._plyvel.Error as exc:
            raise self._fail_open(exc) from exc
        try:
            self._check_schema()
        except StoreError:
            self._db.close()
            self._closed = True
            self._unlock()
            raise
        except self._plyvel.Error as exc:
            self._db.close()
            raise self._fail_open(exc) from exc

    def _get(self, key: bytes) -> bytes | None:
        try:
            value: bytes | None = self._db.get(key)
            return value
        except self._plyvel.Error as exc:
            raise self._driver_error("read failed", exc) from exc

    def _scan_chunk(
        self, start: bytes, prefix: bytes, max_items: int, max_bytes: int
    ) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        size = 0
        try:
            # plyvel takes prefix= or start=, not both: start here, and stop on the prefix.
            with self._db.iterator(start=start) as it:
                for key, value in it:
                    if not key.startswith(prefix):
                        break
                    out.append((key, value))
                    size += len(value)
                    if len(out) >= max_items or size >= max_bytes:
                        break
        except self._plyvel.Error as exc:
            raise self._driver_error("read failed", exc) from exc
        return out

    def _commit(self, prefixes: list[bytes], writes: dict[bytes, bytes | None]) -> None:
        def fill(wb: Any) -> None:
            # One writer (our flock): the keys read here are still there when the batch lands.
            for prefix in prefixes:
                with self._db.iterator(prefix=prefix, include_value=False) as it:
                    for key in it:
                        wb.delete(key)
            for key, value in writes.items():
                if value is None:
                    wb.delete(key)
                else:
                    wb.put(key, value)

        self._write(fill)

    def commit_writes(self, puts: dict[bytes, bytes], deletes: set[bytes] | None = None) -> None:
        """The router's group commit, the short way: one WriteBatch straight from the puts and
        deletes (disjoint key sets), with no merged dict in between."""
        if not puts and not deletes:
            return
        self._check_usable()
        t0 = time.perf_counter()

        def fill(wb: Any) -> None:
            for key in deletes or ():
                wb.delete(key)
            for key, value in puts.items():
                wb.put(key, value)

        self._write(fill)
        elapsed = time.perf_counter() - t0
        self.commit_count += 1
        self.last_commit_seconds = elapsed
        self.commit_seconds_total += elapsed

    def _write(self, fill: Callable[[Any], None]) -> None:
        """One WriteBatch, filled by `fill`, synced when the sync mode says so."""
        sync = self.sync == "always" or self._flush_due()
        try:
            wb = self._db.write_batch(sync=sync)
            fill(wb)
            wb.write()
        except self._plyvel.Error as exc:
            raise self._driver_error("commit failed", exc) from exc
        if sync:
            self._flushed()

    def _flush(self) -> None:
        try:
            self._db.write_batch(sync=True).write()  # an empty synced record fsyncs the log
        except self._plyvel.Error as exc:
            raise self._driver_error("sync failed", exc) from exc

    def _close(self) -> None:
        try:
            self._flush()
        finally:
            self._db.close()
