"""The compiled half of the state machine (qrouter/_fast/eo_core.pyx): what it must keep of
the Python it replaced. The protocol itself is checked by the simulation (test_simulation.py),
which runs `TopicRouter` and so this code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from qrouter._fast.eo_core import EoCore, split_writes, stage_writes
from qrouter.eo import LocalRecord, LocalState, OriginRecord, SubState, TopicRouter, outgoing_tag
from tests.eo.test_protocol import S1, S2, Net, P

# STATE_V2 records written by the pure-Python records.py (before eo_core): a store written by
# it must read the same, and a record must encode to the same bytes.
GOLDEN_SETTLED = bytes.fromhex(
    "020100000003707562000000036cc3a90000000400746167000000030000000273300000000000000000"
    "027331000000016c01000000027332000000017802"
)
GOLDEN_EMPTY = bytes.fromhex("02000000000170000000016c0000000000000000")


def test_topic_router_is_the_compiled_core() -> None:
    assert issubclass(TopicRouter, EoCore)
    assert TopicRouter.publisher_transfer is EoCore.publisher_transfer
    assert TopicRouter.receive is EoCore.receive


def test_origin_record_bytes_unchanged() -> None:
    subs = {("s2", "x"): SubState.SEEN, ("s1", "l"): SubState.ACCEPTED, ("s0", ""): 0}
    rec = OriginRecord(b"t" * 32, ("pub", "lé"), b"\x00tag", b"body", subs, settled=True)
    assert rec.encode_state() == GOLDEN_SETTLED
    assert OriginRecord.decode(rec.out_tag, GOLDEN_SETTLED, b"body") == rec
    empty = OriginRecord(b"t" * 32, ("p", "l"), b"", None, {})
    assert empty.encode_state() == GOLDEN_EMPTY
    assert OriginRecord.decode(empty.out_tag, GOLDEN_EMPTY, None) == empty


def test_records_keep_the_dataclass_defaults() -> None:
    rec = OriginRecord(b"t", ("p", "l"), b"x", b"b", {("s", "l"): SubState.PENDING})
    assert (rec.settled, rec.accepted_sent) == (False, False)
    assert rec.forwarded == rec.filled == rec.settle_sent == set()
    assert rec.pending() and not rec.done()
    assert rec.interested_routers({("s", "l"): {"B"}}) == {"B": SubState.PENDING}
    local = LocalRecord(b"t")
    assert local.placeholder and local.subs == {} and local.drivers == set()
    assert (local.settled, local.settled_epoch, local.settled_by) == (False, 0, set())
    assert not local.all_accepted() and local.all_seen()
    local.settled = True
    assert not local.placeholder
    assert LocalRecord(b"t") != local and LocalRecord(b"t") == LocalRecord(b"t")


def test_the_router_batch_keeps_the_last_write_and_encodes_records_once() -> None:
    """stage_writes / split_writes (the router's group commit, qrouter/guarantee.py): a
    topic's deletes, then puts, then records, under its prefix; at the commit each record
    is encoded in the state it was left in."""
    rec = OriginRecord(b"t" * 32, ("p", "l"), b"x", b"b", {("s", "l"): SubState.PENDING})
    writes: dict[bytes, object] = {b"other": b"1"}
    assert stage_writes(writes, b"eo/a/", {b"m/1": b"body"}, {b"o/1": rec}, [b"m/1", b"x"])
    assert not stage_writes(writes, b"eo/a/", {}, None, [b"o/1"])
    assert stage_writes(writes, b"eo/a/", {}, {b"o/1": rec}, [])
    rec.settled = True  # after staging: the commit writes this state
    puts, deletes = split_writes(writes)
    assert puts == {b"other": b"1", b"eo/a/m/1": b"body", b"eo/a/o/1": rec.encode_state()}
    assert deletes == {b"eo/a/x"}


def test_origin_subscriber_states_by_position() -> None:
    """The origin record keeps its subscribers as a shared layout and one state byte each
    (more than fit in the record itself too): adding and removing one keeps the others'
    states and the order a dict had, `subs` is a copy, and the bytes are the dict's."""
    subs = {(f"s{i:02}", "l"): SubState(i % 3) for i in range(40, 0, -1)}
    rec = OriginRecord(b"t" * 32, ("p", "l"), b"x", b"b", dict(subs))
    same = OriginRecord(b"t" * 32, ("p", "l"), b"x", b"b", dict(subs))
    assert rec.subs == subs and list(rec.subs) == list(subs) and rec == same
    rec.subs[("s01", "l")] = SubState.SEEN  # a copy: the record is unchanged
    assert rec.subs == subs
    assert rec.add_sub(("new", "l"), SubState.ACCEPTED)
    assert not rec.add_sub(("new", "l"), SubState.PENDING)  # there already: kept
    assert rec.pop_sub(("s20", "l")) == subs.pop(("s20", "l"))
    assert rec.pop_sub(("s20", "l")) is None
    subs[("new", "l")] = SubState.ACCEPTED
    assert rec.subs == subs and list(rec.subs) == list(subs)
    assert rec.has_sub(("new", "l")) and not rec.has_sub(("s20", "l"))
    assert OriginRecord.decode(rec.out_tag, rec.encode_state(), b"b").subs == subs
    for sub in list(subs):
        rec.pop_sub(sub)
    assert rec.subs == {} and not rec.pending()
    rec.settled = True
    assert rec.done()
    with pytest.raises(ValueError):
        OriginRecord(b"t", ("p", "l"), b"x", b"b", {("s", "l"): 7})


def test_local_attachment_states_by_position() -> None:
    """The local record's attachments and their states, by position (more than fit in the
    record itself too), and its routers (one, or a set) read as the dict and sets they were."""
    atts = [("B", 1, n) for n in range(20, 0, -1)]
    rec = LocalRecord(b"t", drivers={"A"}, subs={a: n % 6 for n, a in enumerate(atts)})
    assert rec.subs == {a: n % 6 for n, a in enumerate(atts)}
    assert rec == LocalRecord(b"t", drivers={"A"}, subs={a: n % 6 for n, a in enumerate(atts)})
    assert rec.pop_sub(atts[3]) == 3 and rec.pop_sub(atts[3]) is None
    rec.set_sub(atts[0], 5)
    rec.set_sub(("C", 1, 1), 4)
    expected = {a: n % 6 for n, a in enumerate(atts) if n != 3} | {atts[0]: 5, ("C", 1, 1): 4}
    assert rec.subs == expected and list(rec.subs) == list(expected)
    assert rec.has_sub(("C", 1, 1)) and not rec.has_sub(atts[3])
    for att in list(expected):
        rec.set_sub(att, 5)
    assert rec.all_accepted() and rec.all_seen()
    rec.drivers = {"A", "B"}
    rec.settled_by = set()
    assert (rec.drivers, rec.settled_by) == ({"A", "B"}, set())
    with pytest.raises(ValueError):
        rec.set_sub(atts[0], 6)


def test_sent_sets_by_attachment_slot_beyond_the_slots_and_after_churn() -> None:
    """The origin's forwarded / settle_sent are bits by attachment slot (64 a topic), the
    rest in sets: 70 subscribers each get a message and its settlement once, then 70 others
    after the first ones closed (their slots freed once no record holds them, and reused)."""
    net = Net("AB")
    a = net.r["A"]
    a.publisher_attached(P, [], 0.0)
    for round_, tag in enumerate([b"t1", b"t2"]):
        subs = [(f"s{round_}-{i}", "l") for i in range(70)]
        atts = [net.r["B"].subscriber_attached(s, [], 0.0, resumable=False) for s in subs]
        net.pump()
        a.publisher_transfer(P, tag, b"m", 0.0)
        net.pump()
        t = outgoing_tag(*P, tag)
        assert sorted(d[1] for d in net.take("deliver")) == sorted(atts)
        rec = a.origin_records()[t]
        assert rec.forwarded == set(atts)
        for att in atts:
            net.r["B"].subscriber_accepted(att, t, 0.0)
        net.pump()
        assert net.take("accept") == [("accept", P, tag)]
        a.publisher_settled(P, tag, 0.0)
        net.pump()
        assert sorted(s[1] for s in net.take("settle")) == sorted(atts)
        assert a.origin_records() == {}
        for att in atts:
            net.r["B"].subscriber_detached(att, True, 0.0)
        net.pump()


def test_a_peers_attachment_ids_are_taken_by_value_and_hints_end_with_the_attachment() -> None:
    """A peer's FWD names the attachments here with tuples of its own (the wire decoder's,
    the same objects message after message): they find the attachment by value, and the
    look-up kept for the peer's object (EoCore._c_local_sub) ends with the attachment."""
    net = Net("AB")
    b = net.r["B"]
    b1 = b.subscriber_attached(S1, [], 0.0, resumable=False)
    net.pump()
    peer_att = tuple(list(b1))  # equal, not the same object
    assert peer_att == b1 and peer_att is not b1

    def fwd(tag: bytes) -> tuple[object, ...]:
        return ("FWD", b.topic, outgoing_tag(*P, tag), P, tag, b"m", (peer_att,))

    t1 = outgoing_tag(*P, b"t1")
    b.receive("A", fwd(b"t1"), 0.0)
    assert [d[1:3] for d in net.take("deliver")] == [(b1, t1)]
    assert b.local_records()[t1].subs == {b1: LocalState.DELIVERED}
    b.subscriber_accepted(peer_att, t1, 0.0)  # an equal id finds the attachment too
    net.pump()
    assert b.local_records()[t1].subs == {b1: LocalState.ACCEPTED}
    b.subscriber_detached(b1, False, 0.0)
    net.pump()
    b.receive("A", fwd(b"t2"), 0.0)  # the same peer object: its attachment has gone
    assert net.take("deliver") == [] and outgoing_tag(*P, b"t2") not in b.local_records()
    b2 = b.subscriber_attached(S1, [], 0.0, att=b1, resumable=False)  # the id again
    net.pump()
    b.receive("A", fwd(b"t3"), 0.0)
    assert [d[1:3] for d in net.take("deliver")] == [(b2, outgoing_tag(*P, b"t3"))]


def test_a_new_local_record_keeps_the_attachments_own_id_after_an_equal_one() -> None:
    """A record's first attachment is keyed by the LocalSub's own id object, even when an
    equal id (another object: a placeholder's, a recovered record's) went through the key
    sets shared by equal ids first: the look-ups by the attachment's id (LocalRecord.c_pos)
    then find it by identity, not by hashing the tuple each time."""
    net = Net("AB")
    b = net.r["B"]
    b1 = b.subscriber_attached(S1, [], 0.0)
    net.pump()
    twin = tuple(list(b1))  # equal, not the same object
    assert twin == b1 and twin is not b1
    LocalRecord(b"x" * 32).set_sub(twin, LocalState.QUEUED)  # into the shared key sets
    net.r["A"].publisher_attached(P, [], 0.0)
    for tag in (b"t1", b"t2"):
        net.r["A"].publisher_transfer(P, tag, b"m", 0.0)
        net.pump()
        (att,) = b.local_records()[outgoing_tag(*P, tag)].subs
        assert att is b1
    assert [d[1] for d in net.take("deliver")] == [b1, b1]


def test_a_peers_accept_and_seen_find_their_record_by_the_whole_tag() -> None:
    """A peer's ACCEPT and SEEN name the origin record by its out tag alone, a bytes object
    of the peer's: the publisher's router finds the record through the slot of the tag's
    first bytes (EoCore._recent) when the record's whole tag equals it, so a tag that
    shares those bytes and no more finds nothing, an equal one (another object) finds the
    record, and a record gone is no longer held there."""
    net = Net("AB")
    a, b = net.r["A"], net.r["B"]
    b2 = b.subscriber_attached(S2, [], 0.0)
    net.pump()
    a.publisher_attached(P, [], 0.0)
    a.publisher_transfer(P, b"t1", b"m1", 0.0)
    net.pump()
    t = outgoing_tag(*P, b"t1")
    rec = a.origin_records()[t]
    assert a._recent_records() == [rec]
    assert [d[1:3] for d in net.take("deliver")] == [(b2, t)]
    b.subscriber_accepted(b2, t, 0.0)
    (src, dst, accept) = net.wire.popleft()
    assert (src, dst, accept[0], accept[2]) == ("B", "A", "ACCEPT", t) and not net.wire
    twin = t[:8] + bytes(x ^ 0xFF for x in t[8:])  # the same slot, another tag
    a.receive("B", (*accept[:2], twin, *accept[3:]), 0.0)
    net.pump()
    a.receive("B", (*accept[:2], t[:8], *accept[3:]), 0.0)  # a tag's first bytes alone
    net.pump()
    assert net.take("accept") == [] and rec.subs == {S2: SubState.PENDING}
    a.receive("B", (*accept[:2], bytes(bytearray(t)), *accept[3:]), 0.0)  # equal, not `t`
    net.pump()
    assert net.take("accept") == [("accept", P, b"t1")]
    a.publisher_settled(P, b"t1", 0.0)
    net.pump()
    assert [s[1:] for s in net.take("settle")] == [(b2, t)]
    b.subscriber_settled(b2, t, 0.0)
    net.pump()
    assert a.origin_records() == {} and a._recent_records() == []


def _in_flight(tags: list[bytes]) -> tuple[list[Any], dict[bytes, Any], Callable[[], None]]:
    """A publishes `tags` to B's subscriber (all in flight): A's `_recent_records()`, its
    origin records, and a function that has B's subscriber accept them all and checks that
    the publisher got each ACCEPT (found through `_recent` or the dict)."""
    net = Net("AB")
    a, b = net.r["A"], net.r["B"]
    b2 = b.subscriber_attached(S2, [], 0.0)
    net.pump()
    a.publisher_attached(P, [], 0.0)
    for tag in tags:
        a.publisher_transfer(P, tag, b"m", 0.0)
    net.pump()

    def accept_all() -> None:
        for tag in tags:
            b.subscriber_accepted(b2, outgoing_tag(*P, tag), 0.0)
        net.pump()
        assert sorted(x[2] for x in net.take("accept")) == sorted(tags)

    return a._recent_records(), a.origin_records(), accept_all


def test_the_table_of_recent_records_keeps_nearly_every_record_in_flight() -> None:
    """EoCore._recent gives a tag's key a pair of slots (eo_core.pyx, _recent_put), so of
    1500 records in flight it loses only those of the pairs three or more met in, 171 of
    them (11%); with one slot per key it lost every one a later record met, 369 (25%). The
    peers' ACCEPTs still find every record, through the dict for the lost ones."""
    tags = [b"k%d" % i for i in range(1500)]
    held, origins, accept_all = _in_flight(tags)
    assert len(held) >= 1500 * 83 // 100, len(held)  # (one slot per key: some 75%)
    assert len({id(r) for r in held}) == len(held) and all(origins[r.out_tag] is r for r in held)
    accept_all()


def test_the_table_of_recent_records_grows_with_the_records_in_flight_and_holds_no_other() -> None:
    """EoCore._recent doubles while more records are in flight than half its slots, keeping
    what it held: every record it holds is one `_origins` holds, and an ACCEPT finds each
    record in flight, through it or through the dict."""
    tags = [b"%d" % i for i in range(1500)]
    held, origins, accept_all = _in_flight(tags)
    assert len(held) > 1500 // 2 and all(origins[r.out_tag] is r for r in held)
    accept_all()


def test_the_table_of_recent_records_keeps_the_newer_two_of_a_pair() -> None:
    """Three records whose tags share a pair of slots in EoCore._recent (256 slots: the low
    bits of the tag's first 8 bytes, the last one clear): the table keeps the newest two, the
    records whose ACCEPTs are still to come, not the first (a second put into the pair's
    empty second slot made the third overwrite it)."""
    import sys

    def pair(tag: bytes) -> int:
        return int.from_bytes(outgoing_tag(*P, tag)[:8], sys.byteorder) & 254

    net = Net("AB")
    a, b = net.r["A"], net.r["B"]
    b.subscriber_attached(S2, [], 0.0)
    net.pump()
    a.publisher_attached(P, [], 0.0)
    candidates = [b"p%d" % i for i in range(2000)]
    first = pair(candidates[0])
    tags = [t for t in candidates if pair(t) == first][:3]
    assert len(tags) == 3
    for tag in tags:
        a.publisher_transfer(P, tag, b"m", 0.0)
    net.pump()
    origins = a.origin_records()
    assert a._recent_records() == [origins[outgoing_tag(*P, t)] for t in tags[:0:-1]]
