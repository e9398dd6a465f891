"""The state machine on its own: a few routers wired by hand, messages pumped to quiescence."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from qrouter.eo import (
    AT_LEAST_ONCE,
    EXACTLY_ONCE,
    AttId,
    MemoryRecordStore,
    Pub,
    SubState,
    TerminusRecordStore,
    TopicRouter,
    outgoing_tag,
)
from qrouter.eo.messages import make

P: Pub = ("pc", "pl")
S1 = ("s1", "l")
S2 = ("s2", "l")


class Port:
    def __init__(self, net: Net, name: str) -> None:
        self.net = net
        self.name = name

    def to_router(self, router_id: str, message: dict[str, Any]) -> None:
        self.net.wire.append((self.name, router_id, message))

    def deliver(self, att: AttId, out_tag: bytes, body: bytes, resume: bool) -> None:
        self.net.out.append(("deliver", att, out_tag, body, resume))

    def settle_subscriber(self, att: AttId, out_tag: bytes) -> None:
        self.net.out.append(("settle", att, out_tag))

    def accept_publisher(self, pub: Pub, tag: bytes) -> None:
        self.net.out.append(("accept", pub, tag))

    def resend(self, pub: Pub, tags: list[bytes]) -> None:
        self.net.out.append(("resend", pub, tags))

    def log(self, level: str, msg: str) -> None:
        self.net.logs.append((level, msg))


class Net:
    def __init__(self, names: str = "AB", mode: str = EXACTLY_ONCE, **kw: Any) -> None:
        self.wire: deque[tuple[str, str, dict[str, Any]]] = deque()
        self.out: list[tuple[Any, ...]] = []
        self.logs: list[tuple[str, str]] = []
        self.stores = {n: MemoryRecordStore() for n in names}
        self.mode = mode
        self.kw = kw
        self.r: dict[str, TopicRouter] = {}
        for n in names:
            self.start(n, 1)
        for a in names:
            for b in names:
                if a < b:
                    self.up(a, b)

    def start(self, name: str, instance: int) -> TopicRouter:
        self.r[name] = TopicRouter(
            name,
            Port(self, name),
            self.stores.setdefault(name, MemoryRecordStore()),
            instance=instance,
            mode=self.mode,
            **self.kw,
        )
        return self.r[name]

    def up(self, a: str, b: str) -> None:
        self.r[a].router_up(b, 0.0)
        self.r[b].router_up(a, 0.0)
        self.pump()

    def pump(self, now: float = 0.0) -> None:
        while self.wire:
            src, dst, msg = self.wire.popleft()
            self.r[dst].receive(src, msg, now)

    def take(self, kind: str) -> list[tuple[Any, ...]]:
        got = [o for o in self.out if o[0] == kind]
        self.out = [o for o in self.out if o[0] != kind]
        return got


def test_outgoing_tag() -> None:
    t = outgoing_tag("c", "l", b"1")
    assert len(t) == 32 and t == outgoing_tag("c", "l", b"1")
    assert len({outgoing_tag("ab", "c", b""), outgoing_tag("a", "bc", b""), t}) == 3
    assert outgoing_tag("c", "l", b"1", key=b"other") != t


def test_accept_only_when_every_router_accepted() -> None:
    net = Net("AB")
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    b2 = net.r["B"].subscriber_attached(S2, [], 0.0)
    net.pump()
    net.r["A"].publisher_attached(P, [], 0.0)
    net.r["A"].publisher_transfer(P, b"t1", b"m1", 0.0)
    net.pump()
    t = outgoing_tag(*P, b"t1")
    assert sorted(d[1] for d in net.take("deliver")) == [a1, b2]
    net.r["A"].subscriber_accepted(a1, t, 0.0)
    net.pump()
    assert net.take("accept") == []  # B's subscriber has not accepted yet
    rec = net.r["A"].origin_records()[t]
    assert rec.interested_routers(net.r["A"].view.routers_of()) == {
        "A": SubState.ACCEPTED,
        "B": SubState.PENDING,
    }
    net.r["B"].subscriber_accepted(b2, t, 0.0)
    net.pump()
    assert net.take("accept") == [("accept", P, b"t1")]
    net.r["A"].publisher_settled(P, b"t1", 0.0)
    net.pump()
    assert sorted(s[1] for s in net.take("settle")) == [a1, b2]
    net.r["A"].subscriber_settled(a1, t, 0.0)
    net.r["B"].subscriber_settled(b2, t, 0.0)
    net.pump()
    assert net.r["A"].origin_records() == {}
    for n in "AB":  # tombstones go after one PING/PONG round
        net.r[n].tick(1.0)
    net.pump()
    for n in "AB":
        net.r[n].tick(2.0)
    assert net.r["A"].local_records() == {} and net.r["B"].local_records() == {}


def test_placeholder_holds_the_order_until_filled() -> None:
    net = Net("AB")
    net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["B"].publisher_attached(P, [], 0.0)
    net.r["B"].publisher_transfer(P, b"t1", b"m1", 0.0)
    net.r["B"].publisher_transfer(P, b"t2", b"m2", 0.0)
    t1, t2 = outgoing_tag(*P, b"t1"), outgoing_tag(*P, b"t2")
    # The subscriber resumes at C before anything reached A; it already received t1.
    net.wire.clear()
    net.out.clear()
    net.r["C"] = net.start("C", 1)
    net.r["C"].router_up("B", 0.0)
    c = net.r["C"].subscriber_attached(S1, [(t1, False)], 0.0)
    assert net.take("deliver") == []  # t1 is a placeholder: nothing may overtake it
    net.r["B"].router_up("C", 0.0)
    net.pump()
    got = [(d[2], d[4]) for d in net.take("deliver") if d[1] == c]
    assert got == [(t1, True), (t2, False)]  # t1 resumed first, then t2


def test_unknown_deliveries_are_resent_by_the_publisher() -> None:
    net = Net("AB")
    net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["B"].publisher_attached(P, [(b"t1", False), (b"t0", True)], 0.0)
    assert net.take("resend") == [("resend", P, [b"t1"])]


def test_publisher_closed_abandons_its_deliveries() -> None:
    net = Net("AB")
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["B"].publisher_attached(P, [], 0.0)
    net.r["B"].publisher_transfer(P, b"t1", b"m1", 0.0)
    net.pump()
    net.take("deliver")
    net.r["B"].publisher_detached(P, True, 0.0)
    net.pump()
    assert net.take("settle") == [("settle", a1, outgoing_tag(*P, b"t1"))]


def test_orphaned_records_abandoned_after_the_terminus_timeout() -> None:
    net = Net("AB", terminus_timeout=10.0)
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["B"].publisher_attached(P, [], 0.0)
    net.r["B"].publisher_transfer(P, b"t1", b"m1", 0.0)
    net.pump()
    net.r["B"].publisher_detached(P, False, 1.0)
    net.r["B"].tick(5.0)
    net.pump()
    assert net.take("settle") == []  # still waiting for the publisher to come back
    net.r["B"].tick(12.0)
    net.pump()
    assert [s[1] for s in net.take("settle")] == [a1]


def test_publisher_without_a_map_has_the_timeout_to_resend() -> None:
    """Idempotent publishing: a publisher that re-attaches with no unsettled map at all
    (proton) keeps its unsettled deliveries; the ones it resends with the same tag are driven
    to their outcome, the others are abandoned after the terminus timeout."""
    net = Net("AB", terminus_timeout=10.0)
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    b = net.r["B"]
    b.publisher_attached(P, [], 0.0)
    b.publisher_transfer(P, b"t1", b"m1", 0.0)
    b.publisher_transfer(P, b"t2", b"m2", 0.0)
    net.pump()
    assert len(net.take("deliver")) == 2
    b.publisher_detached(P, False, 1.0)
    b.publisher_attached(P, [], 2.0, resumable=False)
    net.pump()
    assert net.take("settle") == []  # nothing abandoned: it may resend them
    b.publisher_transfer(P, b"t1", b"m1", 3.0)  # the resend of t1 only
    net.r["A"].subscriber_accepted(a1, outgoing_tag(*P, b"t1"), 4.0)
    net.pump()
    assert net.take("accept") == [("accept", P, b"t1")]
    assert net.take("deliver") == []  # not delivered twice
    b.tick(8.0)
    net.pump()
    assert net.take("settle") == []
    b.tick(11.5)  # 10 s after the disconnect: t2 was not resent
    net.pump()
    assert net.take("settle") == [("settle", a1, outgoing_tag(*P, b"t2"))]


def test_subscriber_in_limbo_is_discarded_after_the_timeout() -> None:
    net = Net("AB", terminus_timeout=10.0)
    net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["B"].router_down("A", 1.0)  # A died with S1 on it
    net.r["B"].publisher_attached(P, [], 1.0)
    net.r["B"].publisher_transfer(P, b"t1", b"m1", 1.0)
    assert net.take("accept") == []  # owed to S1, wherever it comes back
    net.r["B"].tick(5.0)
    assert net.take("accept") == []
    net.r["B"].tick(12.0)
    assert net.take("accept") == [("accept", P, b"t1")]
    assert S1 not in net.r["B"].view.known


def test_restart_recovers_origin_records_and_subscribers() -> None:
    net = Net("AB")
    net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["B"].publisher_attached(P, [], 0.0)
    net.r["B"].publisher_transfer(P, b"t1", b"m1", 0.0)
    net.wire.clear()  # lost with the crash
    b = net.start("B", 2)
    t = outgoing_tag(*P, b"t1")
    assert list(b.origin_records()) == [t] and b.origin_records()[t].body == b"m1"
    assert S1 in b.view.known


def test_at_least_once_keeps_no_durable_records() -> None:
    net = Net("AB", mode=AT_LEAST_ONCE)
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["B"].publisher_attached(P, [], 0.0)
    net.r["B"].publisher_transfer(P, b"t1", b"m1", 0.0)
    net.pump()
    net.r["A"].subscriber_accepted(a1, outgoing_tag(*P, b"t1"), 0.0)
    net.pump()
    assert net.take("accept") == [("accept", P, b"t1")]
    net.r["B"].publisher_settled(P, b"t1", 0.0)
    assert net.r["B"].origin_records() == {} and net.r["A"].local_records() == {}
    assert not any(k.startswith((b"o/", b"m/")) for k in net.stores["B"].data)


def test_bad_messages_are_dropped_with_a_warning() -> None:
    net = Net("AB")
    net.r["A"].receive("B", {"op": "FWD", "v": 1, "topic": ""}, 0.0)
    net.r["A"].receive("B", make("PING", "", e=1) | {"v": 9}, 0.0)
    net.r["A"].receive("Z", make("PING", "", e=1), 0.0)  # channel not up
    assert [lvl for lvl, _ in net.logs] == ["warning", "warning", "debug"]


def test_unknown_unsafe_variant_refused() -> None:
    with pytest.raises(ValueError):
        TopicRouter("A", Port(Net("A"), "A"), instance=1, unsafe=["nope"])


def test_terminus_store_adapter() -> None:
    from qrouter.stores import open_store

    with open_store("memory", None) as store:
        rs = TerminusRecordStore(store, "events")
        rs.commit({b"o/x": b"1", b"k/y": b"2"}, [])
        rs.commit({}, [b"k/y"])
        assert list(rs.scan(b"o/")) == [(b"o/x", b"1")]
        assert list(rs.scan(b"k/")) == []


def test_a_client_that_cannot_resume_sees_settlement_at_once() -> None:
    net = Net("AB")
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0, resumable=False)
    net.pump()
    net.r["B"].publisher_attached(P, [], 0.0)
    net.r["B"].publisher_transfer(P, b"t1", b"m1", 0.0)
    net.pump()
    net.r["A"].subscriber_accepted(a1, outgoing_tag(*P, b"t1"), 0.0)
    net.pump()
    net.r["B"].publisher_settled(P, b"t1", 0.0)
    net.pump()
    assert [s[1] for s in net.take("settle")] == [a1]
    assert net.r["B"].origin_records() == {}  # no settle from the client needed


def test_origin_record_encoding_round_trip_and_json_of_older_stores() -> None:
    from qrouter.eo.records import STATE_V2, OriginRecord

    subs = {("s2", "é"): SubState.SEEN, ("s1", "l"): SubState.ACCEPTED, ("s0", ""): SubState(0)}
    rec = OriginRecord(b"t" * 32, P, b"\x00tag", b"body", subs, settled=True)
    raw = rec.encode_state()
    assert raw[:1] == STATE_V2
    assert OriginRecord.decode(rec.out_tag, raw, b"body") == rec
    for cut in (1, 5, len(raw) - 1):
        with pytest.raises(ValueError):
            OriginRecord.decode(rec.out_tag, raw[:cut], b"body")
    with pytest.raises(ValueError):
        OriginRecord.decode(rec.out_tag, raw + b"\x00", b"body")
    # what releases before STATE_V2 wrote
    old = (
        b'{"pub":["pc","pl"],"tag":"00746167","settled":1,'
        b'"subs":[["s0","",0],["s1","l",1],["s2","\\u00e9",2]]}'
    )
    assert OriginRecord.decode(rec.out_tag, old, b"body") == rec


def test_closed_subscriber_attaching_again_is_a_new_subscription() -> None:
    """Issue 15 (a): closing ends the terminus (§2.6.6), not the identity: a new attach with
    the same container-id and link name is owed new deliveries, and publishers wait for it."""
    net = Net("AB")
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["A"].subscriber_detached(a1, True, 1.0)
    net.pump()
    assert S1 in net.r["B"].view.closed
    b1 = net.r["B"].subscriber_attached(S1, [], 2.0)  # elsewhere, same identity
    net.pump()
    for n in "AB":
        assert S1 in net.r[n].view.known and S1 not in net.r[n].view.closed
        assert not any(k.startswith(b"c/") for k in net.stores[n].data)
    net.r["A"].publisher_attached(P, [], 3.0)
    net.r["A"].publisher_transfer(P, b"t1", b"m1", 3.0)
    net.pump()
    t = outgoing_tag(*P, b"t1")
    assert [(d[1], d[2]) for d in net.take("deliver")] == [(b1, t)]
    assert net.take("accept") == []  # the publisher waits for the new subscription
    net.r["B"].subscriber_accepted(b1, t, 3.0)
    net.pump()
    assert net.take("accept") == [("accept", P, b"t1")]
    # a restart keeps it subscribed
    assert S1 in net.start("A", 2).view.known


def _held(net: Net, src: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Take what `src` has sent and not yet delivered off the wire (a slow channel)."""
    held = [w for w in net.wire if w[0] == src]
    net.wire = type(net.wire)(w for w in net.wire if w[0] != src)
    return held


@pytest.mark.parametrize("clock", ["lamport", "wall"])
def test_attachments_are_ordered_by_stamp_not_by_arrival(clock: str) -> None:
    """Seed 20371's pattern: A's snapshot naming S1's old attachment a1 arrives at B after S1
    attached at B (b1); b1's link then drops, and A's late UNSUB closed=true of a1 arrives.
    By arrival a1 looks newest and the close ends the subscription at B, the driver; by stamp
    b1 is newer: S1 stays subscribed (in limbo). `lamport`: every clock reads 0, so only what
    B heard orders them; `wall`: B never heard of a1, its clock is later."""
    now = {"A": 0.0, "B": 0.0}
    net = Net("AB", clock=lambda: 0.0) if clock == "lamport" else Net("AB")
    if clock == "wall":
        for n in "AB":
            net.r[n]._clock = lambda n=n: now[n]  # type: ignore[attr-defined]
        net.r["A"].router_down("B", 0.0)
        net.r["B"].router_down("A", 0.0)
    now["A"] = 1.0
    a1 = net.r["A"].subscriber_attached(S1, [], 1.0)
    net.pump()
    if clock == "lamport":
        net.r["A"].router_down("B", 1.0)
        net.r["B"].router_down("A", 1.0)
    net.r["A"].router_up("B", 1.0)  # A's SUBS names a1: held on a slow channel
    net.r["B"].router_up("A", 1.0)
    net.r["A"].subscriber_detached(a1, True, 2.0)  # S1 closes at A...
    slow = _held(net, "A")
    net.pump()
    now["B"] = 3.0
    b1 = net.r["B"].subscriber_attached(S1, [], 3.0)  # ... and attaches again at B
    net.pump()
    net.wire.append(slow.pop(0))  # the snapshot naming a1
    net.pump()
    net.r["B"].subscriber_detached(b1, False, 4.0)  # its connection drops
    net.wire.extend(slow)  # the close of a1, late
    net.pump()
    b = net.r["B"].view
    assert S1 in b.known and S1 not in b.closed
    assert b.last_att[S1] == b1 and b.stamps[b1] > b.stamps.get(a1, -1)
    # the order survives a restart (the k/ value holds the stamp)
    again = net.start("B", 2)
    assert again.view.last_att[S1] == b1 and again.view.stamps[b1] == b.stamps[b1]
    assert again.attach_stamp() > b.stamps[b1]


def test_a_snapshot_naming_a_later_attachment_reopens_a_closed_subscriber() -> None:
    """Seed 671 of the store-failure schedules: C heard S1's close and then its new attach b1,
    but a crash lost the re-opening (its commit was held), and b1's router is gone too. A's
    snapshot names b1 as S1's newest attachment (`latest`): later than the close, so C owes S1
    again (in limbo), as A does; an attachment older than the close re-opens nothing."""
    net = Net("ABC", clock=lambda: 0.0)
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["A"].subscriber_detached(a1, True, 1.0)
    net.pump()
    closed_at_c = dict(net.stores["C"].data)  # C's store when it had only heard the close
    b1 = net.r["B"].subscriber_attached(S1, [], 2.0)
    net.pump()
    assert S1 in net.r["C"].view.known
    for peer in "AB":  # B crashes; C crashes and restarts from the store before the reopen
        net.r["C"].router_down(peer, 3.0)
        net.r[peer].router_down("C", 3.0)
    net.r["A"].router_down("B", 3.0)
    net.stores["C"].data = closed_at_c
    c = net.start("C", 2)
    assert S1 in c.view.closed and S1 not in c.view.known
    net.r["A"].router_up("C", 4.0)
    c.router_up("A", 4.0)
    net.pump()
    assert S1 in c.view.known and S1 not in c.view.closed
    assert c.view.last_att[S1] == b1 and not c.view.claims_of(S1)  # in limbo
    assert not any(k.startswith(b"c/") for k in net.stores["C"].data)
    # a snapshot naming the attachment that closed it (or an older one) changes nothing
    d = Net("AB", clock=lambda: 0.0)
    d1 = d.r["A"].subscriber_attached(S1, [], 0.0)
    d.pump()
    d.r["A"].subscriber_detached(d1, True, 1.0)
    d.pump()
    stamp = d.r["B"].view.stamps[d1]
    snapshot = make(
        "SUBS", "", instance=1, attached=[], known=[list(S1)], closed=[],
        latest=[[list(S1), list(d1)]], stamps=[[list(d1), stamp]],
    )  # fmt: skip
    d.r["B"].receive("A", snapshot, 2.0)
    assert S1 in d.r["B"].view.closed


@pytest.mark.parametrize(
    "latest",
    [[[["s", "l"], ["A", 1, 1]]] * 2, "x", [[["s", "l"]]], [[["s", "l"], ["A", 1]]], [3]],
)
def test_a_bad_latest_list_drops_the_snapshot(latest: Any) -> None:
    net = Net("AB")
    b = net.r["B"]
    snapshot = make(
        "SUBS", "", instance=1, attached=[[["A", 1, 2], list(S2), []]], known=[["s", "l"]],
        closed=[], latest=latest,
    )  # fmt: skip
    b.receive("A", snapshot, 1.0)
    assert S2 not in b.view.known
    assert any("bad message" in text for _, text in net.logs)


def test_the_router_holding_the_link_outlives_a_close_stamped_later() -> None:
    """A's clock is 1 s ahead of B's: S1 closes at A and attaches at B at once, so b1's stamp
    is below a1's. B holds the link, so a1 is the older: B keeps S1, stamps b1 again above a1
    and announces it again; A, which closed S1, re-opens it on that."""
    net = Net("AB")
    now = {"A": 11.0, "B": 10.0}
    for n in "AB":
        net.r[n]._clock = lambda n=n: now[n]  # type: ignore[attr-defined]
    a1 = net.r["A"].subscriber_attached(S1, [], 1.0)
    net.r["A"].subscriber_detached(a1, True, 2.0)
    slow = _held(net, "A")  # a1's SUB and its close, late
    b1 = net.r["B"].subscriber_attached(S1, [], 2.0)
    net.pump()  # A re-opens S1 on b1's claim ...
    net.wire.extend(slow)  # ... and B hears a1 (stamped later than b1) closed
    net.pump()
    for n in "AB":
        view = net.r[n].view
        assert S1 in view.known and S1 not in view.closed, n
        assert view.last_att[S1] == b1 and [c.att for c in view.claims_of(S1)] == [b1], n
        assert view.stamps[b1] > 11_000, n  # later than a1 now


def test_attachment_stamps_of_an_older_router_default_to_arrival_order() -> None:
    """SUB/UNSUB without `at`, SUBS without `stamps`, store values without a stamp: the order
    is unknown and the last announcement to arrive counts as the newest (as before)."""
    net = Net("AB")
    b = net.r["B"]
    old = ("A", 1, 7)
    b.receive("A", make("SUB", "", att=list(old), sub=list(S1), map=[]), 1.0)
    assert b.view.last_att[S1] == old and old not in b.view.stamps
    b1 = b.subscriber_attached(S1, [], 1.0)
    assert b.view.last_att[S1] == b1
    b.receive("A", make("UNSUB", "", att=list(old), sub=list(S1), closed=1), 2.0)
    assert S1 in b.view.known  # b1 claims it
    b.receive("A", make("SUBS", "", instance=1, attached=[], known=[], closed=[]), 2.0)
    assert S1 in b.view.known
    net.stores["C"] = MemoryRecordStore()
    net.stores["C"].commit({b"k/" + b'["s1","l"]': b'["A",1,7]'}, set())
    c = net.start("C", 1)
    assert c.view.last_att[S1] == old and old not in c.view.stamps


def _stamped_snapshot(attached: list[Any], stamps: list[Any]) -> Any:
    """A SUBS from router A (instance 1) with these attachments and their stamps."""
    return make("SUBS", "", instance=1, attached=attached, known=[], closed=[], stamps=stamps)


@pytest.mark.parametrize(
    "bad",
    [-1, 2**62, 2**70, 1.5, True, "1", [1], b"\x01"],
)
def test_a_bad_attachment_stamp_drops_the_message(bad: Any) -> None:
    net = Net("AB")
    b = net.r["B"]
    b.receive("A", make("SUB", "", att=["A", 1, 1], sub=list(S1), map=[], at=bad), 1.0)
    b.receive("A", _stamped_snapshot([[["A", 1, 2], list(S2), []]], [[["A", 1, 2], bad]]), 1.0)
    b._flush()
    assert S1 not in b.view.known and S2 not in b.view.known
    assert sum("bad message" in text for _, text in net.logs) == 2


def test_a_snapshot_with_more_stamps_than_attachments_is_dropped() -> None:
    net = Net("AB")
    b = net.r["B"]
    stamps = [[["A", 1, n], n] for n in range(3)]
    b.receive("A", _stamped_snapshot([[["A", 1, 0], list(S1), []]], stamps), 1.0)
    assert S1 not in b.view.known
    assert any("bad message" in text for _, text in net.logs)


def test_a_stamp_far_ahead_is_not_followed() -> None:
    net = Net("AB", clock=lambda: 100.0)
    b = net.r["B"]
    b.receive("A", make("SUB", "", att=["A", 1, 1], sub=list(S1), map=[], at=2**61), 1.0)
    assert S1 in b.view.known
    assert b.attach_stamp() < 100_000 + 60_000


def test_late_close_of_an_old_attachment_does_not_end_the_new_subscription() -> None:
    # C hears S1's new attach at B before the close of its old one at A (different channels)
    net = Net("ABC")
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["A"].subscriber_detached(a1, True, 1.0)
    b1 = net.r["B"].subscriber_attached(S1, [], 1.0)
    late = [w for w in net.wire if w[0] == "A"]
    net.wire = type(net.wire)(w for w in net.wire if w[0] != "A")
    net.pump()
    net.wire.extend(late)
    net.pump()
    for n in "ABC":
        assert net.r[n].view.claims_of(S1)[0].att == b1, n
        assert S1 in net.r[n].view.known, n
    # closed again: a very late SUB of the first attachment is followed, on the same FIFO
    # channel, by its UNSUB: the subscriber ends up closed
    net.r["B"].subscriber_detached(b1, True, 2.0)
    net.pump()
    assert S1 not in net.r["C"].view.known
    net.r["C"].receive("A", make("SUB", "", att=list(a1), sub=list(S1), map=[]), 3.0)
    net.r["C"].receive("A", make("UNSUB", "", att=list(a1), sub=list(S1), closed=1), 3.0)
    assert S1 not in net.r["C"].view.known and S1 in net.r["C"].view.closed


def test_a_peer_lacking_the_guarantee_does_not_hold_tombstones() -> None:
    """Issue 15 (b): C has no guarantee for the topic and answers PING with LACKING (the
    embedding does, qrouter/guarantee.py); A and B stop waiting for its PONG, log it once,
    and report it."""
    net = Net("AB")
    for n in "AB":
        net.r[n].router_up("C", 0.0)
    net.wire.clear()  # the SUBS snapshots to C: nobody there to read them
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.r["B"].publisher_attached(P, [], 0.0)

    def pump(now: float) -> None:
        while net.wire:
            src, dst, msg = net.wire.popleft()
            if dst != "C":
                net.r[dst].receive(src, msg, now)
            elif isinstance(msg, dict) and msg["op"] == "PING":
                net.r[src].receive("C", make("LACKING", ""), now)

    pump(0.0)
    for i in range(3):
        t = outgoing_tag(*P, b"t%d" % i)
        net.r["B"].publisher_transfer(P, b"t%d" % i, b"m", 0.0)
        pump(0.0)
        net.r["A"].subscriber_accepted(a1, t, 0.0)
        pump(0.0)
        net.r["B"].publisher_settled(P, b"t%d" % i, 0.0)
        pump(0.0)
        net.r["A"].subscriber_settled(a1, t, 0.0)
        pump(0.0)
    for now in (1.0, 2.0, 3.0):
        for n in "AB":
            net.r[n].tick(now)
        pump(now)
    assert net.r["A"].local_records() == {} and net.r["B"].origin_records() == {}
    # A had tombstones waiting for the barrier, so it pinged C and learned; B had none
    assert [net.r[n].lacking_routers() for n in "AB"] == [["C"], []]
    assert [m for _, m in net.logs].count(
        "A/: router C has no guarantee for this topic: configure it"
    ) == 1
    pings = [w for w in net.wire if w[1] == "C"]
    assert pings == []  # no more PINGs to it


def test_publisher_link_keeps_only_the_tags_of_its_attach_map() -> None:
    """Issue 15 (c): the tags a publisher sent are kept only where ASK answers need them
    (tags of its attach map), not for every message of the attachment."""
    net = Net("AB")
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["A"].publisher_attached(P, [(b"old", False)], 0.0)
    for i in range(100):
        t = b"t%d" % i
        net.r["A"].publisher_transfer(P, t, b"m", 0.0)
        net.r["A"].subscriber_accepted(a1, outgoing_tag(*P, t), 0.0)
        net.r["A"].publisher_settled(P, t, 0.0)
    assert net.r["A"]._pubs[P].awaiting == {b"old"}  # asked to resend it
    net.r["A"].publisher_transfer(P, b"old", b"m", 0.0)
    assert net.r["A"]._pubs[P].awaiting == set()


def test_no_ping_without_tombstones_and_idle_topic() -> None:
    net = Net("AB")
    assert net.r["A"].idle()
    net.r["A"].tick(1.0)
    assert net.wire == deque()  # nothing waits for a barrier: no PING
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    assert not net.r["A"].idle() and not net.r["B"].idle()  # B knows S1
    net.r["A"].subscriber_detached(a1, True, 1.0)
    net.pump()
    assert net.r["A"].idle() and net.r["B"].idle()
    assert net.r["A"].new_attachment_id() == ("A", 1, 2)
    again = TopicRouter("A", Port(net, "A"), net.stores["A"], instance=1, first_att=2)
    assert again.new_attachment_id() == ("A", 1, 3)  # made again: ids stay unique
    assert S1 in again.view.closed


def test_a_record_recovered_without_its_body_is_never_delivered_empty() -> None:
    """Issue 15 (d): a store that holds a record's state but not its message (written by a
    failed or older commit) must not make an empty delivery: the record forwards nothing
    until its publisher resends the message."""
    net = Net("AB")
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["B"].publisher_attached(P, [], 0.0)
    net.r["B"].publisher_transfer(P, b"t1", b"m1", 0.0)
    t = outgoing_tag(*P, b"t1")
    net.wire.clear()  # B crashes before its FWD left
    net.r["A"].subscriber_detached(a1, False, 0.5)
    del net.stores["B"].data[b"m/" + t]
    b = net.start("B", 2)
    assert b.origin_records()[t].body is None
    net.out.clear()
    # the subscriber resumes at A reporting t unprocessed: a placeholder nobody may fill empty
    net.r["A"].router_down("B", 1.0)
    a2 = net.r["A"].subscriber_attached(S1, [(t, False)], 1.0)
    net.r["A"].router_up("B", 1.0)
    b.router_up("A", 1.0)
    net.pump()
    assert any(lvl == "error" and "no message body" in m for lvl, m in net.logs)
    assert net.take("deliver") == []
    b.publisher_attached(P, [(b"t1", False)], 2.0)
    assert net.take("resend") == [("resend", P, [b"t1"])]
    b.publisher_transfer(P, b"t1", b"m1", 2.0)
    net.pump()
    assert [(d[1], d[3]) for d in net.take("deliver")] == [(a2, b"m1")]
    assert net.stores["B"].data[b"m/" + t] == b"m1"


def test_ask_after_the_driver_finished_a_record_is_answered_settled() -> None:
    """Issue 15 (f): the driver held a record of a tag in the publisher's attach map (so it
    never asked for a resend), finished it and dropped it; an ex-driver asking then was told
    "live" and forgot its own record, leaving subscribers only it knew with a delivery
    nobody would ever settle. It is "settled" now."""
    net = Net("AB")
    net.r["A"].publisher_attached(P, [], 0.0)
    net.r["A"].publisher_transfer(P, b"t1", b"m", 0.0)
    a = net.start("A", 2)  # restarted: the record is back; the publisher returns with t1
    a.router_up("B", 0.0)
    a.publisher_attached(P, [(b"t1", False)], 0.0)
    assert net.take("resend") == []  # it has the record: no resend
    a.publisher_settled(P, b"t1", 0.0)
    assert a.origin_records() == {}
    net.wire.clear()
    a.receive("B", make("ASK", "", pub=list(P), tags=[b"t1"], owed=[]), 0.0)
    answer = [
        m for _, dst, m in net.wire if dst == "B" and isinstance(m, dict) and m["op"] == "ANSWER"
    ]
    assert [(a["live"], a["settled"]) for a in answer] == [([], [b"t1"])]


def test_driver_takes_over_the_subscribers_an_ex_driver_owed() -> None:
    """Issue 15 (f): an ex-driver's record may owe a delivery to a subscriber the driver's
    record lacks (it subscribed in between); ASK carries them (`owed`) and the driver adds
    them before it answers "live", so the settlement reaches that subscriber too."""
    net = Net("AB")
    t = outgoing_tag(*P, b"t1")
    net.r["A"].publisher_attached(P, [], 0.0)
    net.r["A"].publisher_transfer(P, b"t1", b"m", 0.0)  # nobody subscribed: no one owed
    assert net.r["A"].origin_records()[t].subs == {}
    ask = make("ASK", "", pub=list(P), tags=[b"t1"], owed=[[b"t1", [[*S1, 1]]]])
    net.r["A"].receive("B", ask, 0.0)
    assert net.r["A"].origin_records()[t].subs == {S1: SubState.ACCEPTED}
    net.r["A"].receive("B", make("ASK", "", pub=list(P), tags=[b"t1"], owed=[[b"x", 7], 3]), 0.0)
    assert net.r["A"].origin_records()[t].subs == {S1: SubState.ACCEPTED}  # junk ignored


def test_handed_over_subscriber_closed_here_waits_the_terminus_timeout() -> None:
    """An ex-driver may hand over (ASK `owed`) a subscriber the driver still takes for
    closed (the claim that re-opens it not yet arrived): it does not hold the publisher's
    ACCEPTED back, and the settled record waits for it as for one in limbo."""
    net = Net("AB", terminus_timeout=10.0)
    a1 = net.r["A"].subscriber_attached(S1, [], 0.0)
    net.pump()
    net.r["A"].subscriber_detached(a1, True, 0.0)
    net.pump()
    t = outgoing_tag(*P, b"t1")
    b = net.r["B"]
    b.publisher_attached(P, [], 1.0)
    b.publisher_transfer(P, b"t1", b"m", 1.0)
    b.receive("A", make("ASK", "", pub=list(P), tags=[b"t1"], owed=[[b"t1", [[*S1, 0]]]]), 1.0)
    assert b.origin_records()[t].subs == {S1: SubState.PENDING}
    assert net.take("accept") == [("accept", P, b"t1")]  # closed here: it blocks nothing
    b.publisher_settled(P, b"t1", 2.0)
    b.tick(5.0)
    assert t in b.origin_records()  # the re-opening claim may still come
    b.tick(12.0)
    assert b.origin_records() == {}
