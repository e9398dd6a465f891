"""The link registry's persistence on a terminus store (qrouter/stores/): termini of durability >= 1
survive a restart; the time the router was last alive bounds how long a terminus that was
attached at a crash has been suspended.

The router's terminus (source or target) is kept AMQP-encoded by our own codec, so filters,
capabilities and symbols come back with their exact types.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterator

from qrouter._fast.codec import decode, encode
from qrouter._fast.engine import described_to_dict, source_value, target_value
from qrouter.link_registry import Key, Terminus
from qrouter.store_health import StoreHealth, check_injected
from qrouter.stores import open_store
from qrouter.stores.base import StoreError, TerminusStore
from qrouter.stores.termini import (
    TerminusKey,
    TerminusRecord,
    delete_terminus,
    fold_log,
    load_termini,
    log_drop_entry,
    save_terminus,
    unsettled_prefix,
)

log = logging.getLogger("qrouter.store")

__all__ = ["StorePersistence", "terminus_digest"]


def terminus_digest(key: Key) -> bytes:
    """The digest that names a terminus's records in the store."""
    return TerminusKey(*key).digest  # type: ignore[arg-type]


ALIVE_KEY = b"r/alive"


class StorePersistence:
    def __init__(self, store: TerminusStore) -> None:
        self.store = store
        self.durability = store.durability
        # called with each commit's seconds (qrouter/metrics.py: the commit latency histogram)
        self.on_commit: Callable[[float], None] | None = None
        # called with a deleted terminus's record prefix (the engine's Router.drop_records)
        self.on_drop: Callable[[bytes], None] | None = None
        self._recovered = (
            False  # the record log of a previous run folded (qrouter/stores/termini.py)
        )
        # the keys a checkpoint wrote to the records before emptying the log failed: the
        # engine keeps its net changes for the retry and cannot know the records hold them
        self._half: set[bytes] = set()
        # a failed commit: said once, counted, retried (qrouter/store_health.py)
        self.health = StoreHealth()
        self.health.probe = self._probe

    @property
    def available(self) -> bool:
        """False while commits fail: no new durable work (qrouter/link_registry.py)."""
        return self.health.available

    @classmethod
    def open(
        cls, name: str, path: str | None, sync: str = "batched", map_size: int | None = None
    ) -> StorePersistence:
        return cls(open_store(name, path, sync=sync, map_size=map_size))

    def save(self, t: Terminus) -> None:
        try:
            check_injected()
            with self.store.batch() as b:
                save_terminus(b, _record(t), with_unsettled=False)
        except Exception as exc:
            self.health.failed(exc)
            raise
        self._committed()

    def delete(self, key: Key) -> None:
        tkey = TerminusKey(*key)  # type: ignore[arg-type]
        prefix = unsettled_prefix(tkey)
        try:
            self._recover()
            check_injected()
            with self.store.batch() as b:
                delete_terminus(b, tkey)
            # logged puts of its records, older than this, must not come back in a replay
            self.store.log_append(log_drop_entry(prefix))
        except Exception as exc:
            self.health.failed(exc)
            raise
        self._committed()
        if self.on_drop is not None:
            self.on_drop(prefix)

    def load(self) -> Iterator[Terminus]:
        self._recover()
        for rec in load_termini(self.store):
            t = _terminus(rec)
            t.records = dict(rec.unsettled)
            yield t

    def recover(self) -> None:
        """Fold a previous run's record log into the records now, if not done yet (before
        the guaranteed topics read theirs: qrouter/guarantee.py)."""
        self._recover()

    def _recover(self) -> None:
        """Once, before the first write: fold what a previous run logged into the records,
        so that this run's log starts empty."""
        if not self._recovered:
            folded = fold_log(self.store)
            if folded:
                log.info("store: %d record-log entries folded into the records", folded)
            self._recovered = True

    def commit(
        self, blob: bytes | None, puts: dict[bytes, bytes] | None, deletes: set[bytes] | None
    ) -> None:
        """The data plane's group commit (Router.commit_log): one loop iteration's changes
        as one log entry (`blob`), or a checkpoint: the net changes since the last one
        (`puts`, `deletes`) committed to the records in one transaction, then the log
        emptied.

        If it raises (a full disk, a full map, EIO), nothing of it counts as stored: the
        engine keeps the changes and holds the output that depends on them until a retry
        succeeds (qrouter/store_health.py)."""
        try:
            self._recover()
            check_injected()
            if blob is not None:
                self.store.log_append(blob)
            else:
                self._checkpoint(puts or {}, deletes)
        except Exception as exc:
            self.health.failed(exc)
            raise
        self._committed()

    def _checkpoint(self, puts: dict[bytes, bytes], deletes: set[bytes] | None) -> None:
        """The net changes to the records, then the log emptied; a retry after the records
        took a checkpoint whose log was not emptied (a failed ftruncate) deletes what that
        one wrote and the net changes no longer hold.

        The engine keeps its net changes for the retry as if nothing had been written, so a
        key made after the last good checkpoint and deleted before the retry is only dropped
        from them (the records lacked it then): without the delete here the records would
        keep it, and a restart bring back a record long settled."""
        if self._half:
            stale = self._half.difference(puts)  # (deleted since: a delete the store may lack)
            deletes = (set(deletes) | stale) if deletes else stale
        self.store.commit_writes(puts, deletes)
        try:
            self.store.log_clear()
        except Exception:
            self._half.update(puts)
            raise
        self._half.clear()

    def mark_alive(self, now: float | None = None) -> None:
        """Note the time (housekeeping, once a second). A failure is counted and left to the
        retry: the router goes on."""
        try:
            self._probe(now)
        except Exception as exc:  # noqa: BLE001 - any failure of the store
            self.health.failed(exc)
            return
        self._committed()

    def _probe(self, now: float | None = None) -> None:
        check_injected()
        self.store.put(ALIVE_KEY, struct.pack(">d", time.time() if now is None else now))

    def _committed(self) -> None:
        if self.on_commit is not None:
            self.on_commit(self.store.last_commit_seconds)

    def last_alive(self) -> float | None:
        raw = self.store.get(ALIVE_KEY)
        if raw is None or len(raw) != 8:
            return None
        return float(struct.unpack(">d", raw)[0])

    def close(self) -> None:
        self.store.close()


def _record(t: Terminus) -> TerminusRecord:
    fields = {k: v for k, v in t.fields.items() if k != "_code"}
    encoded = encode(source_value(fields) if t.role == "sender" else target_value(fields))
    terminus = {"amqp": encoded}
    return TerminusRecord(
        key=TerminusKey(*t.key),  # type: ignore[arg-type]
        address=t.address,
        source=terminus if t.role == "sender" else None,
        target=terminus if t.role == "receiver" else None,
        durability=t.durable,
        expiry_policy=t.expiry_policy,  # type: ignore[arg-type]
        timeout=t.timeout,
        suspended_at=t.suspended_at,
    )


def _terminus(rec: TerminusRecord) -> Terminus:
    stored = rec.source if rec.key.role == "sender" else rec.target
    fields: dict = {}
    if stored and isinstance(stored.get("amqp"), bytes):
        try:
            value, _ = decode(stored["amqp"])
            fields = described_to_dict(value)
        except ValueError as e:
            raise StoreError(f"terminus of link {rec.key.link_name!r}: undecodable: {e}") from e
    k = rec.key
    return Terminus(
        key=(k.local_container, k.remote_container, k.link_name, k.role),
        address=rec.address,
        fields=fields,
        durable=rec.durability,
        expiry_policy=rec.expiry_policy,
        timeout=float(rec.timeout),
        suspended_at=rec.suspended_at,
    )
