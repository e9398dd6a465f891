"""Links: ATTACH (2.7.3) and DETACH (2.7.7) with every field, handles (2.6.2), and FLOW
(2.7.4: link-credit, delivery-count, drain, echo), socketless."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Condition, Data, Link, Terminus
from qrouter._fast.codec import Array, Described, Symbol, UByte, UInt, ULong, symbol_array
from qrouter._fast.engine import Connection, Router

from tests.engine.pump import (
    ACCEPTED,
    ATTACH,
    DETACH,
    FLOW,
    SOURCE,
    TARGET,
    TRANSFER,
    Peer,
    RawPeer,
    Recording,
    attach_frame,
    described,
    error,
    flow_frame,
    make_core,
    message_bytes,
    parse_output,
    perf,
    pump,
    receive,
    send,
    transfer_frame,
)


@pytest.fixture
def core():  # type: ignore[no-untyped-def]
    return make_core()


# --- 2.7.3 ATTACH ----------------------------------------------------------------------------


def test_proton_attach_fields_round_trip(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.3 / 3.5.3 / 3.5.4: the fields proton can set reach the engine, and the router's
    ATTACH answers with the settle modes it will use and the source / target it attached."""
    p = Peer(core)
    s = p.session()
    rcv = s.receiver("every-field-rcv")
    rcv.source.address = "fields"
    rcv.source.durability = Terminus.DELIVERIES
    rcv.source.expiry_policy = Terminus.EXPIRE_NEVER
    rcv.source.timeout = 30
    rcv.source.distribution_mode = Terminus.DIST_MODE_COPY
    rcv.source.capabilities.put_array(False, Data.SYMBOL)
    rcv.source.capabilities.enter()
    rcv.source.capabilities.put_symbol("queue")
    rcv.source.capabilities.exit()
    rcv.source.filter.put_map()
    rcv.source.filter.enter()
    rcv.source.filter.put_symbol("sel")
    rcv.source.filter.put_described()
    rcv.source.filter.enter()
    rcv.source.filter.put_symbol("apache.org:selector-filter:string")
    rcv.source.filter.put_string("a = 1")
    rcv.source.filter.exit()
    rcv.source.filter.exit()
    rcv.target.address = "my-target"
    rcv.snd_settle_mode = Link.SND_UNSETTLED
    rcv.rcv_settle_mode = Link.RCV_SECOND
    rcv.max_message_size = 123456
    rcv.properties = {Symbol("prop"): "value"}
    rec = Recording(p.conn)
    rcv.open()
    pump(p)
    ((link, fields),) = rec.of("on_attach")
    assert fields["name"] == "every-field-rcv"
    assert fields["role"] is True  # the peer receives
    assert fields["snd_settle_mode"] == 0 and fields["rcv_settle_mode"] == 1
    assert fields["max_message_size"] == 123456
    assert fields["properties"] == {Symbol("prop"): "value"}
    src = fields["source"]
    assert src["address"] == "fields"
    assert src["durable"] == 2 and src["expiry_policy"] == "never" and src["timeout"] == 30
    assert src["distribution_mode"] == "copy"
    assert list(src["capabilities"]) == ["queue"]
    assert src["filter"][Symbol("sel")].value == "a = 1"
    assert fields["target"]["address"] == "my-target"
    # the router's answer
    assert rcv.remote_source.address == "fields"
    assert rcv.remote_target.address == "my-target"
    assert rcv.remote_snd_settle_mode == Link.SND_UNSETTLED
    assert rcv.remote_rcv_settle_mode == Link.RCV_SECOND
    assert rcv.state & Link.REMOTE_ACTIVE
    assert link.is_sender and link.name == "every-field-rcv"


def test_proton_sender_attach(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.3: a producer's ATTACH; the router receives, and announces max-message-size."""
    core = make_core(max_message_size=5000)
    p = Peer(core)
    snd = p.sender("to-here", snd_settle_mode=Link.SND_SETTLED)
    pump(p)
    assert snd.remote_target.address == "to-here"
    assert snd.remote_snd_settle_mode == Link.SND_SETTLED
    assert snd.remote_max_message_size == 5000


def test_raw_attach_with_every_field_is_read(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.3: all fourteen ATTACH fields, including unsettled (a map of delivery-tag to
    delivery-state) and incomplete-unsettled, which proton never writes: the engine decodes
    them for the control plane, and the link works."""
    raw = RawPeer(core)
    rec = Recording(raw.conn)
    unsettled = {
        b"tag-1": described(ACCEPTED),
        b"tag-2": Described(ULong(0x23), [UInt(0), ULong(10)]),  # received
        b"tag-3": None,
    }
    source = described(
        SOURCE,
        address=None,
        durable=UInt(1),
        expiry_policy=Symbol("link-detach"),
        timeout=UInt(5),
        dynamic=False,
        dynamic_node_properties={Symbol("x"): 1},
        distribution_mode=Symbol("move"),
        filter={Symbol("f"): Described(Symbol("x"), "y")},
        default_outcome=described(0x26),
        outcomes=symbol_array(["amqp:accepted:list"]),
        capabilities=symbol_array(["cap"]),
    )
    target = described(
        TARGET,
        address="full",
        durable=UInt(0),
        expiry_policy=Symbol("session-end"),
        timeout=UInt(0),
        dynamic=False,
        dynamic_node_properties=None,
        capabilities=symbol_array(["t"]),
    )
    raw.feed(
        perf(
            ATTACH,
            name="full-attach",
            handle=UInt(0),
            role=False,
            snd_settle_mode=UByte(2),
            rcv_settle_mode=UByte(0),
            source=source,
            target=target,
            unsettled=unsettled,
            incomplete_unsettled=True,
            initial_delivery_count=UInt(7),
            max_message_size=ULong(1 << 20),
            offered_capabilities=symbol_array(["o"]),
            desired_capabilities=symbol_array(["d"]),
            properties={Symbol("p"): UInt(1)},
        )
    )
    ((link, fields),) = rec.of("on_attach")
    assert set(fields["unsettled"]) == {b"tag-1", b"tag-2", b"tag-3"}
    assert fields["unsettled"][b"tag-1"] == Described(ULong(0x24), [])
    assert fields["incomplete_unsettled"] is True
    assert fields["initial_delivery_count"] == 7
    assert fields["source"]["filter"][Symbol("f")] == Described(Symbol("x"), "y")
    assert fields["source"]["default_outcome"] == Described(ULong(0x26), [])
    assert isinstance(fields["offered_capabilities"], Array)
    (attach,) = raw.of(ATTACH)
    assert attach.fields["target"]["address"] == "full"
    assert attach.fields["role"] is True
    # the link is usable: a consumer appears, the producer gets credit, sends delivery-id 0
    consumer = Peer(core)
    rcv = consumer.receiver("full", credit=1)
    pump(consumer)
    flow = raw.collect()[-1]
    assert flow.code == FLOW and flow.fields["link_credit"] > 0
    assert flow.fields["delivery_count"] == 7  # 2.6.7: starts at initial-delivery-count
    raw.feed(transfer_frame(0, 0, b"t", message_bytes("hello")))
    pump(consumer)
    assert [m.body for _, m in receive(rcv)] == ["hello"]


class _WritesUnsettled:
    """A control plane that attaches every link with an unsettled map (as link recovery
    will, 2.6.13), to check the engine writes the fields proton cannot."""

    def __init__(self) -> None:
        self.attached: list[Any] = []

    def on_open(self, conn: Connection, fields: dict[str, Any]) -> None:
        pass

    def on_attach(self, conn: Connection, link: Any, fields: dict[str, Any]) -> None:
        link.attach(
            {
                "source": fields["source"] and Described(ULong(0x28), ["x"]),
                "target": Described(ULong(0x29), []),
                "unsettled": {b"t1": Described(ULong(0x24), []), b"t2": None},
                "incomplete_unsettled": True,
                "offered_capabilities": symbol_array(["resume"]),
                "properties": {Symbol("k"): "v"},
            }
        )
        self.attached.append(link)

    def on_detach(self, *args: Any) -> None:
        pass

    def on_closed(self, conn: Connection) -> None:
        pass


def test_engine_writes_unsettled_and_incomplete_unsettled() -> None:
    """2.7.3 unsettled / incomplete-unsettled are written when the control plane supplies
    them (link resumption, 2.6.13) and proton accepts the frame."""
    router = Router("r-unsettled")
    handler = _WritesUnsettled()
    conn = Connection(router, handler, sasl_mechanisms=())
    import proton

    t = proton.Transport()
    c = proton.Connection()
    c.container = "proton"
    t.bind(c)
    c.open()
    s = c.session()
    s.open()
    r = s.receiver("resuming")
    r.source.address = "x"
    r.open()
    out = bytearray()
    for _ in range(20):
        n = t.pending()
        if n > 0:
            conn.feed(t.peek(n))
            t.pop(n)
        o = conn.take_output()
        out += o
        if o:
            t.push(o)
        if n <= 0 and not o:
            break
    attach = [f for f in parse_output(bytes(out))[1] if f.code == ATTACH][0]
    assert attach.fields["unsettled"] == {b"t1": Described(ULong(0x24), []), b"t2": None}
    assert attach.fields["incomplete_unsettled"] is True
    assert attach.fields["initial_delivery_count"] == 0
    assert r.state & r.REMOTE_ACTIVE
    assert t.condition is None


def test_duplicate_handle_is_handle_in_use(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.3 handle: "... MUST NOT be used for other open links"; 2.8.17 handle-in-use."""
    raw = RawPeer(core)
    raw.feed(attach_frame("a", 0, sender=False, address="dup"))
    raw.feed(attach_frame("b", 0, sender=False, address="dup"))
    assert _ended_or_closed_with(raw) == "amqp:session:handle-in-use"


def _ended_or_closed_with(raw: RawPeer) -> str | None:
    """A session error (2.8.17) ends the session (END) or, more harshly, the connection."""
    for f in raw.frames:
        if f.name in ("end", "close") and f.error():
            return f.error()[0]
    return None


def test_handle_above_handle_max(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.2 handle-max: a handle outside the range is a connection framing-error."""
    raw = RawPeer(core, handshake=False)
    from tests.engine.pump import AMQP_HEADER, begin_frame, open_frame

    raw.feed(AMQP_HEADER + open_frame() + begin_frame(handle_max=UInt(3)))
    raw.feed(attach_frame("a", 4, sender=False))
    assert raw.close_error()[0] == "amqp:connection:framing-error"


def test_attach_without_mandatory_fields(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.3: name, handle and role are mandatory."""
    raw = RawPeer(core)
    raw.feed(perf(ATTACH, name="x", handle=UInt(0)))
    assert raw.close_error()[0] == "amqp:decode-error"


def test_refused_attach_is_attached_then_detached(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.3: a refused link gets an ATTACH with a null terminus, then a DETACH with the
    error; proton sees the link opened and closed with the condition."""
    core = make_core(addresses=[_unavailable("blocked")])
    p = Peer(core)
    rcv = p.receiver("blocked.x", credit=1)
    pump(p)
    assert rcv.remote_source.address is None
    assert rcv.remote_condition.name == "amqp:not-found"
    assert "PN_LINK_REMOTE_CLOSE" in p.events()
    names = [f.name for f in p.frames_from_router()]
    assert names[-2:] == ["attach", "detach"]
    rcv.close()
    pump(p)
    assert not p.conn.closed


def _unavailable(prefix: str) -> Any:
    from qrouter.config import AddressConfig

    return AddressConfig(prefix=prefix, distribution="unavailable")


def test_empty_link_name_is_refused(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    raw.feed(attach_frame("", 0, sender=False, address="q"))
    (detach,) = raw.of(DETACH)
    assert detach.error()[0] == "amqp:invalid-field"


# --- 2.7.6 DETACH ------------------------------------------------------------------------------


def test_detach_closed_with_error(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.7 / 2.6.4: the peer closes a link with an error; the router answers DETACH
    closed=true and tells the control plane the error."""
    p = Peer(core)
    rcv = p.receiver("detach-q", credit=1)
    pump(p)
    rec = Recording(p.conn)
    rcv.condition = Condition("amqp:internal-error", "consumer gave up")
    rcv.close()
    pump(p)
    ((link, closed, err),) = rec.of("on_detach")
    assert closed is True
    assert err["condition"] == "amqp:internal-error"
    detach = p.frames_from_router()[-1]
    assert detach.code == DETACH and detach.fields["closed"] is True
    assert "PN_LINK_REMOTE_CLOSE" in p.events()
    assert core.engine.address("detach-q") is None


def test_detach_without_closing(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.4: detach with closed=false suspends the link; the answer is closed=false too."""
    p = Peer(core)
    snd = p.sender("suspend-q")
    pump(p)
    snd.detach()
    pump(p)
    detach = p.frames_from_router()[-1]
    assert detach.code == DETACH and detach.fields["closed"] is False
    assert "PN_LINK_REMOTE_DETACH" in p.events()


def test_detach_of_unknown_handle(core) -> None:  # type: ignore[no-untyped-def]
    """2.8.17 unattached-handle: a DETACH names a handle that is not attached."""
    raw = RawPeer(core)
    raw.feed(perf(DETACH, handle=UInt(42), closed=True))
    assert _ended_or_closed_with(raw) == "amqp:session:unattached-handle"


def test_handle_reuse_after_detach(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.2: once detached, a handle may carry a new link."""
    raw = RawPeer(core)
    raw.feed(attach_frame("one", 0, sender=False, address="reuse"))
    raw.feed(perf(DETACH, handle=UInt(0), closed=True))
    raw.feed(attach_frame("two", 0, sender=False, address="reuse"))
    assert len(raw.of(ATTACH)) == 2 and raw.close_error() is None


def test_router_detach_then_peer_answer_frees_handle(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.4: the router detaches (error); the peer's DETACH answers it; the handle is free."""
    raw = RawPeer(core)
    raw.feed(attach_frame("", 0, sender=False))  # refused: empty name
    assert raw.of(DETACH)
    raw.feed(perf(DETACH, handle=UInt(0), closed=True))
    raw.feed(attach_frame("again", 0, sender=False, address="x"))
    assert raw.of(ATTACH)[-1].fields["name"] == "again"
    assert raw.close_error() is None


def test_detach_with_error_from_router_reaches_proton(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.7: Link.detach(condition) from the control plane: proton sees the condition."""
    p = Peer(core)
    rcv = p.receiver("kick", credit=1)
    pump(p)
    (link,) = p.conn.links()
    link.detach("amqp:link:stolen", "another attach took it")
    pump(p)
    assert rcv.remote_condition.name == "amqp:link:stolen"
    assert rcv.remote_condition.description == "another attach took it"


# --- 2.7.4 FLOW ----------------------------------------------------------------------------------


def test_link_credit_and_delivery_count(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.7: the producer gets credit (at most the link capacity) once a consumer has
    granted some; the delivery-count advances once per delivery on both links."""
    consumer = Peer(core)
    rcv = consumer.receiver("credit-q", credit=5)
    producer = Peer(core)
    snd = producer.sender("credit-q")
    pump(consumer, producer)
    assert 0 < snd.credit <= core.config.link_capacity
    before = snd.credit
    for i in range(3):
        send(snd, i)
    pump(consumer, producer)
    assert snd.credit == before - 3
    assert len(receive(rcv)) == 3
    assert rcv.credit == 2
    flows = [f for f in producer.frames_from_router() if f.code == FLOW]
    assert flows[-1].fields["delivery_count"] == 0
    assert flows[-1].fields["link_credit"] == before
    transfers = [f for f in consumer.frames_from_router() if f.code == TRANSFER]
    assert [t.fields["delivery_id"] for t in transfers] == [0, 1, 2]
    (out_link,) = consumer.conn.links()
    assert out_link.delivery_count == 3 and out_link.credit == 2
    (in_link,) = producer.conn.links()
    assert in_link.delivery_count == 3


def test_messages_beyond_consumer_credit_wait(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.7: the router never sends a consumer more than its credit; what the producer
    sent beyond it waits in the router and goes out when the consumer grants more."""
    consumer = Peer(core)
    rcv = consumer.receiver("topup", credit=2)
    producer = Peer(core)
    snd = producer.sender("topup")
    pump(consumer, producer)
    for i in range(5):
        send(snd, i)
    pump(consumer, producer)
    assert [m.body for _, m in receive(rcv)] == [0, 1]
    assert core.engine.address("topup").undelivered_count == 3
    rcv.flow(10)
    pump(consumer, producer)
    assert [m.body for _, m in receive(rcv)] == [2, 3, 4]
    assert core.engine.address("topup").undelivered_count == 0


def test_drain_with_no_messages(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.7 drain: with nothing to send the sender uses up the credit by advancing
    delivery-count, and answers with a FLOW (credit 0, drain true)."""
    consumer = Peer(core)
    rcv = consumer.receiver("drain-q")
    pump(consumer)
    rcv.drain(5)
    pump(consumer)
    flow = consumer.frames_from_router()[-1]
    assert flow.code == FLOW
    assert flow.fields["delivery_count"] == 5
    assert flow.fields["link_credit"] == 0
    assert flow.fields["drain"] is True
    assert rcv.credit == 0
    assert rcv.draining() is False


def test_drain_after_some_messages(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.7: drain sends what is available, then consumes the remaining credit."""
    consumer = Peer(core)
    rcv = consumer.receiver("drain2", credit=2)
    producer = Peer(core)
    snd = producer.sender("drain2")
    pump(consumer, producer)
    send(snd, "a")
    pump(consumer, producer)
    rcv.drain(4)  # proton adds 4 to the credit left (1): 5, from delivery-count 1
    pump(consumer, producer)
    assert [m.body for _, m in receive(rcv)] == ["a"]
    assert rcv.credit == 0
    assert consumer.frames_from_router()[-1].fields["delivery_count"] == 6


def test_echo_on_link_flow(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.4 echo: "request state from the partner": the router answers with its link
    state for that handle."""
    raw = RawPeer(core)
    raw.feed(attach_frame("c", 0, sender=False, address="echo-q"))
    frames = raw.feed(flow_frame(handle=0, delivery_count=0, link_credit=3, echo=True))
    (flow,) = [f for f in frames if f.code == FLOW]
    assert flow.fields["handle"] == 0
    assert flow.fields["delivery_count"] == 0
    assert flow.fields["link_credit"] == 3


def test_echo_on_producer_link(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    raw.feed(attach_frame("p", 0, sender=True, address="echo-p"))
    frames = raw.feed(flow_frame(handle=0, delivery_count=0, link_credit=0, echo=True))
    (flow,) = [f for f in frames if f.code == FLOW]
    assert flow.fields["handle"] == 0 and flow.fields["link_credit"] == 0


def test_echo_on_session_flow(core) -> None:  # type: ignore[no-untyped-def]
    raw = RawPeer(core)
    frames = raw.feed(flow_frame(echo=True))
    (flow,) = [f for f in frames if f.code == FLOW]
    assert flow.fields["handle"] is None
    assert flow.fields["next_incoming_id"] == 0


def test_flow_on_unknown_handle(core) -> None:  # type: ignore[no-untyped-def]
    """2.8.17 unattached-handle."""
    raw = RawPeer(core)
    raw.feed(flow_frame(handle=9, delivery_count=0, link_credit=1))
    assert _ended_or_closed_with(raw) == "amqp:session:unattached-handle"


def test_flow_without_incoming_window(core) -> None:  # type: ignore[no-untyped-def]
    """2.7.4: incoming-window is mandatory."""
    raw = RawPeer(core)
    raw.feed(perf(FLOW, next_incoming_id=UInt(0)))
    assert raw.close_error()[0] == "amqp:decode-error"


def test_consumer_may_lower_credit(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.7: the receiver may reduce link-credit at any time; later messages wait."""
    consumer = RawPeer(core)
    consumer.feed(attach_frame("c", 0, sender=False, address="lower"))
    consumer.feed(flow_frame(handle=0, delivery_count=0, link_credit=5))
    consumer.feed(flow_frame(handle=0, delivery_count=0, link_credit=0))
    producer = Peer(core)
    snd = producer.sender("lower")
    pump(producer)
    assert snd.credit == 0
    consumer.feed(flow_frame(handle=0, delivery_count=0, link_credit=1))
    pump(producer)
    assert snd.credit > 0
    send(snd, "x")
    pump(producer)
    consumer.collect()
    assert len(consumer.of(TRANSFER)) == 1


def test_detached_link_ignores_late_flow(core) -> None:  # type: ignore[no-untyped-def]
    """2.6.4: frames for a link the router detached (in flight) are ignored until the
    peer's DETACH arrives."""
    raw = RawPeer(core)
    raw.feed(attach_frame("", 0, sender=False, address="late"))  # refused and detached
    raw.feed(flow_frame(handle=0, delivery_count=0, link_credit=5))
    raw.feed(transfer_frame(0, 0, b"t", b"\x00Sw\xa1\x01x"))
    assert raw.close_error() is None


def test_error_value_helpers_decode() -> None:
    e = error("amqp:x", "d", {Symbol("k"): 1})
    assert e.value[0] == "amqp:x"
