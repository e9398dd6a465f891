"""Types of qrouter/_fast/eo_core.pyx (the per-message half of the exactly-once protocol)."""

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from enum import IntEnum
from typing import Any

Sub = tuple[str, str]
AttId = tuple[str, int, int]

STATE_V2: bytes
PROTOCOL_VERSION: int
FIELDS: dict[str, dict[str, type]]
TAG_KEY: bytes
TAG_SIZE: int
TAG_PERSON: bytes

RECORD_OPS: tuple[str, ...]

class ProtocolError(ValueError): ...

def record_map(record: tuple[Any, ...]) -> dict[str, Any]: ...
def att_of(value: Any) -> AttId: ...
def sub_of(value: Any) -> Sub: ...
def blake2b_digest(
    data: bytes, digest_size: int = 64, key: bytes = b"", person: bytes = b""
) -> bytes: ...
def compiled_outgoing_tag(container: str, link: str, tag: bytes | bytearray) -> bytes: ...

class SubState(IntEnum):
    PENDING = 0
    ACCEPTED = 1
    SEEN = 2

class OriginRecord:
    @property
    def out_tag(self) -> bytes: ...  # read-only (its store key is made of it)
    publisher: tuple[str, str]
    tag: bytes
    body: bytes | None
    # a new dict on every read: change the subscribers with add_sub / pop_sub (or assign)
    subs: dict[Sub, int]
    settled: bool
    accepted_sent: bool
    forwarded: set[AttId]
    filled: set[AttId]
    settle_sent: set[AttId]
    def __init__(
        self,
        out_tag: bytes,
        publisher: tuple[str, str],
        tag: bytes,
        body: bytes | None,
        subs: dict[Sub, Any],
        settled: bool = False,
        accepted_sent: bool = False,
        forwarded: set[AttId] | None = None,
        filled: set[AttId] | None = None,
        settle_sent: set[AttId] | None = None,
    ) -> None: ...
    def has_sub(self, sub: Sub) -> bool: ...
    def add_sub(self, sub: Sub, state: int) -> bool: ...
    def pop_sub(self, sub: Sub) -> SubState | None: ...
    def pending(self) -> bool: ...
    def done(self) -> bool: ...
    def interested_routers(self, where: dict[Sub, set[str]]) -> dict[str, int]: ...
    def encode_state(self) -> bytes: ...
    @classmethod
    def decode(cls, out_tag: bytes, state: bytes, body: bytes | None) -> OriginRecord: ...

class LocalRecord:
    out_tag: bytes
    body: bytes | None
    publisher: tuple[str, str] | None
    tag: bytes | None
    drivers: set[str]
    # a new dict on every read: change it with set_sub / pop_sub (or assign)
    subs: dict[AttId, int]
    settled: bool
    settled_epoch: int
    settled_by: set[str]
    def __init__(
        self,
        out_tag: bytes,
        body: bytes | None = None,
        publisher: tuple[str, str] | None = None,
        tag: bytes | None = None,
        drivers: set[str] | None = None,
        subs: dict[AttId, Any] | None = None,
        settled: bool = False,
        settled_epoch: int = 0,
        settled_by: set[str] | None = None,
    ) -> None: ...
    @property
    def placeholder(self) -> bool: ...
    def has_sub(self, att: AttId) -> bool: ...
    def set_sub(self, att: AttId, state: int) -> None: ...
    def pop_sub(self, att: AttId) -> int | None: ...
    def all_accepted(self) -> bool: ...
    def all_seen(self) -> bool: ...

class PubLink:
    attach_map: dict[bytes, bool]
    awaiting: set[bytes]
    owed: dict[bytes, dict[Sub, Any]]
    def __init__(
        self,
        attach_map: dict[bytes, bool],
        awaiting: set[bytes],
        owed: dict[bytes, dict[Sub, Any]] | None = None,
    ) -> None: ...

class LocalSub:
    att: AttId
    sub: Sub
    attach_map: dict[bytes, bool]
    queue: deque[bytes]
    resumable: bool
    stamp: int
    def __init__(
        self,
        att: AttId,
        sub: Sub,
        attach_map: dict[bytes, bool],
        queue: deque[bytes],
        resumable: bool = True,
        stamp: int = 0,
    ) -> None: ...

class EoCore:
    router_id: str
    topic: str
    eo: bool
    terminus_timeout: float
    unsafe: frozenset[str]
    _port: Any
    _store: Any
    _now: float
    _view: Any
    _origins: dict[bytes, OriginRecord]
    _locals: dict[bytes, LocalRecord]
    _pubs: dict[tuple[str, str], PubLink]
    _subs: dict[AttId, LocalSub]
    _pub_resend: dict[tuple[str, str], float]
    _resent: dict[tuple[str, str], set[bytes]]
    _closed_since: dict[Sub, float]
    _up: set[str]
    _lacking: set[str]
    _records_ok: set[str]
    _compact_ok: set[str]
    _barrier: dict[str, int]
    _epoch: int
    _puts: dict[bytes, bytes]
    _dels: set[bytes]
    _dirty: dict[bytes, OriginRecord]  # by out_tag: the keys are made at the commit
    _out: OutQueue
    _stage: Any | None
    _commit_to: Any | None
    _prefix: bytes
    _mark: bytes
    _marked: bool
    _committing: bool
    _mem: dict[bytes, bytes] | None
    def bind_router(self, g: Any, prefix: bytes, mark: bytes) -> None: ...
    def publisher_transfer(
        self, pub: tuple[str, str], tag: bytes, body: bytes, now: float
    ) -> None: ...
    def publisher_settled(self, pub: tuple[str, str], tag: bytes, now: float) -> None: ...
    def subscriber_accepted(self, att: AttId, out_tag: bytes, now: float) -> None: ...
    def subscriber_settled(self, att: AttId, out_tag: bytes, now: float) -> None: ...
    def receive(self, peer: str, message: Any, now: float) -> None: ...
    def _handle(self, sender: str, msg: Any) -> None: ...
    def _forget_sent_to(self, peer: str) -> None: ...
    def _drive(self, rec: OriginRecord) -> None: ...
    def _check_accept(self, rec: OriginRecord) -> None: ...
    def _settle_origin(self, rec: OriginRecord) -> None: ...
    def _maybe_drop_origin(self, rec: OriginRecord) -> None: ...
    def _long_closed(self, sub: Sub) -> bool: ...
    def _delete_origin(self, rec: OriginRecord) -> None: ...
    def _save_origin(self, rec: OriginRecord, body: bool = False) -> None: ...
    def _pump(self, ls: LocalSub) -> None: ...
    def _check_local_accept(self, rec: LocalRecord) -> None: ...
    def _maybe_drop_local(self, rec: LocalRecord) -> None: ...
    def _detach_locals(self, att: AttId) -> None: ...
    def _settled_index(self) -> list[LocalRecord]: ...
    def _any_settled_local(self) -> bool: ...
    def _drop_settled_locals(self) -> None: ...
    def _barrier_passed(self, epoch: int) -> bool: ...
    def _put(self, key: bytes, value: bytes) -> None: ...
    def _del(self, key: bytes) -> None: ...
    def _to_router(self, router: str, msg: Any) -> None: ...
    def _emit(self, method: str, *args: Any) -> None: ...
    def _log(self, level: str, text: str) -> None: ...
    def _tag(self, pub: tuple[str, str], tag: bytes) -> bytes: ...
    def _flush(self) -> None: ...

def stage_writes(
    writes: dict[bytes, Any],
    prefix: bytes,
    puts: Mapping[bytes, bytes],
    records: Mapping[bytes, OriginRecord] | None,
    deletes: Iterable[bytes],
) -> bool: ...
def split_writes(writes: dict[bytes, Any]) -> tuple[dict[bytes, bytes], set[bytes]]: ...
def collect_writes(
    cores: list[Any], loose: dict[bytes, Any]
) -> tuple[dict[bytes, bytes], set[bytes]]: ...

class TopicMemory(dict[bytes, bytes]):
    @property
    def origins(self) -> dict[bytes, OriginRecord | bytes]: ...
    bodies: dict[bytes, bytes]

def log_records(
    cores: list[Any],
    loose: dict[bytes, Any],
    journal: dict[bytes, bytes],
    gone: set[bytes],
    born: set[bytes],
    refs: LogRefs | None = None,
) -> bytes | None: ...

class LogRefs:
    def __init__(self) -> None: ...
    def begin(self) -> None: ...
    def suspend(self) -> None: ...

def commit_memory(
    cores: list[Any],
    loose: dict[bytes, Any],
    memory: dict[bytes, bytes],
    topic_memory: dict[bytes, dict[bytes, bytes]],
) -> None: ...
def scan_memory(
    prefix: bytes, memory: dict[bytes, bytes], topic_memory: dict[bytes, dict[bytes, bytes]]
) -> list[tuple[bytes, bytes]]: ...
def committed(cores: list[Any]) -> None: ...

class OutQueue:
    def __len__(self) -> int: ...
    def add(self, name: str, topic: str | None, args: tuple[Any, ...]) -> None: ...
    def call(self, apply: Callable[..., None], args: tuple[Any, ...]) -> None: ...
    def record(self, router: str, message: tuple[Any, ...], compact: bool = False) -> None: ...
    def entries(self) -> list[tuple[str, str | None, tuple[Any, ...]]]: ...
    def accepting(self, pub: tuple[str, str]) -> set[bytes]: ...

def receive_envelopes(g: Any, envelopes: list[Any], now: float) -> None: ...
def receive_messages(g: Any, src: str, messages: list[Any], now: float) -> None: ...

class RouterOutbox:
    direct: set[str]
    def __init__(self, g: Any) -> None: ...
    def __call__(self, router_id: str, message: Any) -> None: ...
    def forget(self) -> None: ...
