"""What the link registry persists: termini and their unsettled deliveries (DESIGN.md §5).

Key layout (every store key is bytes; ``D`` is `TerminusKey.digest`, 32 bytes)::

    t/D          one TerminusRecord (without its unsettled map)
    u/D/<id>     one UnsettledRecord per unsettled delivery of that terminus

Why a digest and not the names: container-ids and link names are peer-chosen strings whose sum
can pass the 511-byte key limit; a fixed-length BLAKE2b digest of the length-prefixed key fields
keeps every key short and makes ``u/D/`` an exact prefix (no separator can occur inside ``D``
ambiguously, since it has a fixed length). The full key is stored inside the record, and
`load_termini` checks that it hashes back to ``D``.

Why two kinds of record: on a durability-2 link the unsettled map changes on every delivery
and disposition (the seed design: "high frequency & low latency update of unsettled state").
Each change is one small put or delete of a ``u/`` key in the loop's group-commit batch; the
terminus record, which changes only at attach, detach and suspension, is not rewritten.

Encoding. Every value starts with a kind byte and a format version byte:

* ``T 1`` + `qrouter.stores.values.pack` of a dict (field names as below; unknown fields are ignored so
  that a later minor version can add optional ones). Written rarely; flexible.
* ``U 1`` + flags (1 settled, 2 has state, 4 has message, 8 has origin, 16 has tag) + 4-byte
  state length + state + [1-byte tag length + tag] + [1-byte origin length + origin] +
  message bytes to the end. Written per delivery; no parsing beyond a struct unpack, and the
  message bytes are stored as they are (no base64, no copy into a container format).

The ``<id>`` of an unsettled record is the delivery's tag, unless the record carries the tag
itself (flag 16): then the id is one the router chose. The router names the records of a
producer's deliveries that way, by a per-attachment nonce and a counter, so that each batch
appends to the end of the terminus's key range instead of scattering over it as the
producer's own tags would (docs/performance.md, durable links). Readers before flag 16
refuse such a record (unknown flags) rather than misread it.

A record that does not decode, or whose version is newer than this code, is a `StoreError`
naming the key — never skipped, because a skipped record is an unsettled delivery lost.

The record log (`TerminusStore.log_append`: a file beside the backend's, qrouter-records.log).
The router does not update ``u/`` records per delivery as they change: each loop iteration's
changes are one log entry, the concatenation, in the order made, of ``P`` key-length(2) key
value-length(4) value (a put), ``D`` key-length(2) key (a delete), ``X`` prefix-length(2)
prefix (every record under the prefix goes: a terminus deleted) and ``U`` key-length(2) key
count(2) then count times offset(4) byte (a patch: those bytes of the record's value
changed; written only for a record the log put since the last checkpoint, so its value is
in the log before the patch: a guaranteed topic's origin record whose state changed,
qrouter/_fast/eo_core.pyx `_log_state`). A guaranteed topic's record may be named by
number instead of its key (some 50 octets): every put of a guaranteed topic's key takes the
next number, from 0 where the log begins, and ``u`` number(4) count(1) then count times
offset(2) byte patches, ``d`` number(4) deletes, the key of that put (eo_core.pyx
`LogRefs`). About once a second or
16 MiB (a checkpoint) the net changes since the previous checkpoint are committed to the
``u/`` records in one transaction, and then the log is emptied. Most deliveries are made and
settled within a second, so they cost the store a share of one append per loop iteration
and never touch the records' B-tree (LMDB) or levels (LevelDB). Whoever reads the
records replays the log over them first (`read_log`): `load_termini` in memory, and the router
at start-up into the store (`fold_log`). A logged put of a terminus that is no longer stored
(deleted after the entry was written) is dropped.

The guaranteed topics' records (``eo/<escaped topic>/...`` and the topics' marks
``eot/<topic>``, qrouter/eo/keys.py and qrouter/guarantee.py) go through the same log and checkpoint (qrouter/_fast/eo_log.pxi);
they belong to no terminus, so the fold keeps every logged put of theirs.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, cast, get_args

from qrouter.stores.base import Batch, StoreError, TerminusStore
from qrouter.stores.values import Value, pack, unpack

Role = Literal["sender", "receiver"]
ExpiryPolicy = Literal["link-detach", "session-end", "connection-close", "never"]
ROLES: tuple[str, ...] = get_args(Role)
EXPIRY_POLICIES: tuple[str, ...] = get_args(ExpiryPolicy)

TERMINUS_PREFIX = b"t/"
UNSETTLED_PREFIX = b"u/"
MAX_TAG_SIZE = 32  # 2.8.7 delivery-tag: at most 32 octets
RECORD_VERSION = 1

_DIGEST_SIZE = 32
_UNSETTLED_HEAD = struct.Struct(">BI")  # flags, state length
_SETTLED, _HAS_STATE, _HAS_MESSAGE, _HAS_ORIGIN, _HAS_TAG = 1, 2, 4, 8, 16


@dataclass(frozen=True)
class TerminusKey:
    """The registry key: which link, seen from this router.

    `role` is the role of the *router's* link endpoint: a client's sender attaches to a router
    ``receiver``. Container-ids and the link name are as on the wire (already validated and
    bounded by the registry).
    """

    local_container: str
    remote_container: str
    link_name: str
    role: Role

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {self.role!r}")

    @cached_property
    def digest(self) -> bytes:
        fields = [self.local_container, self.remote_container, self.link_name, self.role]
        return hashlib.blake2b(
            pack(cast(Value, fields)), digest_size=_DIGEST_SIZE, person=b"qrouter-terminus"
        ).digest()

    def sort_key(self) -> tuple[str, str, str, str]:
        return (self.local_container, self.remote_container, self.link_name, self.role)


@dataclass(frozen=True)
class UnsettledRecord:
    """One unsettled delivery of a durability-2 terminus (2.6.13 resuming deliveries).

    `state` is the encoded AMQP delivery-state (None: no state yet), `message` the encoded
    message bytes as sent (None when this side does not hold them, e.g. a receiving terminus),
    `settled` whether this side has settled it (kept until the peer is known to have seen it),
    `origin` for an outbound copy the inbound delivery it copies (that terminus's digest and
    the id of its record), so an outcome still reaches its producer after a restart. `tag` is
    the delivery's tag when the record is stored under an id of the router's (None: the id
    is the tag).
    """

    state: bytes | None = None
    message: bytes | None = None
    settled: bool = False
    origin: bytes | None = None
    tag: bytes | None = None


@dataclass
class TerminusRecord:
    """A terminus that outlives its link: configuration (durability >= 1) and, at durability 2,
    its unsettled deliveries.

    `source`/`target`: the terminus fields as simple values (address, durable, expiry_policy,
    timeout, dynamic, distribution_mode, filter, capabilities, ...); filter values the router
    cannot represent simply are kept as their AMQP-encoded bytes. `durability` is what was
    granted (the request capped by the store). `suspended_at` is the wall-clock time
    (time.time()) the link was detached without closing, or None while attached: expiry counts
    from it, also across a restart.
    """

    key: TerminusKey
    address: str | None = None
    source: dict[str, Value] | None = None
    target: dict[str, Value] | None = None
    durability: int = 0
    expiry_policy: ExpiryPolicy = "session-end"  # 3.5.3 source: expiry-policy default
    timeout: float = 0  # seconds (3.5.3 timeout is a uint; a float is kept as it is)
    suspended_at: float | None = None
    unsettled: dict[bytes, UnsettledRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.durability not in (0, 1, 2):
            raise ValueError(f"durability must be 0, 1 or 2, not {self.durability!r}")
        if self.expiry_policy not in EXPIRY_POLICIES:
            raise ValueError(f"expiry policy must be one of {EXPIRY_POLICIES}")
        if not (isinstance(self.timeout, int | float) and 0 <= self.timeout < 2**32):
            raise ValueError(f"timeout must be 0 <= seconds < 2**32, not {self.timeout!r}")
        if self.suspended_at is not None and not math.isfinite(self.suspended_at):
            raise ValueError("suspended_at must be a finite time")
        for tag in self.unsettled:
            _check_tag(tag)


# ---- keys -------------------------------------------------------------------------------


def terminus_key(key: TerminusKey) -> bytes:
    return TERMINUS_PREFIX + key.digest


def unsettled_prefix(key: TerminusKey) -> bytes:
    return UNSETTLED_PREFIX + key.digest + b"/"


def unsettled_key(key: TerminusKey, tag: bytes) -> bytes:
    return unsettled_prefix(key) + tag


def _check_tag(tag: bytes) -> None:
    if not isinstance(tag, bytes) or len(tag) > MAX_TAG_SIZE:
        raise ValueError(f"delivery tag must be bytes of at most {MAX_TAG_SIZE} octets")


# ---- writing (into a batch: the caller's group commit) ----------------------------------


def save_terminus(batch: Batch, rec: TerminusRecord, *, with_unsettled: bool = True) -> None:
    """Write `rec`. With `with_unsettled` the stored unsettled map becomes exactly
    `rec.unsettled`; without, only the terminus record is written (e.g. on suspension) and the
    stored deliveries stay as they are."""
    batch.put(terminus_key(rec.key), encode_terminus(rec))
    if with_unsettled:
        batch.delete_prefix(unsettled_prefix(rec.key))
        for tag, delivery in rec.unsettled.items():
            batch.put(unsettled_key(rec.key, tag), encode_unsettled(delivery))


def put_unsettled(batch: Batch, key: TerminusKey, tag: bytes, rec: UnsettledRecord) -> None:
    _check_tag(tag)
    batch.put(unsettled_key(key, tag), encode_unsettled(rec))


def drop_unsettled(batch: Batch, key: TerminusKey, tag: bytes) -> None:
    _check_tag(tag)
    batch.delete(unsettled_key(key, tag))


def delete_terminus(batch: Batch, key: TerminusKey) -> None:
    """Forget the terminus and every unsettled delivery it had."""
    batch.delete(terminus_key(key))
    batch.delete_prefix(unsettled_prefix(key))


# ---- the record log ------------------------------------------------------------------

_LOG_PUT, _LOG_DEL, _LOG_DROP, _LOG_PATCH = 0x50, 0x44, 0x58, 0x55
# a patch and a delete that name their record by number (qrouter/_fast/eo_core.pyx, LogRefs):
# the n-th put of a guaranteed topic's key since the log began, from 0
_LOG_PATCH_REF, _LOG_DEL_REF = 0x75, 0x64
# the keys a log entry may name: delivery records, and the guaranteed topics' records
GUARANTEE_PREFIXES = (b"eo/", b"eot/")
_LOGGED_PREFIXES = (UNSETTLED_PREFIX, *GUARANTEE_PREFIXES)


def log_drop_entry(prefix: bytes) -> bytes:
    """A log entry saying every record under `prefix` is gone."""
    return bytes([_LOG_DROP]) + len(prefix).to_bytes(2, "big") + prefix


def log_put_entry(key: bytes, value: bytes) -> bytes:
    """A log entry putting one record (the engine writes these itself: durable.pxi)."""
    return (
        bytes([_LOG_PUT])
        + len(key).to_bytes(2, "big")
        + key
        + len(value).to_bytes(4, "big")
        + value
    )


def log_delete_entry(key: bytes) -> bytes:
    return bytes([_LOG_DEL]) + len(key).to_bytes(2, "big") + key


def log_patch_entry(key: bytes, changes: list[tuple[int, int]]) -> bytes:
    """A log entry changing bytes of a record the log put before it: (offset, byte) pairs
    (the engine writes these itself: eo_core.pyx `_log_state`)."""
    return (
        bytes([_LOG_PATCH])
        + len(key).to_bytes(2, "big")
        + key
        + len(changes).to_bytes(2, "big")
        + b"".join(off.to_bytes(4, "big") + bytes([byte]) for off, byte in changes)
    )


def log_patch_ref_entry(ref: int, changes: list[tuple[int, int]]) -> bytes:
    """A patch of the record put by the log's `ref`-th guaranteed-topic put (offsets below
    65,536; the engine writes these itself)."""
    return (
        bytes([_LOG_PATCH_REF])
        + ref.to_bytes(4, "big")
        + bytes([len(changes)])
        + b"".join(off.to_bytes(2, "big") + bytes([byte]) for off, byte in changes)
    )


def log_delete_ref_entry(ref: int) -> bytes:
    return bytes([_LOG_DEL_REF]) + ref.to_bytes(4, "big")


def _patched(value: bytes | None, blob: bytes, pos: int, count: int, width: int = 4) -> bytes:
    """`value` with a patch entry's `count` changes (at `pos` of `blob`, each an offset of
    `width` octets and the byte) applied."""
    if value is None:
        raise ValueError("a patch of a record the log did not put before it")
    out = bytearray(value)
    for i in range(pos, pos + (width + 1) * count, width + 1):
        off = int.from_bytes(blob[i : i + width], "big")
        if off >= len(out):
            raise ValueError("a patch past its record's end")
        out[off] = blob[i + width]
    return bytes(out)


@dataclass
class LogReplay:
    """The net effect of the record log: `drops` (prefixes whose stored records go, applied
    first), then `changes` (key -> value to put, or None to delete); `entries` read."""

    drops: list[bytes] = field(default_factory=list)
    changes: dict[bytes, bytes | None] = field(default_factory=dict)
    entries: int = 0


def read_log(store: TerminusStore) -> LogReplay:
    """Replay the record log, oldest entry first; a StoreError names an entry that does not
    parse (never skipped: it holds deliveries)."""
    out = LogReplay()
    changes = out.changes
    puts: list[bytes] = []  # the guaranteed topics' puts' keys, by number (LogRefs)
    for blob in store.log_read():
        out.entries += 1
        pos, n = 0, len(blob)
        try:
            while pos < n:
                op = blob[pos]
                if op == _LOG_PATCH_REF or op == _LOG_DEL_REF:
                    if pos + 5 > n:
                        raise ValueError("truncated record number")
                    ref = int.from_bytes(blob[pos + 1 : pos + 5], "big")
                    if ref >= len(puts):
                        raise ValueError(f"record number {ref} names no put before it")
                    key = puts[ref]
                    pos += 5
                    if op == _LOG_DEL_REF:
                        changes[key] = None
                        continue
                    if pos + 1 > n:
                        raise ValueError("truncated patch count")
                    count = blob[pos]
                    if pos + 1 + 3 * count > n:
                        raise ValueError("truncated patch")
                    changes[key] = _patched(changes.get(key), blob, pos + 1, count, 2)
                    pos += 1 + 3 * count
                    continue
                if pos + 3 > n:
                    raise ValueError("truncated")
                klen = int.from_bytes(blob[pos + 1 : pos + 3], "big")
                key = blob[pos + 3 : pos + 3 + klen]
                pos += 3 + klen
                if len(key) != klen:
                    raise ValueError("truncated key")
                if op == _LOG_PUT:
                    if pos + 4 > n:
                        raise ValueError("truncated value length")
                    vlen = int.from_bytes(blob[pos : pos + 4], "big")
                    value = blob[pos + 4 : pos + 4 + vlen]
                    if pos + 4 + vlen > n:
                        raise ValueError("truncated value")
                    pos += 4 + vlen
                    changes[key] = value
                    if key.startswith(GUARANTEE_PREFIXES):
                        puts.append(key)
                elif op == _LOG_PATCH:
                    if pos + 2 > n:
                        raise ValueError("truncated patch count")
                    count = int.from_bytes(blob[pos : pos + 2], "big")
                    if pos + 2 + 5 * count > n:
                        raise ValueError("truncated patch")
                    changes[key] = _patched(changes.get(key), blob, pos + 2, count)
                    pos += 2 + 5 * count
                elif op == _LOG_DEL:
                    changes[key] = None
                elif op == _LOG_DROP:
                    for k in [k for k in changes if k.startswith(key)]:
                        changes[k] = None
                    out.drops.append(key)
                else:
                    raise ValueError(f"unknown entry {op:#x}")
                if not key.startswith(_LOGGED_PREFIXES):
                    raise ValueError(f"key {key!r} is not a delivery or guarantee record's")
        except ValueError as exc:
            raise StoreError(
                f"{store.describe()}: record log entry {out.entries} is corrupt: {exc}"
            ) from exc
    return out


def fold_log(store: TerminusStore) -> int:
    """Apply the record log to the records in one transaction, then empty it (the router, at
    start-up). Returns the number of log entries folded. Replaying entries already applied
    changes nothing, so a crash between the two steps is harmless."""
    replay = read_log(store)
    if not replay.entries:
        store.log_clear()  # a torn entry alone
        return 0
    alive: dict[bytes, bool] = {}
    with store.batch() as b:
        for prefix in replay.drops:
            b.delete_prefix(prefix)
        for key, value in replay.changes.items():
            if value is None:
                b.delete(key)
            elif not key.startswith(UNSETTLED_PREFIX) or _terminus_stored(store, key, alive):
                b.put(key, value)  # (a guaranteed topic's record has no terminus)
    store.flush()
    store.log_clear()
    return replay.entries


def _terminus_stored(store: TerminusStore, ukey: bytes, alive: dict[bytes, bool]) -> bool:
    digest, _ = _split_unsettled_key(store, ukey)
    if digest not in alive:
        alive[digest] = store.get(TERMINUS_PREFIX + digest) is not None
    return alive[digest]


# ---- reading (at start-up and by qrouter-tool, never on the per-message path) -----------


def load_termini(store: TerminusStore) -> list[TerminusRecord]:
    """Every stored terminus with its unsettled map (the record log replayed over the
    records), sorted by key fields."""
    by_digest: dict[bytes, TerminusRecord] = {}
    for skey, value in store.scan(TERMINUS_PREFIX):
        rec = _decode_terminus_at(store, skey, value)
        by_digest[rec.key.digest] = rec
    replay = read_log(store)
    for skey, value in store.scan(UNSETTLED_PREFIX):
        if skey in replay.changes or any(skey.startswith(p) for p in replay.drops):
            continue  # the log has a newer word on it
        digest, tag = _split_unsettled_key(store, skey)
        owner = by_digest.get(digest)
        if owner is None:
            raise StoreError(f"{store.describe()}: record {skey!r}: delivery of no terminus")
        owner.unsettled[tag] = _decode_unsettled_at(store, skey, value)
    for skey, logged in replay.changes.items():
        if logged is None or not skey.startswith(UNSETTLED_PREFIX):
            continue
        digest, tag = _split_unsettled_key(store, skey)
        owner = by_digest.get(digest)
        if owner is not None:  # else deleted after the entry was written
            owner.unsettled[tag] = _decode_unsettled_at(store, skey, logged)
    return sorted(by_digest.values(), key=lambda r: r.key.sort_key())


def load_terminus(store: TerminusStore, key: TerminusKey) -> TerminusRecord | None:
    """One terminus with its unsettled map, or None."""
    value = store.get(terminus_key(key))
    if value is None:
        return None
    rec = _decode_terminus_at(store, terminus_key(key), value)
    prefix = unsettled_prefix(key)
    for skey, raw in store.scan(prefix):
        rec.unsettled[skey[len(prefix) :]] = _decode_unsettled_at(store, skey, raw)
    return rec


def _decode_terminus_at(store: TerminusStore, skey: bytes, value: bytes) -> TerminusRecord:
    try:
        rec = decode_terminus(value)
    except ValueError as exc:
        raise StoreError(f"{store.describe()}: record {skey!r} is corrupt: {exc}") from exc
    if terminus_key(rec.key) != skey:
        raise StoreError(f"{store.describe()}: record {skey!r} is corrupt: key mismatch")
    return rec


def _decode_unsettled_at(store: TerminusStore, skey: bytes, value: bytes) -> UnsettledRecord:
    try:
        return decode_unsettled(value)
    except ValueError as exc:
        raise StoreError(f"{store.describe()}: record {skey!r} is corrupt: {exc}") from exc


def _split_unsettled_key(store: TerminusStore, skey: bytes) -> tuple[bytes, bytes]:
    head = len(UNSETTLED_PREFIX)
    digest = skey[head : head + _DIGEST_SIZE]
    sep = skey[head + _DIGEST_SIZE : head + _DIGEST_SIZE + 1]
    tag = skey[head + _DIGEST_SIZE + 1 :]
    if len(digest) != _DIGEST_SIZE or sep != b"/" or len(tag) > MAX_TAG_SIZE:
        raise StoreError(f"{store.describe()}: record {skey!r} is corrupt: bad key")
    return digest, tag


# ---- encoding ---------------------------------------------------------------------------


def encode_terminus(rec: TerminusRecord) -> bytes:
    k = rec.key
    body: dict[str, Value] = {
        "key": [k.local_container, k.remote_container, k.link_name, k.role],
        "address": rec.address,
        "source": rec.source,
        "target": rec.target,
        "durability": rec.durability,
        "expiry_policy": rec.expiry_policy,
        "timeout": rec.timeout,
        "suspended_at": None if rec.suspended_at is None else float(rec.suspended_at),
    }
    return b"T" + bytes([RECORD_VERSION]) + pack(body)


def decode_terminus(data: bytes) -> TerminusRecord:
    """The record in `data` (its unsettled map empty); ValueError if it is not a valid one."""
    body = unpack(_check_header(data, b"T"))
    if not isinstance(body, dict):
        raise ValueError("terminus body is not a map")
    key = body.get("key")
    if not (isinstance(key, list) and len(key) == 4 and all(isinstance(f, str) for f in key)):
        raise ValueError("bad terminus key")
    local, remote, name, role = cast(list[str], key)
    if role not in ROLES:
        raise ValueError(f"bad role {role!r}")
    address = _typed(body, "address", str | None)
    source = _typed(body, "source", dict | None)
    target = _typed(body, "target", dict | None)
    durability = _typed(body, "durability", int)
    expiry = _typed(body, "expiry_policy", str)
    timeout = _typed(body, "timeout", int | float)
    suspended = _typed(body, "suspended_at", float | None)
    return TerminusRecord(  # __post_init__ range-checks what the types let through
        key=TerminusKey(local, remote, name, cast(Role, role)),
        address=cast(str | None, address),
        source=cast(dict[str, Value] | None, source),
        target=cast(dict[str, Value] | None, target),
        durability=cast(int, durability),
        expiry_policy=cast(ExpiryPolicy, expiry),
        timeout=cast(float, timeout),
        suspended_at=cast(float | None, suspended),
    )


def _typed(body: dict[str, Value], name: str, kind: object) -> Value:
    value = body.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):  # type: ignore[arg-type]
        raise ValueError(f"bad {name} {value!r:.40}")
    return value


def encode_unsettled(rec: UnsettledRecord) -> bytes:
    flags = (
        (_SETTLED if rec.settled else 0)
        | (_HAS_STATE if rec.state is not None else 0)
        | (_HAS_MESSAGE if rec.message is not None else 0)
        | (_HAS_ORIGIN if rec.origin is not None else 0)
        | (_HAS_TAG if rec.tag is not None else 0)
    )
    state = rec.state or b""
    head = b"U" + bytes([RECORD_VERSION]) + _UNSETTLED_HEAD.pack(flags, len(state))
    tag = b"" if rec.tag is None else bytes([len(rec.tag)]) + rec.tag
    origin = b"" if rec.origin is None else bytes([len(rec.origin)]) + rec.origin
    return head + state + tag + origin + (rec.message or b"")


def decode_unsettled(data: bytes) -> UnsettledRecord:
    body = _check_header(data, b"U")
    if len(body) < _UNSETTLED_HEAD.size:
        raise ValueError("truncated")
    flags, state_len = _UNSETTLED_HEAD.unpack_from(body)
    if flags & ~(_SETTLED | _HAS_STATE | _HAS_MESSAGE | _HAS_ORIGIN | _HAS_TAG):
        raise ValueError(f"unknown flags {flags:#x}")
    rest = body[_UNSETTLED_HEAD.size :]
    if state_len > len(rest) or (state_len and not flags & _HAS_STATE):
        raise ValueError("bad state length")
    message = rest[state_len:]
    tag = None
    if flags & _HAS_TAG:
        if not message or message[0] + 1 > len(message) or message[0] > MAX_TAG_SIZE:
            raise ValueError("bad tag length")
        tag, message = message[1 : 1 + message[0]], message[1 + message[0] :]
    origin = None
    if flags & _HAS_ORIGIN:
        if not message or message[0] + 1 > len(message):
            raise ValueError("bad origin length")
        origin, message = message[1 : 1 + message[0]], message[1 + message[0] :]
    if message and not flags & _HAS_MESSAGE:
        raise ValueError("trailing bytes")
    return UnsettledRecord(
        state=rest[:state_len] if flags & _HAS_STATE else None,
        message=message if flags & _HAS_MESSAGE else None,
        settled=bool(flags & _SETTLED),
        origin=origin,
        tag=tag,
    )


def _check_header(data: bytes, kind: bytes) -> bytes:
    if len(data) < 2 or data[:1] != kind:
        raise ValueError(f"not a {kind.decode()} record")
    if data[1] > RECORD_VERSION:
        raise ValueError(f"record version {data[1]} is newer than this qrouter reads")
    if data[1] < 1:
        raise ValueError("bad record version")
    return data[2:]


def termini_summary(records: Iterable[TerminusRecord]) -> list[dict[str, Value]]:
    """One row per terminus for listings (qrouter-tool links): simple values only."""
    return [
        {
            "local_container": r.key.local_container,
            "remote_container": r.key.remote_container,
            "link_name": r.key.link_name,
            "role": r.key.role,
            "address": r.address,
            "durability": r.durability,
            "expiry_policy": r.expiry_policy,
            "timeout": r.timeout,
            "suspended_at": r.suspended_at,
            "unsettled": len(r.unsettled),
        }
        for r in records
    ]
