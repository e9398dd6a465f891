"""The delivery journal as the engine writes it (qrouter/_fast/journal.pxi): one row per event
with its link's strings, tags and origin, in memory through a JournalWriter to Parquet
(docs/journal.md)."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery

from qrouter.journal import JournalWriter, origin_id, sampled
from tests.engine.pump import Peer, make_core, pump, receive, send

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def journalled(tmp_path: Path, **writer: Any) -> tuple[Any, JournalWriter]:
    core = make_core()
    w = JournalWriter(tmp_path, "r1", threaded=False, **writer)
    core.engine.journal_start(w.append_buffers, w.threshold, w.spare)
    return core, w


def rows(core: Any, w: JournalWriter) -> list[dict[str, Any]]:
    core.engine.journal_flush()
    w.close()
    return pq.ParquetDataset(w.segments).read().to_pylist()  # type: ignore[no-any-return]


def orders_pair(tmp_path: Path) -> tuple[Any, JournalWriter, Peer, Any, Peer, Any]:
    """A journalled router with a consumer ("sub"/"sub-link", credit 10) and a producer
    ("pub"/"pub-link") of `orders`, attached."""
    core, w = journalled(tmp_path)
    consumer = Peer(core, container="sub")
    rcv = consumer.receiver("orders", name="sub-link", credit=10)
    producer = Peer(core, container="pub")
    snd = producer.sender("orders", name="pub-link")
    pump(consumer, producer)
    return core, w, consumer, rcv, producer, snd


def test_rows_of_deliveries_with_each_outcome(tmp_path: Path) -> None:
    """Unsettled, rcv-settle-mode first: received, forwarded, then one row each where a
    disposition settles with its outcome (the consumer's, the producer's); released adds
    released-back (3.4)."""
    core, w, consumer, rcv, producer, snd = orders_pair(tmp_path)
    tags = [bytes([i]) * 8 for i in range(3)]
    for i, tag in enumerate(tags):
        send(snd, f"m{i}", tag=tag)
    pump(consumer, producer)
    for (d, _), state in zip(
        receive(rcv), (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.RELEASED), strict=True
    ):
        d.update(state)
        d.settle()
    pump(consumer, producer)

    table = rows(core, w)
    assert {r["router"] for r in table} == {"r1"}
    assert {r["address"] for r in table} == {"orders"}
    by_origin: dict[str, list[dict[str, Any]]] = {}
    for r in table:
        assert r["origin_prefix"] == origin_id("pub", "pub-link", b"")
        by_origin.setdefault(r["origin_prefix"] + r["origin_tag"].hex(), []).append(r)
    assert sorted(by_origin) == [origin_id("pub", "pub-link", t) for t in tags]
    for tag, outcome in zip(tags, ("accepted", "rejected", "released"), strict=True):
        events = by_origin[origin_id("pub", "pub-link", tag)]
        seen = [(r["link"], r["event"], r["outcome"]) for r in events]
        want = [
            ("pub-link", "received", None),
            ("sub-link", "forwarded", None),
            ("sub-link", "settled", outcome),
        ]
        if outcome == "released":
            want.append(("sub-link", "released-back", None))
        want.append(("pub-link", "settled", outcome))
        assert sorted(seen, key=str) == sorted(want, key=str)
        for r in events:
            # the tag on the producer's link is its own; on the consumer's the router's
            assert (r["tag"] == tag) == (r["link"] == "pub-link")
            assert len(r["tag"]) in (4, 8)
            assert r["size"] > 0 if r["event"] in ("received", "forwarded") else r["size"] == 0
        times = {r["event"]: r["time_ns"] for r in events if r["link"] == "pub-link"}
        assert times["received"] <= times["settled"]
    connections = {r["link"]: r["connection"] for r in table}
    assert connections["pub-link"] != connections["sub-link"]
    assert all(r["credit_stall_ns"] is None for r in table)


def test_outcome_before_settlement_is_two_rows(tmp_path: Path) -> None:
    """A consumer that tells its outcome before it settles (two dispositions) gets an
    `outcome` row and later a `settled` row without one; the producer (rcv-settle-mode
    first) is settled with the outcome in one row."""
    core, w, consumer, rcv, producer, snd = orders_pair(tmp_path)
    send(snd, "m", tag=b"t1")
    pump(consumer, producer)
    ((d, _),) = receive(rcv)
    d.update(Delivery.ACCEPTED)
    pump(consumer, producer)
    d.settle()
    pump(consumer, producer)

    seen = [(r["link"], r["event"], r["outcome"]) for r in rows(core, w)]
    assert seen == [
        ("pub-link", "received", None),
        ("sub-link", "forwarded", None),
        ("sub-link", "outcome", "accepted"),
        ("pub-link", "settled", "accepted"),
        ("sub-link", "settled", None),
    ]


def test_presettled_is_received_and_settled(tmp_path: Path) -> None:
    core, w = journalled(tmp_path)
    consumer = Peer(core)
    rcv = consumer.receiver("fire", credit=5)
    producer = Peer(core)
    snd = producer.sender("fire", snd_settle_mode=1)  # settled
    pump(consumer, producer)
    send(snd, "x", tag=b"t1", settled=True)
    pump(consumer, producer)
    assert len(receive(rcv)) == 1
    events = sorted((r["link"], r["event"]) for r in rows(core, w))
    assert ("sender", "received") in events and ("sender", "settled") in events
    assert ("receiver", "forwarded") in events


def test_sampling_keeps_every_row_of_a_kept_delivery(tmp_path: Path) -> None:
    """The engine samples by the crc32 of the origin, as router.journal.sampled does, so
    every router with the same rate keeps the same deliveries."""
    core, w = journalled(tmp_path, sample=0.3)
    consumer = Peer(core)
    rcv = consumer.receiver("s", credit=200)
    producer = Peer(core, container="pub")
    snd = producer.sender("s", name="out")
    pump(consumer, producer)
    tags = [i.to_bytes(8, "big") for i in range(200)]
    for tag in tags:
        send(snd, "x", tag=tag)
        pump(consumer, producer)
    for d, _ in receive(rcv):
        d.update(Delivery.ACCEPTED)
        d.settle()
    pump(consumer, producer)
    table = rows(core, w)
    kept = {origin_id("pub", "out", t) for t in tags if sampled(origin_id("pub", "out", t), 0.3)}
    per_origin: dict[str, int] = {}
    for r in table:
        o = r["origin_prefix"] + r["origin_tag"].hex()
        per_origin[o] = per_origin.get(o, 0) + 1
    assert set(per_origin) == kept and 30 < len(kept) < 90
    assert set(per_origin.values()) == {4}
    assert w.rows_sampled_out == 4 * (len(tags) - len(kept))


def test_engine_crc32_is_zlibs() -> None:
    from qrouter._fast.engine import origin_crc32

    for prefix, tag in (("", b""), ("a%2Fb/c/", b"\x00\xff"), ("pub/out/", bytes(range(32)))):
        assert origin_crc32(prefix, tag) == zlib.crc32((prefix + tag.hex()).encode())


def test_batches_are_handed_over_and_their_buffers_reused(tmp_path: Path) -> None:
    """A batch goes to the writer on journal_flush (and by size or age from Router.flush);
    the buffers of a batch the writer has written are filled again, not allocated anew."""
    core = make_core()
    w = JournalWriter(tmp_path, "r1", threaded=False)
    handed: list[dict[str, Any]] = []

    def sink(batch: dict[str, Any]) -> None:
        handed.append(batch)
        w.append_buffers(batch)

    core.engine.journal_start(sink, w.threshold, w.spare)
    consumer = Peer(core)
    rcv = consumer.receiver("b", credit=100)
    producer = Peer(core)
    snd = producer.sender("b")
    pump(consumer, producer)
    for _ in range(3):
        for i in range(20):
            send(snd, i)
        pump(consumer, producer)
        for d, _ in receive(rcv):
            d.update(Delivery.ACCEPTED)
            d.settle()
        pump(consumer, producer)
        assert core.engine.journal_rows == 20 * 4
        core.engine.journal_flush()
        assert core.engine.journal_rows == 0
        w.flush()  # written: its buffers are spare now
        assert len(w.spare) == 1
    # the first batch's buffers came back for the third
    assert handed[2]["time_ns"] is handed[0]["time_ns"]
    assert handed[1]["time_ns"] is not handed[0]["time_ns"]
    table = rows(core, w)
    assert len(table) == 3 * 20 * 4
    assert [r["event"] for r in table].count("received") == 60
