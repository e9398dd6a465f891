"""The one `TerminusStore` interface every backend implements, and what they share.

A store is a sorted map of bytes to bytes with atomic batches: the smallest thing on which the
link registry can keep durable termini (DESIGN.md §5). Backends implement five primitives
(`_get`, `_scan_chunk`, `_commit`, `_flush`, `_close`); everything a caller can get wrong —
key checks, the batch buffer, stats, the schema record, the path and lock checks — lives here
once, so every backend behaves the same and the conformance suite (qrouter/stores/conformance.py)
tests one contract.

Keys starting with ``\\x00`` are reserved for the store's own meta records (the schema version
is ``\\x00meta/schema``); callers never see them in `scan` and cannot write them.

Sync modes, and what each loses (a committed batch is never *partly* lost in either):

* ``"always"``: every commit is on stable storage before `commit` returns (fsync per commit).
  Power failure or a kernel crash loses nothing that was committed.
* ``"batched"``: commits reach the OS at once but are fsynced at most every `flush_interval`
  seconds (at the next commit after it elapses, on `flush()`, and on `close()`). A router
  process crash (even SIGKILL) loses nothing — the OS still has the writes; a power failure or
  kernel crash loses the commits since the last flush. Each backend's docstring says what else.

Stores are not thread-safe: one store belongs to one thread (the router's event loop). One
directory belongs to one open store at a time: an on-disk store holds an exclusive ``flock`` on
``<dir>/qrouter.lock`` while open, so a second router on the same path gets a `StoreError`
instead of two writers interleaving their termini.
"""

from __future__ import annotations

import abc
import errno
import fcntl
import json
import os
import struct
import time
import zlib
from collections.abc import Iterator
from types import TracebackType
from typing import ClassVar, Self

SCHEMA_VERSION = 1
"""The on-disk schema this code writes and the newest it reads."""

LOG_FILE = "qrouter-records.log"
"""The router's record log (qrouter/stores/termini.py), next to the backend's files."""
_LOG_FRAME = struct.Struct(">II")  # entry length, crc32 of the entry

META_KEY = b"\x00meta/schema"
_META_TAG = "qrouter-termini"
RESERVED = b"\x00"
"""First byte of the keys reserved for meta records."""

MAX_KEY_SIZE = 511
"""LMDB's default key limit, enforced on every backend so that none accepts what another won't."""

SYNC_MODES = ("batched", "always")
LOCK_FILE = "qrouter.lock"

_SCAN_CHUNK_ITEMS = 256
_SCAN_CHUNK_BYTES = 8 << 20


class StoreError(Exception):
    """A store problem, as one line that says which store, which path and what is wrong."""


class Batch:
    """Writes buffered in memory and applied in one transaction when the ``with`` block ends.

    Nothing is visible to `TerminusStore.get`/`scan` before the commit; an exception inside the
    block discards the whole batch. Operations apply in the order they were made: a
    `delete_prefix` removes the keys put earlier in the same batch, not those put after it.
    """

    def __init__(self, store: TerminusStore) -> None:
        self._store = store
        self._prefixes: list[bytes] = []
        self._writes: dict[bytes, bytes | None] = {}
        self._open = True

    def put(self, key: bytes, value: bytes) -> None:
        self._check_open()
        _check_key(key)
        _check_value(value)
        self._writes[key] = bytes(value)

    def delete(self, key: bytes) -> None:
        self._check_open()
        _check_key(key)
        self._writes[key] = None

    def delete_prefix(self, prefix: bytes) -> None:
        """Delete every key starting with `prefix` (non-empty: clearing a store is not a batch)."""
        self._check_open()
        _check_key(prefix, what="prefix")
        # Earlier writes under the prefix are undone here; the committed ones go at commit time,
        # before the writes that follow this call (see TerminusStore._commit).
        for key in [k for k in self._writes if k.startswith(prefix)]:
            del self._writes[key]
        self._prefixes = [p for p in self._prefixes if not p.startswith(prefix)]
        if not any(prefix.startswith(p) for p in self._prefixes):
            self._prefixes.append(prefix)

    def __len__(self) -> int:
        return len(self._prefixes) + len(self._writes)

    def _check_open(self) -> None:
        if not self._open:
            raise StoreError(f"{self._store.describe()}: batch used after its 'with' block ended")


class TerminusStore(abc.ABC):
    """A sorted bytes→bytes map with atomic batches, the capability it offers, and stats.

    Open with ``Class(path, sync=...)``, ``Class.open(...)`` or `qrouter.stores.open_store`. Use as a
    context manager or call `close()`.
    """

    name: ClassVar[str]
    """Registry name (``memory``, ``lmdb``, ``leveldb``)."""
    durability: ClassVar[int]
    """Highest terminus durability (0, 1, 2) this store can honour across a restart."""
    marker_file: ClassVar[str | None] = None
    """A file every directory of this backend has; None for stores without a directory."""

    def __init__(
        self, path: str | None, *, sync: str = "batched", flush_interval: float = 1.0
    ) -> None:
        if sync not in SYNC_MODES:
            raise StoreError(f"{self.name} store: sync must be one of {SYNC_MODES}, not {sync!r}")
        self.path = path
        self.sync = sync
        self.flush_interval = flush_interval
        self.commit_count = 0
        """Transactions committed since open (a single `put`/`delete` is one)."""
        self.last_commit_seconds = 0.0
        """Wall time of the last commit, fsync included."""
        self.commit_seconds_total = 0.0
        self._closed = False
        self._lock_fd: int | None = None
        self._last_flush = time.monotonic()
        self._log_fd: int | None = None
        self._log_synced = time.monotonic()
        self._log_cut: int | None = None  # the length to cut the log back to (log_append)
        self._log_memory: list[bytes] = []  # the record log of a store without a directory

    @classmethod
    def open(cls, path: str | None, *, sync: str = "batched", flush_interval: float = 1.0) -> Self:
        return cls(path, sync=sync, flush_interval=flush_interval)

    def describe(self) -> str:
        return f"{self.name} store {self.path}" if self.path else f"{self.name} store"

    # ---- the public API -------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        self._check_usable()
        _check_key(key)
        return self._get(key)

    def put(self, key: bytes, value: bytes) -> None:
        """Write one key in its own transaction; for more than one, use `batch`."""
        with self.batch() as b:
            b.put(key, value)

    def delete(self, key: bytes) -> None:
        """Delete one key (absent is fine) in its own transaction."""
        with self.batch() as b:
            b.delete(key)

    def scan(self, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Yield (key, value) for every key starting with `prefix`, in ascending key order.

        Read in chunks, each from its own read transaction, so a long scan neither pins old
        pages nor holds every value in memory. Each key is seen at most once and in order;
        a commit made during the scan may or may not be seen.
        """
        self._check_usable()
        if prefix[:1] == RESERVED:
            raise StoreError(f"{self.describe()}: keys starting with \\x00 are reserved")
        start = prefix or b"\x01"  # skips the reserved \x00 meta records
        while True:
            self._check_usable()
            chunk = self._scan_chunk(start, prefix, _SCAN_CHUNK_ITEMS, _SCAN_CHUNK_BYTES)
            if not chunk:
                return
            yield from chunk
            start = chunk[-1][0] + b"\x00"  # the next key after the last one seen

    def batch(self) -> _BatchContext:
        """``with store.batch() as b:`` — every write in the block commits at once, or none."""
        self._check_usable()
        return _BatchContext(self)

    def flush(self) -> None:
        """Force committed batches to stable storage (a no-op where there is none)."""
        self._check_usable()
        self._flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flush and release the store; calling it again is fine."""
        if self._closed:
            return
        self._closed = True
        try:
            self._close()
            if self._log_fd is not None:
                os.fsync(self._log_fd)
        finally:
            if self._log_fd is not None:
                os.close(self._log_fd)
                self._log_fd = None
            self._unlock()

    # ---- the record log (qrouter/stores/termini.py) ------------------------------------------------
    #
    # A plain append-only file in the store's directory: each entry is framed by its length
    # and crc32. Appending costs one write(2): no B-tree, memtable or compaction. The sync mode
    # applies as to commits: ``always`` fdatasyncs every append, ``batched`` at most every
    # `flush_interval`. A crash can leave a torn last entry: its output never left (the
    # router writes none before the append returns), so readers drop it, with whatever bytes
    # follow it as long as no intact entry does (what the file system kept of the write); a
    # bad entry with an intact one after it is corruption (StoreError). An append that fails
    # (a full disk) is cut off at once, so that no entry ever follows a torn one; the router
    # empties the log at start-up (qrouter/stores/termini.py, fold_log), which drops a torn tail.

    def log_append(self, entry: bytes) -> None:
        self._check_usable()
        t0 = time.perf_counter()
        if not self._log_on_disk():
            self._log_memory.append(entry)
        else:
            fd = self._log_file()
            frame = _LOG_FRAME.pack(len(entry), zlib.crc32(entry))
            try:
                # where this entry starts: a failed write (a full disk, EIO) is cut off there,
                # so that a later entry never follows a torn one (readers would call that
                # corruption, not a torn tail)
                if self._log_cut is not None:  # an earlier failed write not cut off yet
                    os.ftruncate(fd, self._log_cut)
                    self._log_cut = None
                end = os.lseek(fd, 0, os.SEEK_END)
                try:
                    written = os.writev(fd, [frame, entry])
                    if written != len(frame) + len(entry):  # a full disk, say
                        raise OSError(
                            errno.ENOSPC, f"short write ({written} of {len(frame) + len(entry)})"
                        )
                    if self.sync == "always" or (
                        time.monotonic() - self._log_synced >= self.flush_interval
                    ):
                        os.fdatasync(fd)
                        self._log_synced = time.monotonic()
                except OSError:
                    self._log_cut = end
                    os.ftruncate(fd, end)
                    self._log_cut = None
                    raise
            except OSError as exc:
                raise StoreError(f"{self.describe()}: record log write failed: {exc}") from exc
        elapsed = time.perf_counter() - t0
        self.commit_count += 1
        self.last_commit_seconds = elapsed
        self.commit_seconds_total += elapsed

    def log_read(self) -> list[bytes]:
        """Every entry of the record log, oldest first."""
        self._check_usable()
        if not self._log_on_disk():
            return list(self._log_memory)
        assert self.path is not None
        try:
            with open(os.path.join(self.path, LOG_FILE), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"{self.describe()}: record log unreadable: {exc}") from exc
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n:
            if pos + _LOG_FRAME.size > n:
                break  # a torn last entry
            length, crc = _LOG_FRAME.unpack_from(data, pos)
            end = pos + _LOG_FRAME.size + length
            entry = data[pos + _LOG_FRAME.size : end]
            if end > n:
                if _frame_after(data, pos):
                    raise StoreError(
                        f"{self.describe()}: record log {LOG_FILE} is corrupt at byte {pos}"
                    )
                break  # a torn last entry
            if zlib.crc32(entry) != crc:
                if end == n or not _frame_after(data, pos):
                    break  # a torn last entry (garbage after it holds no entry either)
                raise StoreError(
                    f"{self.describe()}: record log {LOG_FILE} is corrupt at byte {pos}"
                )
            out.append(entry)
            pos = end
        return out

    def log_clear(self) -> None:
        """Empty the record log (after its changes were committed to the records)."""
        self._check_usable()
        if not self._log_on_disk():
            self._log_memory.clear()
            return
        assert self.path is not None
        if self._log_fd is None and not os.path.exists(os.path.join(self.path, LOG_FILE)):
            return
        fd = self._log_file()
        try:
            os.ftruncate(fd, 0)
            if self.sync == "always":
                os.fdatasync(fd)
        except OSError as exc:
            raise StoreError(f"{self.describe()}: record log truncate failed: {exc}") from exc

    def _log_on_disk(self) -> bool:
        return self.marker_file is not None and bool(self.path)

    def _log_file(self) -> int:
        if self._log_fd is None:
            assert self.path is not None
            try:
                self._log_fd = os.open(
                    os.path.join(self.path, LOG_FILE), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644
                )
            except OSError as exc:
                raise StoreError(f"{self.describe()}: record log: {exc}") from exc
        return self._log_fd

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- for backends ---------------------------------------------------------------------

    @abc.abstractmethod
    def _get(self, key: bytes) -> bytes | None: ...

    @abc.abstractmethod
    def _scan_chunk(
        self, start: bytes, prefix: bytes, max_items: int, max_bytes: int
    ) -> list[tuple[bytes, bytes]]:
        """Pairs with key >= start and starting with prefix, in order; [] when none are left.

        Stop after `max_items` pairs or once the values read pass `max_bytes`, whichever
        comes first (at least one pair while any is left): the scan goes on from the last key.
        """

    @abc.abstractmethod
    def _commit(self, prefixes: list[bytes], writes: dict[bytes, bytes | None]) -> None:
        """Atomically: delete every key under each prefix, then apply `writes` (None = delete).

        Honours `self.sync`: with ``always`` the commit is durable on return.
        """

    def _flush(self) -> None:  # noqa: B027 - optional hook, default no-op
        """Make earlier commits durable; stores without disk need not override this."""

    @abc.abstractmethod
    def _close(self) -> None: ...

    def _flush_due(self) -> bool:
        """For ``batched`` backends: whether this commit should also fsync."""
        return time.monotonic() - self._last_flush >= self.flush_interval

    def _flushed(self) -> None:
        self._last_flush = time.monotonic()

    def commit_writes(self, puts: dict[bytes, bytes], deletes: set[bytes] | None = None) -> None:
        """One transaction of puts and deletes (disjoint key sets) whose keys the caller made
        itself (the router's group commit): no per-key checks, no Batch object."""
        if deletes:
            writes: dict[bytes, bytes | None] = dict.fromkeys(deletes)
            writes.update(puts)
        else:
            writes = dict(puts)
        if writes:
            self._run_commit([], writes)

    def _run_commit(self, prefixes: list[bytes], writes: dict[bytes, bytes | None]) -> None:
        self._check_usable()
        t0 = time.perf_counter()
        self._commit(prefixes, writes)
        elapsed = time.perf_counter() - t0
        self.commit_count += 1
        self.last_commit_seconds = elapsed
        self.commit_seconds_total += elapsed

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreError(f"{self.describe()} is closed")

    # ---- opening on-disk stores -----------------------------------------------------------

    def _prepare_dir(self) -> str:
        """Check the path, create it if missing, lock it. Returns the directory path.

        An empty or missing directory becomes a fresh store; a directory holding anything
        other than this backend's files is refused before anything is written into it.
        """
        path = self.path
        if not path:
            raise StoreError(f"{self.name} store: a directory path is needed (--store-path)")
        if os.path.exists(path) and not os.path.isdir(path):
            raise StoreError(f"{self.describe()}: not a directory")
        try:
            os.makedirs(path, exist_ok=True)
            listing = set(os.listdir(path))
        except OSError as exc:
            raise StoreError(f"{self.describe()}: {exc.strerror or exc}") from exc
        # A store being created by another opener has our lock file but maybe not yet the
        # backend's files: try the lock first so that opener's half-made store reads "in use",
        # not "foreign". Without our lock file, check first: a foreign directory is refused
        # before anything is written into it.
        if LOCK_FILE in listing:
            self._lock(path)
        entries = sorted(listing - {LOCK_FILE, LOG_FILE})
        if entries and self.marker_file not in entries:
            self._unlock()
            hint = ""
            for other, marker in (("lmdb", "data.mdb"), ("leveldb", "CURRENT")):
                if other != self.name and marker in entries:
                    hint = f" (it looks like a {other} store)"
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise StoreError(
                f"{self.describe()}: not a qrouter {self.name} store{hint}: it holds {shown}"
            )
        if self._lock_fd is None:
            self._lock(path)
        return path

    def _lock(self, path: str) -> None:
        try:
            fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"{self.describe()}: cannot create lock file: {exc}") from exc
        try:
            # flock, not fcntl locks: flock conflicts between two opens in one process too.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise StoreError(
                f"{self.describe()}: in use by another process (or already open in this one)"
            ) from exc
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _check_schema(self) -> None:
        """Write the schema record into a fresh store; refuse foreign, corrupt or newer ones."""
        raw = self._get(META_KEY)
        if raw is None:
            if self._scan_chunk(b"", b"", 1, 1):
                raise StoreError(
                    f"{self.describe()}: holds data but no qrouter schema record; "
                    "it was not written by qrouter"
                )
            self._commit([], {META_KEY: encode_meta(SCHEMA_VERSION)})
            return
        version = decode_meta(raw)
        if version is None:
            raise StoreError(f"{self.describe()}: the schema record is corrupt: {raw[:40]!r}")
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.describe()}: written by a newer qrouter (store schema {version}; "
                f"this one reads up to {SCHEMA_VERSION}); upgrade qrouter or use another path"
            )

    def _fail_open(self, exc: BaseException, what: str = "cannot open") -> StoreError:
        """Release the lock after a failed open and describe `exc` in one line."""
        self._closed = True
        self._unlock()
        return self._driver_error(what, exc)

    def _driver_error(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"{self.describe()}: {what}: {_one_line(exc, self.path)}")


class _BatchContext:
    """What `TerminusStore.batch` returns: commits the `Batch` on a clean exit only."""

    def __init__(self, store: TerminusStore) -> None:
        self._store = store
        self._batch = Batch(store)

    def __enter__(self) -> Batch:
        return self._batch

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        b = self._batch
        b._open = False
        if exc_type is None and len(b):
            self._store._run_commit(b._prefixes, b._writes)


_ENTRY_START = (0x50, 0x44, 0x58)  # qrouter/stores/termini.py: an item is P, D or X ...
_ITEM_PUT = 0x50  # ... key-length(2) key [value-length(4) value, for P]


def _frame_after(data: bytes, pos: int) -> bool:
    """Whether an intact log entry follows the bad one at `pos`: then the bad one is
    corruption in the middle of the log, not a torn tail. A crash tears only the last write,
    so after a torn entry there are only its own bytes (and whatever the file system left).
    Where the next entry would start: at the bad entry's declared end (its length intact,
    its bytes damaged), or where its items end (its length damaged; the items are walked as
    qrouter/stores/termini.py writes them). Linear in the tail."""
    head = _LOG_FRAME.size
    n = len(data)
    length = _LOG_FRAME.unpack_from(data, pos)[0] if pos + head <= n else 0
    if _intact_at(data, pos + head + length):
        return True
    p = pos + head
    while p + 3 <= n and data[p] in _ENTRY_START:
        q = p + 3 + int.from_bytes(data[p + 1 : p + 3], "big")
        if data[p] == _ITEM_PUT:
            if q + 4 > n:
                break
            q += 4 + int.from_bytes(data[q : q + 4], "big")
        if q > n:
            break
        p = q
    return p != pos + head + length and _intact_at(data, p)


def _intact_at(data: bytes, pos: int) -> bool:
    head = _LOG_FRAME.size
    if pos + head > len(data):
        return False
    length, crc = _LOG_FRAME.unpack_from(data, pos)
    end = pos + head + length
    return 0 < length and end <= len(data) and zlib.crc32(memoryview(data)[pos + head : end]) == crc


def encode_meta(version: int) -> bytes:
    return json.dumps({"store": _META_TAG, "schema": version}, sort_keys=True).encode()


def decode_meta(raw: bytes) -> int | None:
    """The schema version in a meta record, or None if the record is not one of ours."""
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("store") != _META_TAG:
        return None
    version = meta.get("schema")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return None
    return version


def _check_key(key: bytes, *, what: str = "key") -> None:
    if not isinstance(key, bytes):
        raise TypeError(f"store {what} must be bytes, not {type(key).__name__}")
    if not key:
        raise StoreError(f"store {what} must not be empty")
    if len(key) > MAX_KEY_SIZE:
        raise StoreError(f"store {what} is {len(key)} bytes; the limit is {MAX_KEY_SIZE}")
    if key[:1] == RESERVED:
        raise StoreError(f"store {what} {key[:20]!r}: keys starting with \\x00 are reserved")


def _check_value(value: bytes) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"store value must be bytes, not {type(value).__name__}")


def _one_line(exc: BaseException, path: str | None = None) -> str:
    """A driver's exception as one line, without the path it repeats and bytes decoded."""
    arg = exc.args[0] if len(exc.args) == 1 else None
    text = arg.decode(errors="replace") if isinstance(arg, bytes) else str(exc)
    if path and text.startswith(f"{path}: "):
        text = text[len(path) + 2 :]
    return " ".join(text.split()) or type(exc).__name__
