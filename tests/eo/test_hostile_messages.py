"""Guaranteed-topic control messages from a broken or hostile router (issue 13, point 1):
whatever a map from the wire holds (any AMQP value the codec decodes, in any field), the
topic's state machine drops the message with a log line; no exception leaves `receive`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qrouter._fast.codec import DecodeError

from qrouter.eo import EXACTLY_ONCE
from qrouter.eo.messages import EO_VERSION, FIELDS, make
from tests.engine.test_codec import values
from tests.eo.test_protocol import Net
from tests.eo.wire_values import wire_values as _wire_values

# what a field may hold: any decoded value, or the right container of arbitrary values
field_values = st.one_of(
    values,
    st.lists(values, max_size=4),
    st.lists(st.lists(values, max_size=4), max_size=4),
    st.binary(max_size=8),
    st.integers(-(2**70), 2**70),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(FIELDS)), st.data())
def test_any_field_values_are_dropped_not_raised(op: str, data: st.DataObject) -> None:
    net = Net("AB", mode=EXACTLY_ONCE)
    message: dict[str, Any] = {"op": op, "v": EO_VERSION, "topic": net.r["A"].topic}
    for name in FIELDS[op]:
        message[name] = data.draw(field_values, label=name)
    net.r["A"].receive("B", message, 1.0)  # must not raise
    net.pump(1.0)


# the compact encoding of envelopes between routers (qrouter/_fast/eo_wire.pxi)
wire_values = _wire_values(8)


@settings(max_examples=300, deadline=None)
@given(wire_values)
def test_compact_envelope_encoding_round_trips(value: Any) -> None:
    from qrouter._fast.engine import eo_pack, eo_unpack

    raw = eo_pack(value)
    assert eo_unpack(raw) == value
    for cut in range(len(raw)):
        with pytest.raises(DecodeError):
            eo_unpack(raw[:cut])


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_compact_envelope_decoding_of_any_bytes_raises_decode_error_or_returns(raw: bytes) -> None:
    from qrouter._fast.engine import eo_unpack

    try:
        eo_unpack(raw)
    except DecodeError:
        pass


def test_compact_envelope_decoding_is_bounded() -> None:
    from qrouter._fast.engine import eo_pack, eo_unpack

    with pytest.raises(DecodeError):
        eo_unpack(b"\x06\xff\xff\xff\xff")  # a list of 2^32-1 values in 4 bytes: refused
    with pytest.raises(DecodeError):
        eo_unpack(b"\x06\x00\x00\x00\x01" * 40 + b"\x00")  # nested too deep
    for bad in (2**63, 1.5, {1: 2}, object()):
        with pytest.raises(ValueError):
            eo_pack(bad)


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 300])
def test_compact_lists_short_and_long_decode_alike_and_a_short_count_is_refused(n: int) -> None:
    """A list of up to 64 items is made at its size before they are read (eo_wire.pxi,
    EO_LIST_PREALLOC), a longer one item by item: both give the list, and a count larger
    than the items that follow (the peer's, hostile) is refused by either, part way."""
    from qrouter._fast.engine import eo_pack, eo_unpack

    value = [{"n": i, "ms": [None, b"x"]} for i in range(n)]
    raw = eo_pack(value)
    assert eo_unpack(raw) == value
    claims_more = b"\x06" + (n + 1).to_bytes(4, "big") + raw[5:]
    with pytest.raises(DecodeError):
        eo_unpack(claims_more)
    # the count says one more item than follow, and the octets are there for one: a truncated
    # value where the last item should be
    with pytest.raises(DecodeError):
        eo_unpack(claims_more + b"\x06\x00\x00\x00\x05\x00")


def test_compact_envelope_words() -> None:
    from qrouter._fast.engine import EO_WORDS, eo_pack, eo_unpack

    value = {w: [w, w + "x", {w: w}] for w in EO_WORDS}
    assert eo_unpack(eo_pack(value)) == value
    assert eo_pack("FWD") == b"\x08" + bytes([EO_WORDS.index("FWD")])
    with pytest.raises(DecodeError):
        eo_unpack(b"\x08" + bytes([len(EO_WORDS)]))  # no such word
    with pytest.raises(DecodeError):
        eo_unpack(b"\x08")


def test_eo_control_messages_in_both_encodings() -> None:
    from qrouter._fast.engine import eo_pack

    from qrouter.inter_router import eo_envelopes

    envs = [{"to": "B", "from": "A", "e": 1, "n": 0, "m": {"op": "PING", "e": 3}}]
    assert eo_envelopes({"op": "EO", "b": eo_pack(envs)}) == envs
    assert eo_envelopes({"op": "EO", "m": envs}) == envs  # a router before the compact form
    assert eo_envelopes({"op": "EO", "b": b"\x07"}) is None
    assert eo_envelopes({"op": "EO", "b": "text"}) is None


# -- the per-message records (FWD, ACCEPT, SETTLE, SEEN) in the compact encoding ---------------

names = st.text(max_size=6)
ints = st.integers(-(2**63), 2**63 - 1)
atts = st.lists(st.tuples(names, ints, ints), max_size=4).map(tuple)
subs = st.lists(st.tuples(names, names), max_size=4).map(tuple)
blobs = st.binary(max_size=40)
records = st.one_of(
    st.tuples(st.just("FWD"), names, blobs, st.tuples(names, names), blobs, blobs, atts),
    st.tuples(st.just("ACCEPT"), names, blobs, subs),
    st.tuples(st.just("SETTLE"), names, blobs, atts),
    st.tuples(st.just("SEEN"), names, blobs, subs),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(records, max_size=3), st.lists(records, max_size=3))
def test_records_round_trip_and_every_truncation_is_refused(
    before: list[Any], after: list[Any]
) -> None:
    from qrouter._fast.engine import eo_pack, eo_unpack

    value = [{"to": "B", "from": "A", "e": 1, "n": 0, "ms": [*before, make("PING", "x", e=1)]}]
    value[0]["ms"].extend(after)
    raw = eo_pack(value)
    decoded = eo_unpack(raw)
    assert decoded == value
    for got, sent in zip(decoded[0]["ms"], value[0]["ms"], strict=True):
        assert type(got) is type(sent)  # records come back as tuples, maps as maps
    for cut in range(len(raw)):
        with pytest.raises(DecodeError):
            eo_unpack(raw[:cut])


def _record_octets(rec: tuple[Any, ...]) -> bytes:
    """A record as the format at the top of qrouter/_fast/eo_wire.pxi writes it, built here
    independently of the engine (what routers of main read and write)."""
    import struct

    def s(v: str) -> bytes:
        raw = v.encode()
        return struct.pack(">I", len(raw)) + raw

    def b(v: bytes) -> bytes:
        return struct.pack(">I", len(v)) + v

    def att(a: tuple[str, int, int]) -> bytes:
        return s(a[0]) + struct.pack(">qq", a[1], a[2])

    def many(items: tuple[Any, ...], one: Any) -> bytes:
        return struct.pack(">I", len(items)) + b"".join(one(i) for i in items)

    op = rec[0]
    code = {"FWD": 1, "ACCEPT": 2, "SETTLE": 3, "SEEN": 4}[op]
    body = bytes([code]) + s(rec[1]) + b(rec[2])
    if op == "FWD":
        body += s(rec[3][0]) + s(rec[3][1]) + b(rec[4]) + b(rec[5]) + many(rec[6], att)
    elif op == "SETTLE":
        body += many(rec[3], att)
    else:
        body += many(rec[3], lambda sub: s(sub[0]) + s(sub[1]))
    return b"\x09" + struct.pack(">I", len(body)) + body


@settings(max_examples=300, deadline=None)
@given(st.lists(records, max_size=4))
def test_records_encode_octet_for_octet_as_documented(recs: list[Any]) -> None:
    """The wire format of the records is fixed (routers of other versions read it): the
    encoder writes exactly the documented octets, alone and inside a list."""
    import struct

    from qrouter._fast.engine import eo_pack

    for rec in recs:
        assert eo_pack(rec) == _record_octets(rec)
    listed = b"\x06" + struct.pack(">I", len(recs)) + b"".join(map(_record_octets, recs))
    assert eo_pack(recs) == listed


def test_repeated_record_tuples_encode_as_documented() -> None:
    """The encoder keeps the octets of the publisher pairs and targets it packed, by the
    tuple (eo_wire.pxi, _eor_held_pack): the same tuple packed again, after enough others to
    reuse every slot, still gives the documented octets; a tuple refused as targets or as a
    pair is refused again, also after the other kind of field took it."""
    from qrouter._fast.engine import eo_pack

    pub, targets = ("c", "l"), (("B", 1, 2), ("B", 3, -4))
    fwd = ("FWD", "t", b"o" * 16, pub, b"tag", b"body", targets)
    settle = ("SETTLE", "t", b"o" * 16, targets)
    for i in range(100):
        other = ("FWD", "t", b"o", (f"c{i}", "l"), b"", b"", ((f"R{i}", i, -i),))
        assert eo_pack(other) == _record_octets(other)
        assert eo_pack(fwd) == _record_octets(fwd)
        assert eo_pack(settle) == _record_octets(settle)
    # a pair given as targets, targets given as a pair: refused each time
    for _ in range(2):
        with pytest.raises(ValueError):
            eo_pack(("SETTLE", "t", b"o", pub))
        with pytest.raises(ValueError):
            eo_pack(("FWD", "t", b"o", targets, b"", b"", targets))
        assert eo_pack(("SETTLE", "t", b"o", ())) == _record_octets(("SETTLE", "t", b"o", ()))
        with pytest.raises(ValueError):
            eo_pack(("FWD", "t", b"o", (), b"", b"", ()))


def test_repeated_record_spans_decode_alike_and_kinds_stay_apart() -> None:
    """The decoder keeps the tuples of publisher pairs and targets it decoded, by their
    octets (eo_wire.pxi): the same octets give an equal (shared) tuple, different octets in
    the same slot are not confused, and the same octets as targets (SETTLE) and as
    subscribers (ACCEPT) decode as what each record says."""
    import struct

    from qrouter._fast.engine import eo_pack, eo_unpack

    fwd = ("FWD", "t", b"o" * 16, ("c", "l"), b"tag", b"body", (("B", 1, 2),))
    first, again = eo_unpack(eo_pack(fwd)), eo_unpack(eo_pack(fwd))
    assert first == again == fwd
    assert first[3] is again[3] and first[6] is again[6]
    for i in range(300):  # enough different spans to reuse every slot
        other = ("FWD", "t", b"o", (f"c{i}", "l"), b"", b"", ((f"R{i}", i, -i),))
        assert eo_unpack(eo_pack(other)) == other
        assert eo_unpack(eo_pack(fwd)) == fwd
    # after the count (1): str "" then str "abcdefghijkl" = str "" then two 8-octet ints
    rest = struct.pack(">III", 1, 0, 12) + b"abcdefghijkl"

    def record(code: int) -> bytes:
        body = bytes([code]) + struct.pack(">I", 1) + b"x" + struct.pack(">I", 1) + b"t" + rest
        return b"\x09" + struct.pack(">I", len(body)) + body

    as_subs = ("ACCEPT", "x", b"t", (("", "abcdefghijkl"),))
    as_atts = ("SETTLE", "x", b"t", (("",) + struct.unpack(">qq", b"\0\0\0\x0cabcdefghijkl"),))
    for _ in range(2):
        assert eo_unpack(record(2)) == as_subs
        assert eo_unpack(record(3)) == as_atts
    # a span that does not decode whole (an octet after the targets) is not kept
    bad = b"\x09" + struct.pack(">I", len(record(3)) - 5 + 1) + record(3)[5:] + b"z"
    assert eo_unpack(bad) is None
    assert eo_unpack(bad) is None


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_a_mangled_record_decodes_as_none_or_a_well_typed_record(
    record: Any, data: st.DataObject
) -> None:
    """A record's bytes changed anywhere after its length: the envelope still decodes, and the
    record is None (dropped and counted by the receiver) or a tuple of the right types; a
    router's core given it drops it or applies it, never raises."""
    from qrouter._fast.engine import eo_pack, eo_unpack

    raw = bytearray(eo_pack([record, 7]))
    assert raw[5] == 0x09  # after the list's tag and count; then its length, then the record
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        at = data.draw(st.integers(10, len(raw) - 10), label="at")  # (7: the last 9 octets)
        raw[at] = data.draw(st.integers(0, 255), label="octet")
    got = eo_unpack(bytes(raw))
    assert got[1] == 7  # the length frames the record: what follows it is intact
    rec = got[0]
    if rec is None:
        return
    assert type(rec) is tuple and rec[0] in ("FWD", "ACCEPT", "SETTLE", "SEEN")
    net = Net("AB", mode=EXACTLY_ONCE)
    net.r["A"].subscriber_attached(("c", "l"), [], 1.0)
    net.pump(1.0)
    net.r["B"].receive("A", rec, 1.0)  # must not raise
    net.r["B"].receive("A", (rec[0], net.r["B"].topic, *rec[2:]), 1.0)
    net.pump(1.0)


def test_record_decoding_is_bounded() -> None:
    from qrouter._fast.engine import eo_pack, eo_unpack

    with pytest.raises(DecodeError):
        eo_unpack(b"\x09\xff\xff\xff\xff\x01")  # a record longer than the data
    # an unknown op code (a newer router's record): None, and the rest is read
    assert eo_unpack(b"\x06\x00\x00\x00\x02" + b"\x09\x00\x00\x00\x02\x63\x00" + b"\x02") == [
        None,
        True,
    ]
    # a count of 2^32-1 targets in a few octets: refused without allocating
    settle = eo_pack(("SETTLE", "x", b"t", ()))
    assert eo_unpack(settle[:-4] + b"\xff\xff\xff\xff") is None
    assert eo_unpack(settle) == ("SETTLE", "x", b"t", ())
    for bad in (
        ("FWD", "x", b"t"),  # too short
        ("FWD", "x", b"t", ["c", "l"], b"", b"", ()),  # the publisher as a list
        ("SEEN", "x", "t", ()),  # the out tag as str
        ("SETTLE", "x", b"t", (("r", 1, 2**64),)),  # an integer out of range
        ("ACCEPT", "x", b"t", (("c", 1),)),  # a subscriber that is not two str
    ):
        with pytest.raises(ValueError):
            eo_pack(bad)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["FWD", "ACCEPT", "SETTLE", "SEEN", "PING", 3, None]), st.data())
def test_any_record_shaped_tuple_is_dropped_not_raised(op: Any, data: st.DataObject) -> None:
    net = Net("AB", mode=EXACTLY_ONCE)
    fields = data.draw(st.lists(field_values | atts | subs, max_size=7), label="fields")
    net.r["A"].receive("B", (op, net.r["A"].topic, *fields), 1.0)  # must not raise
    net.r["A"].receive("B", (op,), 1.0)
    net.r["A"].receive("B", (), 1.0)
    net.pump(1.0)


def test_the_protocol_over_the_compact_encoding() -> None:
    """The core's records, through eo_pack / eo_unpack and the compiled receive loop
    (`receive_messages`), carry a delivery from publisher to subscribers and back."""
    from qrouter._fast.engine import eo_pack, eo_unpack

    from qrouter._fast.eo_core import receive_messages
    from qrouter.eo.tags import outgoing_tag

    class Router:  # what receive_messages needs of qrouter.guarantee.Guarantees
        def __init__(self, t: Any) -> None:
            self.topics = {t.topic: t}
            self.others: list[Any] = []

        def receive_one(self, src: str, message: Any, now: float) -> None:
            self.others.append(message)
            self.topics[""].receive(src, message, now)

    net = Net("AB", mode=EXACTLY_ONCE)
    routers = {n: Router(net.r[n]) for n in "AB"}
    sent: list[Any] = []

    def pump() -> None:
        while net.wire:
            src, dst, msg = net.wire.popleft()
            sent.append(msg)
            [got] = eo_unpack(eo_pack([msg]))
            receive_messages(routers[dst], src, [got], 0.0)

    pub, sub = ("pc", "pl"), ("sc", "sl")
    att = net.r["B"].subscriber_attached(sub, [], 0.0)
    pump()
    net.r["A"].publisher_attached(pub, [], 0.0)
    net.r["A"].publisher_transfer(pub, b"t1", b"body", 0.0)
    pump()
    t = outgoing_tag(*pub, b"t1")
    assert [d[1:3] for d in net.take("deliver")] == [(att, t)]
    net.r["B"].subscriber_accepted(att, t, 0.0)
    pump()
    assert net.take("accept") == [("accept", pub, b"t1")]
    net.r["A"].publisher_settled(pub, b"t1", 0.0)
    pump()
    net.r["B"].subscriber_settled(att, t, 0.0)
    pump()
    assert net.r["A"].origin_records() == {}
    ops = [m[0] for m in sent if isinstance(m, tuple)]
    assert ops == ["FWD", "ACCEPT", "SETTLE", "SEEN"]
    # the records went straight to the cores: only the control maps came back
    assert all(isinstance(m, dict) for r in routers.values() for m in r.others)


def test_the_maps_of_a_router_before_the_records_are_still_understood() -> None:
    """FWD / ACCEPT as an older router sends them (maps): delivered, and accepted upstream."""
    from qrouter.eo.messages import att_wire
    from qrouter.eo.tags import outgoing_tag

    net = Net("AB", mode=EXACTLY_ONCE)
    sub, pub = ("sc", "sl"), ("pc", "pl")
    att = net.r["B"].subscriber_attached(sub, [], 0.0)
    net.pump()
    t = outgoing_tag(*pub, b"t1")
    fwd = make("FWD", "", t=t, pub=list(pub), tag=b"t1", body=b"m", targets=[att_wire(att)])
    net.r["B"].receive("A", fwd, 0.0)
    assert [d[1:4] for d in net.take("deliver")] == [(att, t, b"m")]
    net.r["B"].subscriber_accepted(att, t, 0.0)
    assert [m for _, dst, m in net.wire if dst == "A"] == [("ACCEPT", "", t, (sub,))]


def test_a_router_before_the_records_gets_maps() -> None:
    """A peer whose SUBS does not say `records` (a router before them) is sent FWD / ACCEPT /
    SETTLE / SEEN as the maps it reads (checked with the map schema); one that says it gets
    records. The delivery goes through either way."""
    from qrouter.eo.messages import check
    from qrouter.eo.tags import outgoing_tag

    net = Net("AB", mode=EXACTLY_ONCE)
    old = {"A"}  # A plays the older router: its SUBS lack "records"

    def pump() -> list[tuple[str, str, Any]]:
        seen = []
        while net.wire:
            src, dst, msg = net.wire.popleft()
            if src in old and isinstance(msg, dict) and msg["op"] == "SUBS":
                msg = {k: v for k, v in msg.items() if k != "records"}
            seen.append((src, dst, msg))
            net.r[dst].receive(src, msg, 0.0)
        return seen

    net.r["A"].router_down("B", 0.0)
    net.r["B"].router_down("A", 0.0)
    net.r["A"].router_up("B", 0.0)
    net.r["B"].router_up("A", 0.0)
    pub, sub = ("pc", "pl"), ("sc", "sl")
    att = net.r["A"].subscriber_attached(sub, [], 0.0)
    sent = pump()
    net.r["B"].publisher_attached(pub, [], 0.0)
    net.r["B"].publisher_transfer(pub, b"t1", b"body", 0.0)
    sent += pump()
    t = outgoing_tag(*pub, b"t1")
    assert [d[1:3] for d in net.take("deliver")] == [(att, t)]
    net.r["A"].subscriber_accepted(att, t, 0.0)
    sent += pump()
    assert net.take("accept") == [("accept", pub, b"t1")]
    net.r["B"].publisher_settled(pub, b"t1", 0.0)
    sent += pump()
    net.r["A"].subscriber_settled(att, t, 0.0)
    sent += pump()
    assert net.r["B"].origin_records() == {}
    to_old = [m for _, dst, m in sent if dst == "A"]
    assert all(isinstance(m, dict) for m in to_old)
    assert [m["op"] for m in to_old if m["op"] in ("FWD", "SETTLE")] == ["FWD", "SETTLE"]
    for m in to_old:
        check(m)  # what the older router's schema accepts
    from_old = [m for src, _, m in sent if src == "A" and not isinstance(m, dict)]
    assert [m[0] for m in from_old] == ["ACCEPT", "SEEN"]  # (A itself reads records)


def test_a_record_for_another_topic_is_dropped_also_after_one_for_this_topic() -> None:
    """The core compares a record's topic by identity once it found that str equal (the
    decoder hands the same str record after record): an equal str that is another object
    is this topic, and a record naming another topic is still dropped after it."""
    net = Net("AB", mode=EXACTLY_ONCE, topic="events.t")
    b = net.r["B"]
    same = "".join(list(b.topic))  # equal, another object (as the decoder's str)
    assert same == b.topic and same is not b.topic
    other = b.topic + ".x"

    def dropped() -> int:
        return sum("record for another topic dropped" in text for _, text in net.logs)

    for i, (topic, want) in enumerate([(same, 0), (same, 0), (other, 1), (same, 1), (other, 2)]):
        b.receive("A", ("SEEN", topic, bytes([i]) * 32, (("c", "l"),)), 1.0)
        net.pump(1.0)
        assert dropped() == want, (i, topic)


# -- the compact records (0x0A: sent to routers whose SUBS say `compact`) -----------------------


def _list_of(*items: bytes) -> bytes:
    import struct

    return b"\x06" + struct.pack(">I", len(items)) + b"".join(items)


@settings(max_examples=300, deadline=None)
@given(st.lists(records, max_size=5), st.lists(records, max_size=3))
def test_compact_records_round_trip_and_every_truncation_is_refused(
    first: list[Any], second: list[Any]
) -> None:
    """Compact records as documented (tests/eo/compact_records.py), two runs in one list
    with a map between them, decode to their tuples; a list of them cut anywhere raises."""
    from qrouter._fast.engine import eo_pack, eo_unpack

    from tests.eo.compact_records import run_octets

    ping = make("PING", "x", e=1)
    raw = (
        b"\x06"
        + len(first + second + [0]).to_bytes(4, "big")
        + run_octets(first)
        + eo_pack(ping)
        + run_octets(second)
    )
    assert eo_unpack(raw) == [*first, ping, *second]
    for cut in range(len(raw)):
        with pytest.raises(DecodeError):
            eo_unpack(raw[:cut])


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=4), st.data())
def test_a_mangled_compact_record_decodes_as_none_or_a_well_typed_record(
    recs: list[Any], data: st.DataObject
) -> None:
    """Compact records whose first one's octets changed anywhere after its length: the list
    still decodes (each record's length frames it), each record is None or a tuple of the
    right types (the later ones may refer to the changed one), and a router's core given
    them drops or applies them, never raises."""
    from qrouter._fast.engine import eo_unpack

    from tests.eo.compact_records import run_octets

    body = run_octets(recs)
    raw = bytearray(_list_of(body, b"\x02"))
    raw[1:5] = (len(recs) + 1).to_bytes(4, "big")
    at, shift, length = 6, 0, 0
    while True:  # its varint length
        length |= (raw[at] & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if raw[at - 1] < 0x80:
            break
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        pos = data.draw(st.integers(at, at + length - 1), label="at")
        raw[pos] = data.draw(st.integers(0, 255), label="octet")
    got = eo_unpack(bytes(raw))
    assert len(got) == len(recs) + 1 and got[-1] is True
    net = Net("AB", mode=EXACTLY_ONCE)
    net.r["A"].subscriber_attached(("c", "l"), [], 1.0)
    net.pump(1.0)
    for rec in got[:-1]:
        if rec is None:
            continue
        assert type(rec) is tuple and rec[0] in ("FWD", "ACCEPT", "SETTLE", "SEEN")
        assert type(rec[1]) is str and type(rec[2]) is bytes
        net.r["B"].receive("A", rec, 1.0)  # must not raise
        net.r["B"].receive("A", (rec[0], net.r["B"].topic, *rec[2:]), 1.0)
    net.pump(1.0)


def test_compact_records_refer_back_only_to_a_record_that_parsed() -> None:
    """A compact record that refers to the previous record's fields when there is none (the
    first of a list), or when the previous one did not parse, decodes as None; one that does
    not refer back decodes again; an unknown op or the reserved flag is None; a count larger
    than the record is refused without allocating."""
    from qrouter._fast.engine import eo_unpack

    from tests.eo.compact_records import TOPIC, T, X, frame, varint

    settle = ("SETTLE", "x", b"t", (("r", 1, -2),))
    whole = frame(3, b"\x01x" + b"\x01t" + b"\x01\x01r\x02\x03")
    same = frame(3 | TOPIC | T | X, b"")
    assert eo_unpack(_list_of(whole, same)) == [settle, settle]
    assert eo_unpack(_list_of(same, whole)) == [None, settle]  # nothing to refer to
    bad = frame(3, b"\x01x" + b"\x01t" + b"\x02\x01r\x02\x03")  # a count of 2, one target
    got = eo_unpack(_list_of(whole, bad, same, whole, same))
    assert got == [settle, None, None, settle, settle]
    # the other kinds' fields are not a SETTLE's: subscribers are not targets
    accept = frame(2, b"\x01x" + b"\x01t" + b"\x01\x01c\x01l")
    assert eo_unpack(_list_of(accept, same)) == [("ACCEPT", "x", b"t", (("c", "l"),)), None]
    assert eo_unpack(_list_of(frame(5, b""), whole)) == [None, settle]  # a newer op
    assert eo_unpack(_list_of(frame(3 | 0x80, b""), whole)) == [None, settle]
    assert eo_unpack(_list_of(frame(3 | 0x40, b"\x01x\x01t\x00"), whole)) == [None, settle]
    huge = frame(3, b"\x01x" + b"\x01t" + varint(2**64 - 1))
    assert eo_unpack(_list_of(huge)) == [None]
    assert eo_unpack(_list_of(frame(3, b"\x01x\x01t\x01\x01r" + b"\xff" * 11))) == [None]
    with pytest.raises(DecodeError):
        eo_unpack(b"\x0a" + varint(100) + b"\x03")  # a record longer than the data


def test_a_record_of_an_unknown_kind_is_what_the_next_one_refers_to() -> None:
    """A newer router's compact record (an op this router does not know, or the reserved
    flag) is the previous record for the one after it: that one, referring back, decodes as
    None, not with the fields of the record before the unknown one."""
    from qrouter._fast.engine import eo_unpack

    from tests.eo.compact_records import TOPIC, T, X, frame

    settle = ("SETTLE", "x", b"t", (("r", 1, -2),))
    whole = frame(3, b"\x01x" + b"\x01t" + b"\x01\x01r\x02\x03")
    same = frame(3 | TOPIC | T | X, b"")
    assert eo_unpack(_list_of(whole, frame(5, b"\x01y"), same)) == [settle, None, None]
    assert eo_unpack(_list_of(whole, frame(3 | 0x80, b""), same)) == [settle, None, None]


def test_references_back_cannot_name_more_attachments_than_the_list_has_octets() -> None:
    """A reference back costs a few octets however long the list it repeats, and the
    receiver works per attachment: a list's records may take by reference at most one
    attachment or subscriber per octet of the list; past that they decode as None."""
    from qrouter._fast.engine import eo_unpack

    from tests.eo.compact_records import TOPIC, T, X, frame, varint

    many = 2000
    targets = b"".join(b"\x01r\x02\x03" for _ in range(many))
    whole = frame(3, b"\x01x" + b"\x01t" + varint(many) + targets)
    same = frame(3 | TOPIC | T | X, b"")
    got = eo_unpack(_list_of(whole, *[same] * 20))
    raw = len(_list_of(whole, *[same] * 20))
    assert got[0][3] == (("r", 1, -2),) * many
    taken = [r for r in got[1:] if r is not None]
    # within the budget the references decode, and every one after the first refused too
    assert 0 < len(taken) * many <= raw
    assert got[1 + len(taken) :] == [None] * (20 - len(taken))


def test_a_router_started_without_compact_records_does_not_read_them() -> None:
    """QROUTER_EO_COMPACT=0 (a router of the version before, for tests): the engine takes
    0x0A as an unknown type, as that version does."""
    import os
    import subprocess
    import sys

    from tests.eo.compact_records import frame

    raw = _list_of(frame(3, b"\x01x" + b"\x01t" + b"\x00"))
    code = (
        "import sys; from qrouter._fast.engine import eo_unpack\n"
        "try:\n    print(eo_unpack(bytes.fromhex(sys.argv[1])))\n"
        "except Exception as e:\n    print(type(e).__name__)\n"
    )
    for flag, expect in (("1", "[('SETTLE', 'x', b't', ())]"), ("0", "DecodeError")):
        env = {**os.environ, "QROUTER_EO_COMPACT": flag}
        out = subprocess.run(
            [sys.executable, "-c", code, raw.hex()],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert out.stdout.strip() == expect


def test_compact_records_are_agreed_in_subs() -> None:
    """A router's SUBS says `compact` unless QROUTER_EO_COMPACT=0; a core sends compact
    records to the peers whose SUBS said it, if it reads them itself; a channel that breaks
    forgets it (the peer may come back as another version)."""
    net = Net("AB", mode=EXACTLY_ONCE)
    a, b = net.r["A"], net.r["B"]
    for r, peer in ((a, "B"), (b, "A")):
        r.router_down(peer, 0.0)
        r.router_up(peer, 0.0)
    subs = [m for _, _, m in net.wire if isinstance(m, dict) and m["op"] == "SUBS"]
    assert [m.get("compact") for m in subs] == [1, 1]
    net.pump(0.0)
    assert a._compact_ok == {"B"} and b._compact_ok == {"A"}
    a.router_down("B", 1.0)
    assert a._compact_ok == set()
    b._compact = False  # as QROUTER_EO_COMPACT=0 makes it
    a.router_up("B", 1.0)
    b.router_down("A", 1.0)
    b.router_up("A", 1.0)
    subs = [m for _, _, m in net.wire if isinstance(m, dict) and m["op"] == "SUBS"]
    assert [m.get("compact", "absent") for m in subs] == [1, "absent"]
    net.pump(1.0)
    assert a._compact_ok == set() and b._compact_ok == set()
    assert a._records_ok == {"B"} and b._records_ok == {"A"}
