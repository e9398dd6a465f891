"""The staged outputs of guaranteed topics (qrouter/_fast/eo_core.pxd's `OutQueue`, applied by
`EoLinks.apply_outputs`) and the router outbox's open envelopes, driven without sockets."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from qrouter._fast.engine import EoLinks, EoPub

from qrouter._fast.eo_core import OutQueue, scan_memory
from qrouter.guarantee import Guarantees


class _Mesh:
    def __init__(self, peer: str) -> None:
        self.next_hop = {peer: 1}
        self.peers = {1: SimpleNamespace(router_id=peer)}  # link id -> the neighbour
        self.sent: list[tuple[int, dict[str, Any]]] = []

    def send_eo(self, link_id: int, envelopes: list[dict[str, Any]]) -> None:
        self.sent.extend((link_id, e) for e in envelopes)


def _router(name: str, peer: str) -> Guarantees:
    core = SimpleNamespace(
        config=SimpleNamespace(id=name, guarantee_timeout=30.0),
        persistence=None,
        mesh=_Mesh(peer),
        table=SimpleNamespace(guarantee=lambda topic: None),
    )
    return Guarantees(core)  # type: ignore[arg-type]


def test_outputs_keep_their_order_and_arguments() -> None:
    q = OutQueue()
    q.add("deliver", None, (("A", 1, 0), b"t1", b"body", True))
    q.add("accept_publisher", "events", (("c", "l"), b"tag"))
    q.add("to_router", None, ("B", ("FWD",)))
    q.add("settle_subscriber", None, (("A", 1, 0), b"t1"))
    q.add("accept_publisher", "events", (("c", "other"), b"tag2"))
    assert len(q) == 5
    assert q.entries() == [
        ("deliver", None, (("A", 1, 0), b"t1", b"body", True)),
        ("accept_publisher", "events", (("c", "l"), b"tag")),
        ("to_router", None, ("B", ("FWD",))),
        ("settle_subscriber", None, (("A", 1, 0), b"t1")),
        ("accept_publisher", "events", (("c", "other"), b"tag2")),
    ]
    assert q.accepting(("c", "l")) == {b"tag"}


def test_applied_in_order_after_the_commit_and_emptied() -> None:
    g = _router("A", "B")
    seen: list[Any] = []
    for i in range(40):  # more than the queue's first allocation
        g.stage(seen.append, (i,))
    assert len(g.outputs) == 40 and not seen
    g.flush()
    assert seen == list(range(40))
    assert len(g.outputs) == 0


def test_a_new_route_opens_a_new_envelope_in_the_same_iteration() -> None:
    """The outbox remembers the envelope open for a router; a channel that changes (a new
    next hop, so a new epoch) must not get messages into the envelope of the old one."""
    g = _router("A", "B")
    g.route("B", 1)
    epoch = g.channels["B"].epoch
    g.outbox("B", "m1")
    g.outbox("B", "m2")
    g.route("B", 2)  # a new next hop before the iteration's envelopes are sent
    g.outbox("B", "m3")
    g.flush()
    sent = g.core.mesh.sent
    assert [(link, e["e"], e["n"], e["ms"]) for link, e in sent] == [
        (1, epoch, 0, ["m1", "m2"]),
        (2, epoch + 1, 0, ["m3"]),
    ]
    g.outbox("B", "m4")  # the next iteration: a new envelope, the next number
    g.flush()
    assert [(link, e["e"], e["n"], e["ms"]) for link, e in sent[2:]] == [(2, epoch + 1, 1, ["m4"])]


def test_a_router_down_drops_what_is_sent_to_it() -> None:
    g = _router("A", "B")
    g.route("B", 1)
    g.outbox("B", "m1")
    g.route("B", None)
    g.outbox("B", "lost")  # a broken channel loses what it carried
    g.flush()
    assert [e["ms"] for _, e in g.core.mesh.sent] == [["m1"]]


_T = b"\x01" * 32
_RECORDS = [
    ("FWD", "events", _T, ("pc", "pl"), b"t1", b"body", (("B", 1, 0), ("B", 2, 0))),
    ("SETTLE", "events", _T, (("B", 1, 0),)),
    ("ACCEPT", "events", _T, (("c", "l"),)),
    ("SEEN", "events", _T, (("c", "l"), ("c2", "l2"))),
    ("FWD", "other", _T, ("pc", "pl"), b"t2", b"", ()),
]


def _sent_with(stage: Any) -> tuple[list[tuple[int, Any]], bytes]:
    """What a router sends when `stage(g, router, record)` stages each of _RECORDS to B,
    a map from Python between the second and the third (and a second router's record
    in between, in its own envelope): the envelopes and their compact encoding."""
    from qrouter._fast.engine import eo_pack

    g = _router("A", "B")
    g.core.mesh.next_hop["C"] = 1
    g.route("B", 1)
    g.route("C", 1)
    for ch in g.channels.values():
        # a channel's first epoch is the wall clock's millisecond (Guarantees.route): the
        # two routers compared must not differ by when they were made
        ch.epoch = 1_000
    for i, record in enumerate(_RECORDS):
        if i == 2:
            g.stage(g._out_to_router, ("B", {"op": "PING", "topic": "events", "e": 1}))
            stage(g, "C", record)
        stage(g, "B", record)
    g.flush()
    sent = g.core.mesh.sent
    return sent, eo_pack([e for _, e in sent])


def test_records_staged_as_fields_go_out_as_their_tuples_would() -> None:
    """A record the core stages as its fields (OUT_RECORD) is written into the envelope
    where its tuple would have gone, in order among the router's other messages, octet for
    octet what the tuple encodes to; what is sent decodes to the tuples."""
    from qrouter._fast.engine import eo_unpack

    as_tuples, raw_tuples = _sent_with(lambda g, r, m: g.outputs.add("to_router", None, (r, m)))
    as_fields, raw_fields = _sent_with(lambda g, r, m: g.outputs.record(r, m))
    assert raw_fields == raw_tuples
    ping = {"op": "PING", "topic": "events", "e": 1}
    assert [e["ms"] for _, e in as_tuples] == [[*_RECORDS[:2], ping, *_RECORDS[2:]], [_RECORDS[2]]]
    # the records as runs: the two before the map, the three after it, the one to C
    assert [[m if isinstance(m, dict) else len(m) for m in e["ms"]] for _, e in as_fields] == [
        [2, ping, 3],
        [1],
    ]
    envelopes = eo_unpack(raw_fields)
    assert [e["ms"] for e in envelopes] == [e["ms"] for _, e in as_tuples]


def test_memory_scan_joins_the_topics_records_under_their_prefixes() -> None:
    """No store: each topic's records are kept by key under its prefix (`commit_memory`);
    a scan sees them as full keys, in key order, whatever prefix it asks for."""
    memory = {b"eot/a": b"", b"eot/a/b": b""}
    topics = {
        b"eo/a/": {b"o/2": b"r2", b"m/2": b"b2", b"c/x": b""},
        b"eo/a/b/": {b"o/1": b"r1"},
    }
    assert scan_memory(b"eot/", memory, topics) == [(b"eot/a", b""), (b"eot/a/b", b"")]
    assert scan_memory(b"eo/a/o/", memory, topics) == [(b"eo/a/o/2", b"r2")]
    assert scan_memory(b"eo/a/b/", memory, topics) == [(b"eo/a/b/o/1", b"r1")]
    assert scan_memory(b"eo/a/", memory, topics) == [
        (b"eo/a/b/o/1", b"r1"),
        (b"eo/a/c/x", b""),
        (b"eo/a/m/2", b"b2"),
        (b"eo/a/o/2", b"r2"),
    ]


def test_compact_records_decode_to_their_tuples_and_are_written_as_documented() -> None:
    """Records staged for a router that reads compact records (OUT_RECORD with its flag) go
    out as compact records in the same places, octet for octet the format at the top of
    eo_wire.pxi (tests/eo/compact_records.py: fields shared with the run's previous record
    left out), decode to the same tuples, and take fewer octets."""
    from qrouter._fast.engine import eo_pack, eo_unpack

    from tests.eo.compact_records import run_octets

    as_tuples, raw_tuples = _sent_with(lambda g, r, m: g.outputs.add("to_router", None, (r, m)))
    compact, raw_compact = _sent_with(lambda g, r, m: g.outputs.record(r, m, compact=True))
    envelopes = eo_unpack(raw_compact)
    assert [e["ms"] for e in envelopes] == [e["ms"] for _, e in as_tuples]
    # the runs to B: _RECORDS[:2] and [2:] (a map between them)
    for run in (_RECORDS[:2], _RECORDS[2:]):
        assert run_octets(run) in raw_compact
    assert len(raw_compact) < len(raw_tuples) - 150
    # C is reached through B (a router on the way decodes what it passes on, and one before
    # the compact records cannot): its record goes as before
    assert eo_pack([compact[1][1]]) == eo_pack([as_tuples[1][1]])
    # the two encodings mixed in one run (topics whose cores know the peer apart)
    mixed, raw_mixed = _sent_with(
        lambda g, r, m: g.outputs.record(r, m, compact=m[0] in ("ACCEPT", "FWD"))
    )
    assert [e["ms"] for e in eo_unpack(raw_mixed)] == [e["ms"] for _, e in as_tuples]


def test_an_accept_output_reaches_the_publisher_link_held_now() -> None:
    """The accept output names the publisher's link by the topic and id objects, the same
    ones output after output (EoLinks.c_pub keeps its last answer for them): a link attached
    again under the same key, or detached, is the one the next output reaches, or none."""
    g = _router("A", "B")
    topic, pub = "events", ("c", "l")
    first = EoPub(g, pub, topic, None, False)
    g.pubs[(topic, pub)] = first
    g._out_accept_publisher(topic, pub, b"t1")  # no delivery: accepted once it is resent
    assert first.accepted == {b"t1"}
    again = EoPub(g, pub, topic, None, False)
    g.pubs[(topic, pub)] = again
    g._out_accept_publisher(topic, pub, b"t2")
    assert first.accepted == {b"t1"} and again.accepted == {b"t2"}
    del g.pubs[(topic, pub)]
    g._out_accept_publisher(topic, pub, b"t3")
    assert first.accepted == {b"t1"} and again.accepted == {b"t2"}


def test_a_batch_of_outputs_reads_the_clock_once() -> None:
    """The outputs applied after one commit see one time (EoLinks.c_now reads the clock at
    the first that asks); outside a batch, each read is the loop's time then. An output that
    applies outputs itself (a batch in a batch) runs them in order, and the outer batch goes
    on with its own."""
    g = _router("A", "B")
    ticks = iter(range(100, 200))
    g.loop = SimpleNamespace(time=lambda: float(next(ticks)), call_soon=lambda *args: None)  # type: ignore[assignment]
    seen: list[Any] = []

    def nested() -> None:
        g.stage(seen.append, ("inner",))
        g.apply_outputs(g.outputs)

    g.stage(lambda: seen.append(EoLinks.now(g)), ())  # (c_now: Guarantees.now is Python's)
    g.stage(lambda: seen.append(EoLinks.now(g)), ())
    g.stage(nested, ())
    g.stage(seen.append, ("outer",))
    g.apply_outputs(g.outputs)
    assert seen == [100.0, 100.0, "inner", "outer"]
    assert EoLinks.now(g) == 101.0 and EoLinks.now(g) == 102.0
    for i in range(3000):  # a burst past the array kept for the next batch
        g.stage(seen.append, (i,))
    g.apply_outputs(g.outputs)
    assert seen[4:] == list(range(3000)) and len(g.outputs) == 0
    g.stage(seen.append, ("after",))
    g.apply_outputs(g.outputs)
    assert seen[-1] == "after"
