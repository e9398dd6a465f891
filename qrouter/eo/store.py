"""Where a `TopicRouter` keeps its durable records (docs/exactly-once.md, "What is durable").

`RecordStore` is the whole interface: atomic batches of puts and deletes, and a prefix scan for
recovery. The router commits one batch per input, before any message that depends on it is
sent. `MemoryRecordStore` is for tests and the simulation (a simulated crash keeps exactly what
was committed); `TerminusRecordStore` puts the records into a `qrouter.stores.TerminusStore` (memory,
LMDB, LevelDB) under a per-topic prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from qrouter.eo.keys import topic_prefix


class RecordStore(Protocol):
    def commit(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes]) -> None:
        """Apply every put and delete at once (deletes of absent keys are fine)."""

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with `prefix`, in key order."""


class MemoryRecordStore:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.commits = 0

    def commit(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes]) -> None:
        self.commits += 1
        for key in deletes:
            self.data.pop(key, None)
        self.data.update(puts)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key in sorted(k for k in self.data if k.startswith(prefix)):
            yield key, self.data[key]


class TerminusRecordStore:
    """Records of one topic inside a `qrouter.stores.TerminusStore`, under ``eo/<escaped topic>/``
    (qrouter/eo/keys.py: no other topic's keys in its range)."""

    def __init__(self, store: Any, topic: str) -> None:
        self.store = store
        self.prefix = topic_prefix(topic)

    def commit(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes]) -> None:
        with self.store.batch() as batch:
            for key in deletes:
                batch.delete(self.prefix + key)
            for key, value in puts.items():
                batch.put(self.prefix + key, value)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        cut = len(self.prefix)
        for key, value in self.store.scan(self.prefix + prefix):
            yield key[cut:], value
