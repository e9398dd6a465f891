"""The client's §2.6.13 reconciliation (qrouter/client_links.py) driven with fake engine
links: what a Sender resends and how, what a Receiver yields, re-sends and forgets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from qrouter._fast.codec import Described, ULong, encode

from qrouter.client_links import Receiver, Sender, _terminus
from qrouter.client_states import ACCEPTED, REJECTED
from qrouter.client_store import ClientStore
from qrouter.message import encode_message
from tests.client.conftest import run

ACC = Described(ULong(0x24), [])
ACC_BYTES = b"\x00\x53\x24\x45"


class FakeDelivery:
    def __init__(self, tag: bytes, resumed: bool = False, presettled: bool = False) -> None:
        self.delivery_tag = tag
        self.resumed = resumed
        self.is_presettled = presettled
        self.is_settled = presettled
        self.remote_state_bytes: bytes | None = None
        self.updates: list[tuple[int, Any, bool]] = []
        self.confirmed = False

    def update(self, code: int, detail: Any = None, settle: bool = True) -> None:
        self.updates.append((code, detail, settle))

    def confirm_settled(self) -> None:
        self.confirmed = True

    def settle(self) -> None:
        self.is_settled = True


class FakeLink:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.credit = 0
        self.detached: list[bool] = []
        self.info: Any = None

    def send(
        self,
        tag: bytes,
        payload: bytes,
        settled: bool = False,
        message_format: int = 0,
        resume: bool = False,
        state: bytes | None = None,
    ) -> FakeDelivery:
        self.sent.append(
            {"tag": tag, "payload": payload, "settled": settled, "resume": resume, "state": state}
        )
        return FakeDelivery(tag)

    def flow(self, credit: int) -> None:
        self.credit = credit

    def detach(self, condition: Any, description: Any, closed: bool) -> None:
        self.detached.append(closed)


class FakeClient:
    def __init__(self, store: ClientStore | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.reattached: list[Any] = []
        self.store = store  # the state file (None: none)

    def _forget(self, link: Any) -> None:
        pass

    def _reattach(self, link: Any) -> None:
        self.reattached.append(link)


def attach(link: Any, unsettled: dict[bytes, Any] | None, incomplete: bool = False) -> FakeLink:
    """Simulate a (re-)attach of `link` and the router's answering ATTACH."""
    engine = FakeLink()
    link.engine = engine
    link.attach_count += 1
    link._on_attach(
        engine,
        {
            "source": {"address": "a"},
            "target": {"address": "a"},
            "unsettled": unsettled,
            "incomplete_unsettled": incomplete,
        },
    )
    return engine


def sender(exactly_once: bool = True) -> Sender:
    return Sender(
        FakeClient(),
        "a",
        "s",
        _terminus("a", 2, "never", 0),  # type: ignore[arg-type]
        exactly_once,
        1000,
    )


def receiver(exactly_once: bool = True) -> Receiver:
    return Receiver(
        FakeClient(),
        "a",
        "r",
        _terminus("a", 2, "never", 0),  # type: ignore[arg-type]
        exactly_once,
        10,
    )


def test_sender_reconciles_each_case() -> None:
    async def main() -> None:
        s = sender()
        fa = s.submit(b"A", b"a")
        fb = s.submit(b"B", b"b")
        fc = s.submit(b"C", b"c")
        assert s.unsettled == 3  # not attached yet: kept, nothing sent
        # the first attach of a link object has a null map; a re-attach carries every tag
        assert s._fields(65536).get("unsettled") is None
        s.attach_count = 1
        fields = s._fields(65536)
        assert fields["unsettled"] == {b"a": None, b"b": None, b"c": None}
        assert fields["rcv_settle_mode"] == 1 and fields["target"].value[0] == "a"
        engine = attach(s, {b"a": ACC, b"b": None, b"x": None})
        sent = {d["tag"]: d for d in engine.sent}
        # terminal at the router: settled, resumed, its state, no payload; outcome resolved
        assert sent[b"a"] == {
            "tag": b"a",
            "payload": b"",
            "settled": True,
            "resume": True,
            "state": ACC_BYTES,
        }
        out = await fa
        assert out.accepted and out.resumed
        # known without outcome: resumed with the full payload
        assert sent[b"b"]["resume"] and sent[b"b"]["payload"] == encode_message_bytes(b"B")
        # unknown to the router: a new delivery, same tag
        assert not sent[b"c"]["resume"] and sent[b"c"]["payload"] == encode_message_bytes(b"C")
        assert b"x" not in sent  # the router's extra tag: nothing to send
        assert [d["tag"] for d in engine.sent] == [b"a", b"b", b"c"]  # in order
        # an outcome for the resent delivery resolves it; the sender settles it
        d = s._records[b"c"].delivery
        d.remote_state_bytes = encode(
            Described(ULong(REJECTED), [Described(ULong(0x1D), ["app:no", "nope"])])
        )
        s._on_outcome(d, REJECTED, False)
        out = await fc
        assert (out.state, out.condition, out.description) == ("rejected", "app:no", "nope")
        assert d.is_settled
        assert not fb.done() and s.unsettled_tags() == [b"b"]

    run(main())


def encode_message_bytes(body: bytes) -> bytes:
    from qrouter.message import Message

    return encode_message(Message(body=body))


def test_sender_new_sends_after_attach_go_straight_out() -> None:
    async def main() -> None:
        s = sender()
        engine = attach(s, None)
        s.submit(b"N", b"n")
        assert engine.sent[0]["tag"] == b"n" and not engine.sent[0]["resume"]
        # the connection drops: the record stays, the delivery is forgotten
        s._connection_lost()
        assert s._records[b"n"].delivery is None and not s.attached
        engine2 = attach(s, {})
        assert engine2.sent[0]["tag"] == b"n" and not engine2.sent[0]["resume"]

    run(main())


def test_sender_with_incomplete_router_map() -> None:
    """2.6.13: absence from an incomplete map proves nothing and new deliveries must wait;
    once the resumed ones settle the link is suspended and re-attached."""

    async def main() -> None:
        s = sender()
        fa = s.submit(b"A", b"a")
        engine = attach(s, {}, incomplete=True)
        assert engine.sent[0]["resume"] is True
        s.submit(b"N", b"n")
        assert len(engine.sent) == 1  # held
        d = s._records[b"a"].delivery
        d.remote_state_bytes = ACC_BYTES
        s._on_outcome(d, ACCEPTED, True)
        assert (await fa).accepted
        assert engine.detached == [False] and s.client.reattached == [s]  # type: ignore[attr-defined]

    run(main())


def test_unsettled_map_is_capped_by_frame_size() -> None:
    async def main() -> None:
        s = sender()
        for i in range(200):
            s.submit(b"x", i.to_bytes(16, "big"))
        s.attach_count = 1
        fields = s._fields(2048)
        assert fields["incomplete_unsettled"] is True
        assert 0 < len(fields["unsettled"]) < 200
        assert len(encode(fields["unsettled"])) < 2048

    run(main())


def test_receiver_exactly_once_resume() -> None:
    async def main() -> None:
        r = receiver(exactly_once=True)
        engine = attach(r, None)
        assert engine.credit == 10
        d1 = FakeDelivery(b"t1")
        r._on_message(d1, encode_message_bytes(b"one"))
        d2 = FakeDelivery(b"t2")
        r._on_message(d2, encode_message_bytes(b"two"))
        got1 = await r.receive(timeout=1)
        assert got1 is not None and got1.message.body == b"one"
        await got1.accept()
        assert d1.updates == [(ACCEPTED, None, False)]  # unsettled: exactly-once
        # the connection drops before the router settles t1; t2 was never yielded
        r._connection_lost()
        assert r._fields(65536)["unsettled"] == {b"t1": ACC, b"t2": None}
        engine = attach(r, {b"t1": None, b"t2": None})
        # the router resumes t1: not yielded again; our state goes out again
        d1b = FakeDelivery(b"t1", resumed=True)
        r._on_message(d1b, encode_message_bytes(b"one"))
        assert d1b.updates == [(ACCEPTED, None, False)]
        assert r.n_duplicates == 1
        # t2 resumed: already queued, not yielded twice; it is yielded once, disposed on d2b
        d2b = FakeDelivery(b"t2", resumed=True)
        r._on_message(d2b, encode_message_bytes(b"two"))
        got2 = await r.receive(timeout=1)
        assert got2 is not None and got2.message.body == b"two"
        assert r._queue.empty()
        await got2.accept()
        assert d2b.updates == [(ACCEPTED, None, False)] and d2.updates == []
        # the router settles: both records go
        r._on_settled(d1b)
        r._on_settled(d2b)
        assert r.unsettled == 0 and got1.settled and got2.settled
        # and settles in return, so the router knows it will not report them again
        assert d1b.confirmed and d2b.confirmed

    run(main())


def test_receiver_forgets_what_the_router_lacks() -> None:
    async def main() -> None:
        r = receiver(exactly_once=True)
        attach(r, None)
        r._on_message(FakeDelivery(b"t1"), encode_message_bytes(b"1"))
        got = await r.receive(timeout=1)
        assert got is not None
        await got.accept()
        r._connection_lost()
        attach(r, {})  # complete and empty: the router settled t1
        assert r.unsettled == 0 and got.settled
        # a new delivery may reuse the tag now
        r._on_message(FakeDelivery(b"t1"), encode_message_bytes(b"new"))
        again = await r.receive(timeout=1)
        assert again is not None and again.message.body == b"new"

    run(main())


def test_receiver_resumed_settled_and_unknown() -> None:
    async def main() -> None:
        r = receiver(exactly_once=True)
        attach(r, None)
        r._on_message(FakeDelivery(b"k"), encode_message_bytes(b"k"))
        got = await r.receive(timeout=1)
        assert got is not None
        await got.accept()
        r._connection_lost()
        attach(r, {b"k": ACC})
        # the router resends k settled with its terminal state: finished, not yielded
        r._on_message(FakeDelivery(b"k", resumed=True, presettled=True), b"")
        assert r.unsettled == 0 and r._queue.empty()
        # an unknown resumed delivery that is settled / empty is ignored
        r._on_message(FakeDelivery(b"u", resumed=True, presettled=True), b"")
        r._on_message(FakeDelivery(b"v", resumed=True), b"")
        assert r._queue.empty()
        # an unknown resumed delivery with a message is yielded (never seen here)
        r._on_message(FakeDelivery(b"w", resumed=True), encode_message_bytes(b"w"))
        got = await r.receive(timeout=1)
        assert got is not None and got.resumed and got.message.body == b"w"

    run(main())


def test_receiver_at_least_once_settles_on_accept() -> None:
    async def main() -> None:
        r = receiver(exactly_once=False)
        attach(r, None)
        d = FakeDelivery(b"t")
        r._on_message(d, encode_message_bytes(b"x"))
        got = await r.receive(timeout=1)
        assert got is not None
        await got.reject("app:bad", "why")
        assert d.updates[0][0] == REJECTED and d.updates[0][2] is True
        assert r.unsettled == 0
        # a disposition while detached is kept for the unsettled map
        d2 = FakeDelivery(b"t2")
        r._on_message(d2, encode_message_bytes(b"y"))
        got2 = await r.receive(timeout=1)
        assert got2 is not None
        r._connection_lost()
        await got2.release()
        assert r._fields(65536)["unsettled"] == {b"t2": Described(ULong(0x26), [])}
        attach(r, {b"t2": None})
        d2b = FakeDelivery(b"t2", resumed=True)
        r._on_message(d2b, b"")
        assert d2b.updates == [(0x26, None, True)] and r.unsettled == 0

    run(main())


def test_state_file_restores_both_maps(tmp_path: Path) -> None:
    """A restarted application (new Client objects, same state file) presents the stored
    maps in its first ATTACH and resumes (qrouter/client_store.py)."""
    path = str(tmp_path / "state")

    async def first_run() -> None:
        store = ClientStore(path)
        s = Sender(FakeClient(store), "a", "s", _terminus("a", 2, "never", 0), True, 10)
        assert s._fields(65536)["unsettled"] == {}  # it knows: nothing unsettled
        attach(s, None)
        s.submit(b"A")
        s.submit(b"B")
        s._on_outcome(*_accepted(s, 0))  # the first gets its outcome: forgotten
        r = Receiver(FakeClient(store), "a", "r", _terminus("a", 2, "never", 0), True, 10)
        attach(r, None)
        for tag in (b"t1", b"t2", b"t3"):
            r._on_message(FakeDelivery(tag), encode_message_bytes(tag))
        got = await r.receive(timeout=1)
        assert got is not None
        await got.accept()  # t1 accepted; t2 yielded, no state; t3 never yielded
        await r.receive(timeout=1)
        store.close()  # (the crash: nothing else is written)

    async def second_run() -> None:
        store = ClientStore(path)
        s = Sender(FakeClient(store), "a", "s", _terminus("a", 2, "never", 0), True, 10)
        assert s.submitted == 2 and list(s.recovered) == [s._prefix + (2).to_bytes(8, "big")]
        tag_b = list(s.recovered)[0]
        assert s._fields(65536)["unsettled"] == {tag_b: None}
        engine = attach(s, {tag_b: ACC})
        assert engine.sent[0]["tag"] == tag_b and engine.sent[0]["settled"]
        assert (await s.recovered[tag_b]).accepted and s.unsettled == 0
        r = Receiver(FakeClient(store), "a", "r", _terminus("a", 2, "never", 0), True, 10)
        assert r._fields(65536)["unsettled"] == {b"t1": ACC, b"t2": None, b"t3": None}
        attach(r, {b"t1": None, b"t2": None, b"t3": None})
        d1, d2, d3 = (FakeDelivery(t, resumed=True) for t in (b"t1", b"t2", b"t3"))
        r._on_message(d1, encode_message_bytes(b"t1"))
        assert d1.updates == [(ACCEPTED, None, False)]  # accepted before: not yielded again
        r._on_message(d2, encode_message_bytes(b"t2"))
        r._on_message(d3, encode_message_bytes(b"t3"))
        got = [await r.receive(timeout=1) for _ in range(2)]
        assert [(g.tag, g.redelivered) for g in got if g is not None] == [
            (b"t2", True),
            (b"t3", True),
        ]
        assert r._queue.empty()
        store.close()

    run(first_run())
    run(second_run())


def _accepted(s: Sender, i: int) -> tuple[Any, int, bool]:
    """The engine delivery of the i-th sent transfer, with ACCEPTED (settled) from the router."""
    engine = s.engine
    tag = engine.sent[i]["tag"]
    d = FakeDelivery(tag)
    s._records[tag].delivery = d
    d.remote_state_bytes = ACC_BYTES
    return d, ACCEPTED, True
