"""The group commit's staging of origin records (qrouter/_fast/eo_core.pyx: the core stages
them by out_tag and makes their store keys at the commit, `collect_writes` and
`commit_memory`): each commit puts and deletes what the last save or delete of each record
left, with the store and without one, driven without sockets."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from qrouter._fast.eo_core import OriginRecord, SubState, collect_writes, committed, scan_memory
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
