"""Durable client state: the unsettled maps of a client's durable links, in an LMDB file.

`Client(..., state_file=PATH)` keeps here, for every link whose terminus asks for durable
unsettled state (durable = 2), what AMQP 1.0 §2.6.13 needs to resume it after the
application itself crashed and restarted with the same container-id:

* a sender's unsettled deliveries: tag -> (last known state, the encoded message), written
  before the transfer goes out and deleted when the outcome is known and the delivery
  settled; and the link's tag prefix and counter, in the same transaction, so that
  `Sender.submitted` tells a restarted application how many messages it handed over;
* a receiver's unsettled deliveries: tag -> the state the application gave (null until it
  did), written when the transfer arrives and again before the disposition goes out, and
  deleted when the delivery is settled at both ends.

Keys: ``m<name>`` the sender's prefix and counter, ``s<len><name><tag>`` and
``r<len><name><tag>`` the records (``<len>``: the name's length, 2 bytes).

Group commit: writes are staged and committed in one LMDB transaction (one fsync) per event
loop iteration, by a callback scheduled at the first staged write; the client also commits
before every flush of the wire engine's output (`Client._commit_then`). So a record is durable
before any frame that depends on it leaves (a transfer, a disposition, a settlement), and
before the application can see what depends on it (a yielded message, an outcome): those
wake the application through callbacks queued after the commit.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

MAP_SIZE = 1 << 30  # the largest the file may grow to (LMDB reserves address space only)


def _key(kind: bytes, name: str, tag: bytes = b"") -> bytes:
    raw = name.encode()
    return kind + struct.pack(">H", len(raw)) + raw + tag


class ClientStore:
    """One LMDB file holding the unsettled maps of one client's durable links."""

    def __init__(
        self, path: str, schedule: Callable[[Callable[[], None]], Any] | None = None
    ) -> None:
        import lmdb  # (imported here: only clients with a state file need it)

        self.env: Any = lmdb.open(path, subdir=False, map_size=MAP_SIZE, max_dbs=0)
        self.closed = False
        self.schedule = schedule  # loop.call_soon: commits the staged writes soon
        self.pending: dict[bytes, bytes | None] = {}  # key -> value, None: delete
        self.scheduled = False
        self.commits = 0

    def _stage(self, key: bytes, value: bytes | None) -> None:
        if self.closed:
            return
        self.pending[key] = value
        if not self.scheduled:
            if self.schedule is None:
                self.commit()
                return
            self.scheduled = True
            self.schedule(self.commit)

    def commit(self) -> None:
        """Write every staged change in one durable transaction."""
        self.scheduled = False
        if not self.pending or self.closed:
            return
        pending, self.pending = self.pending, {}
        with self.env.begin(write=True) as txn:
            for key, value in pending.items():
                if value is None:
                    txn.delete(key)
                else:
                    txn.put(key, value)
        self.commits += 1

    def close(self) -> None:
        """Commit, close the file; later writes (a late callback) are ignored."""
        self.commit()
        self.env.close()
        self.closed = True

    # --- senders ---------------------------------------------------------------------------

    def sender_counter(self, name: str) -> tuple[bytes, int] | None:
        self.commit()
        with self.env.begin() as txn:
            raw = txn.get(_key(b"m", name))
        if raw is None or len(raw) != 12:
            return None
        return bytes(raw[:4]), int.from_bytes(raw[4:], "big")

    def put_sent(
        self,
        name: str,
        tag: bytes,
        state: bytes | None,
        payload: bytes,
        counter: tuple[bytes, int] | None = None,
    ) -> None:
        value = struct.pack(">I", len(state or b"")) + (state or b"") + payload
        self._stage(_key(b"s", name, tag), value)
        if counter is not None:
            self._stage(_key(b"m", name), counter[0] + counter[1].to_bytes(8, "big"))

    def sent(self, name: str) -> Iterator[tuple[bytes, bytes | None, bytes]]:
        """(tag, state or None, payload) of the sender's unsettled deliveries."""
        for tag, value in self._scan(_key(b"s", name)):
            (n,) = struct.unpack(">I", value[:4])
            yield tag, (bytes(value[4 : 4 + n]) or None), bytes(value[4 + n :])

    def forget_sent(self, name: str, tag: bytes) -> None:
        self._stage(_key(b"s", name, tag), None)

    # --- receivers -------------------------------------------------------------------------

    def put_received(self, name: str, tag: bytes, state: bytes | None) -> None:
        self._stage(_key(b"r", name, tag), state or b"")

    def received(self, name: str) -> Iterator[tuple[bytes, bytes | None]]:
        """(tag, the application's state or None) of the receiver's unsettled deliveries."""
        for tag, value in self._scan(_key(b"r", name)):
            yield tag, (bytes(value) or None)

    def forget_received(self, name: str, tag: bytes) -> None:
        self._stage(_key(b"r", name, tag), None)

    # ---------------------------------------------------------------------------------------

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        self.commit()
        out: list[tuple[bytes, bytes]] = []
        with self.env.begin() as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for key, value in cur:
                    if not key.startswith(prefix):
                        break
                    out.append((bytes(key[len(prefix) :]), bytes(value)))
        return iter(out)
