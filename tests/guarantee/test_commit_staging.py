"""The group commit's staging of origin records (qrouter/_fast/eo_core.pyx: the core stages
them by out_tag and makes their store keys at the commit, `collect_writes` and
`commit_memory`): each commit puts and deletes what the last save or delete of each record
left, with the store and without one, driven without sockets."""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from qrouter._fast.eo_core import (
    OriginRecord,
    SubState,
    TopicMemory,
    collect_writes,
    committed,
    scan_memory,
)
from qrouter.guarantee import Guarantees

PREFIX = b"eo/t/"
MARK = b"eot/t"


def _router(store: Any) -> Guarantees:
    core = SimpleNamespace(
        config=SimpleNamespace(id="A", guarantee_timeout=30.0),
        persistence=SimpleNamespace(store=store, health=None) if store is not None else None,
        mesh=None,
        table=SimpleNamespace(guarantee=lambda topic: None),
    )
    return Guarantees(core)  # type: ignore[arg-type]


def _rec(out_tag: bytes, body: bytes | None = b"body") -> OriginRecord:
    subs = {("s2", "l"): SubState.SEEN, ("s1", "l"): SubState.ACCEPTED, ("s3", "x"): 0}
    return OriginRecord(out_tag, ("pub", "p"), b"tag-" + out_tag, body, subs)


def _state(rec: OriginRecord, settled: bool = False) -> bytes:
    """STATE_V2 as qrouter/eo/records.py describes it, built here field by field."""

    def lp(raw: bytes) -> bytes:
        return len(raw).to_bytes(4, "big") + raw

    out = b"\x02" + (b"\x01" if settled else b"\x00") + lp(b"pub") + lp(b"p") + lp(rec.tag)
    out += (3).to_bytes(4, "big")
    for (c, link), st in sorted({("s1", "l"): 1, ("s2", "l"): 2, ("s3", "x"): 0}.items()):
        out += lp(c.encode()) + lp(link.encode()) + bytes([st])
    return out


def test_encode_state_is_state_v2() -> None:
    rec = _rec(b"T1")
    assert rec.encode_state() == _state(rec)
    assert OriginRecord.decode(b"T1", rec.encode_state(), None).subs == rec.subs
    rec.settled = True
    assert rec.encode_state() == _state(rec, settled=True)


def _commit_store(g: Guarantees) -> tuple[dict[bytes, bytes], set[bytes]]:
    puts, deletes = collect_writes(g.writes, g.loose)
    committed(g.writes)
    assert not set(puts) & set(deletes)
    return puts, deletes


def test_store_commit_puts_and_deletes_what_the_last_save_or_delete_left() -> None:
    g = _router(SimpleNamespace(scan=lambda prefix: iter(())))
    t = g.topic("t")
    assert t is not None
    r1 = _rec(b"T1")
    t._save_origin(r1, True)
    t._save_origin(r1, False)
    t._flush()
    assert _commit_store(g) == (
        {PREFIX + b"o/T1": _state(r1), PREFIX + b"m/T1": b"body", MARK: b""},
        set(),
    )
    # deleted: both keys
    t._delete_origin(r1)
    t._flush()
    assert _commit_store(g) == ({}, {PREFIX + b"o/T1", PREFIX + b"m/T1"})
    # saved with its body, then deleted, in one commit: only the deletes
    r2 = _rec(b"T2")
    t._save_origin(r2, True)
    t._delete_origin(r2)
    t._flush()
    assert _commit_store(g) == ({}, {PREFIX + b"o/T2", PREFIX + b"m/T2"})
    # deleted, then another record with its out_tag saved without a body: the body's key
    # stays deleted; then saved with one: both put
    r3 = _rec(b"T3")
    t._save_origin(r3, True)
    t._flush()
    _commit_store(g)
    t._delete_origin(r3)
    r3b = _rec(b"T3", body=None)
    t._save_origin(r3b, True)
    t._flush()
    assert _commit_store(g) == ({PREFIX + b"o/T3": _state(r3b), MARK: b""}, {PREFIX + b"m/T3"})
    t._delete_origin(r3b)
    r3c = _rec(b"T3", body=b"again")
    t._save_origin(r3c, False)
    t._save_origin(r3c, True)
    t._flush()
    assert _commit_store(g) == (
        {PREFIX + b"o/T3": _state(r3c), PREFIX + b"m/T3": b"again", MARK: b""},
        set(),
    )
    assert not g.writes


def test_memory_commit_keeps_what_the_store_would() -> None:
    g = _router(None)
    t = g.topic("t")
    assert t is not None
    r1, r2 = _rec(b"T1"), _rec(b"T2")
    t._save_origin(r1, True)
    t._save_origin(r2, True)
    t._flush()
    g.flush()
    assert scan_memory(PREFIX, g.memory, g.topic_memory) == [
        (PREFIX + b"m/T1", b"body"),
        (PREFIX + b"m/T2", b"body"),
        (PREFIX + b"o/T1", _state(r1)),
        (PREFIX + b"o/T2", _state(r2)),
    ]
    t._delete_origin(r1)
    r2b = _rec(b"T2", body=None)
    t._delete_origin(r2)
    t._save_origin(r2b, True)
    t._flush()
    g.flush()
    assert scan_memory(PREFIX, g.memory, g.topic_memory) == [(PREFIX + b"o/T2", _state(r2b))]
    assert scan_memory(MARK, g.memory, g.topic_memory) == [(MARK, b"")]


class _DictStore:
    """A store that keeps what its commits wrote (the store branch of Guarantees.flush)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def commit_writes(self, puts: dict[bytes, bytes], deletes: set[bytes]) -> None:
        assert not set(puts) & deletes
        for key in deletes:
            self.data.pop(key, None)
        self.data.update(puts)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return iter(sorted((k, v) for k, v in self.data.items() if k.startswith(prefix)))


@pytest.mark.parametrize("seed", range(20))
def test_memory_scan_reads_what_the_store_holds_after_random_commits(seed: int) -> None:
    """No store, the origin records are kept as they are and encoded by the scan that reads
    them (TopicMemory): after every commit of a random run of saves, deletes, re-saves with
    and without bodies, state changes and Python-staged writes, every scan a recovery makes
    (o/, m/, k/, the marks) reads the same keys and bytes as the store's."""
    rng = random.Random(seed)
    store = _DictStore()
    routers = [_router(store), _router(None)]
    topics = [g.topic("t") for g in routers]
    live: dict[bytes, OriginRecord] = {}
    read: set[bytes] = set()
    for _ in range(40):
        for _ in range(rng.randint(1, 8)):
            tag = b"T%d" % rng.randrange(12)
            op = rng.random()
            rec = live.get(tag)
            if rec is None or op < 0.2:
                if rec is not None and rng.random() < 0.5:
                    for t in topics:
                        t._delete_origin(rec)
                body = None if rng.random() < 0.3 else b"body-%d" % rng.randrange(100)
                rec = live[tag] = _rec(tag, body=body)
                with_body = rng.random() < 0.8
                for t in topics:
                    t._save_origin(rec, with_body)
            elif op < 0.45:
                for t in topics:
                    t._delete_origin(rec)
                del live[tag]
            elif op < 0.7:
                rec.add_sub((f"s{rng.randrange(9)}", "l"), rng.randrange(3))
                with_body = rng.random() < 0.2
                for t in topics:
                    t._save_origin(rec, with_body)
            elif op < 0.8:
                rec.settled = not rec.settled
                for t in topics:
                    t._save_origin(rec, False)
            elif op < 0.9:
                key = b"k/%d" % rng.randrange(5)
                value = None if rng.random() < 0.3 else b"v%d" % rng.randrange(5)
                for t in topics:
                    t._put(key, value) if value is not None else t._del(key)
            else:  # a write staged from Python (the topic's _TopicStore), by full key
                sub = rng.choice([b"o/", b"m/", b"k/"]) + b"P%d" % rng.randrange(3)
                value = None if rng.random() < 0.4 else b"py-%d" % rng.randrange(100)
                for g in routers:
                    g.loose[PREFIX + sub] = value
        for t in topics:
            t._flush()
        for g in routers:
            g.flush()
        for prefix in (PREFIX + b"o/", PREFIX + b"m/", PREFIX + b"k/", PREFIX, b"eot/"):
            got = list(routers[1].backend_scan(prefix))
            assert got == list(store.scan(prefix)), prefix
            read.update(prefix for _ in got[:1])
    assert len(read) == 5  # every prefix read something
    mem = routers[1].topic_memory[PREFIX]
    assert isinstance(mem, TopicMemory)
    # the records are kept, not their bytes (each encoded when a scan reads it)
    kept = [v for k, v in mem.origins.items() if k.startswith(b"T")]
    assert kept and all(isinstance(v, OriginRecord) for v in kept)
