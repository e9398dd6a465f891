"""The memory store: a dict and a sorted key list; nothing survives the process.

Durability 0 by design: it is the default store, so a router with no disk configured never
promises a peer a terminus it would forget on restart. Within one process it behaves like the
others (same batch, scan and key rules), so the link registry needs no special case for it.
The path and the sync mode are accepted and ignored.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from qrouter.stores.base import TerminusStore


class MemoryStore(TerminusStore):
    name = "memory"
    durability = 0

    def __init__(
        self, path: str | None = None, *, sync: str = "batched", flush_interval: float = 1.0
    ) -> None:
        super().__init__(path, sync=sync, flush_interval=flush_interval)
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []  # sorted; scan walks it with bisect
        self._check_schema()

    def describe(self) -> str:
        return "memory store"

    def _get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def _scan_chunk(
        self, start: bytes, prefix: bytes, max_items: int, max_bytes: int
    ) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        size = 0
        i = bisect_left(self._keys, start)
        while i < len(self._keys) and len(out) < max_items and size < max_bytes:
            key = self._keys[i]
            if not key.startswith(prefix):
                break
            value = self._data[key]
            out.append((key, value))
            size += len(value)
            i += 1
        return out

    def _commit(self, prefixes: list[bytes], writes: dict[bytes, bytes | None]) -> None:
        for prefix in prefixes:
            i = bisect_left(self._keys, prefix)
            j = i
            while j < len(self._keys) and self._keys[j].startswith(prefix):
                del self._data[self._keys[j]]
                j += 1
            del self._keys[i:j]
        for key, value in writes.items():
            if value is None:
                if self._data.pop(key, None) is not None:
                    del self._keys[bisect_left(self._keys, key)]
            else:
                if key not in self._data:
                    insort(self._keys, key)
                self._data[key] = value

    def _close(self) -> None:
        self._data.clear()
        self._keys.clear()
