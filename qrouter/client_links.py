"""Senders and receivers of the client API (qrouter/client.py), and how they resume.

Resumption (AMQP 1.0 §2.6.13) — the decisions
===============================================

Both link kinds keep a record per unsettled delivery-tag, independent of any connection, and
present them as the ATTACH's ``unsettled`` map (tag -> last known state, or null) every time
the link is re-attached (after a reconnect). The first attach of a link object sends a null
map. When a map would not fit in the router's max-frame-size, the oldest entries that fit are
sent with ``incomplete-unsettled`` = true.

On the router's answering ATTACH (its own unsettled map) the link reconciles:

Sender (we send; the router's target is the terminus):

* the router holds the tag with a terminal state -> the outcome is known: we resend the
  delivery settled, ``resume`` = true, carrying that state and no payload, and resolve the
  sender's Outcome from it (``Outcome.resumed`` is true);
* the router holds the tag with null / a non-terminal state -> resend with ``resume`` = true
  and the full payload (the router may have lost part or all of it);
* the router lacks the tag -> it never received it (with exactly-once the router never
  settles first; at-least-once may duplicate here, as it allows) -> resend it as a new
  delivery with the same tag (``resume`` = false: §2.7.5 says a receiver ignores a resumed
  delivery it does not know). When the router's map was *incomplete*, absence proves nothing
  and §2.6.13 forbids new deliveries: such tags are resent with ``resume`` = true, new sends
  wait, and once every resumed delivery is settled the link is suspended and re-attached to
  exchange complete maps again;
* tags the router holds that we lack -> we settled them: nothing is sent, the router drops
  them.

Every delivery is sent unsettled; on a terminal outcome the sender settles it (at once:
for exactly-once, §3.8.3, that settlement is what lets the receiver settle) and the Outcome
future resolves. A settlement without a terminal state counts as accepted (the router's
own rule for a consumer that settles without an outcome).

Receiver (the router sends; its source is the terminus):

* every delivery-tag it yields is remembered (with the application's state, once given) until
  the delivery is settled at both ends: at once after accept/reject/... for at-least-once
  (rcv-settle-mode first), or when the router settles for exactly-once (rcv-settle-mode
  second: the disposition is sent unsettled and the receiver settles after the sender);
* a transfer whose tag is remembered is never yielded again (resumed or not): if the
  application already gave a state, that state is sent again (settling unless exactly-once);
  a resumed transfer the router sent settled is finished: the record is dropped;
* tags we remember that the router's map lacks (complete map) -> the router has settled or
  forgotten them -> records dropped (a queued, not yet yielded message is still yielded once,
  its disposition then goes nowhere);
* a resumed transfer for a tag we never knew: §2.7.5 says to ignore it. Our map is always
  complete in our own records, so such a tag was never seen: when it carries a message and is
  unsettled we yield it as new rather than lose it; a settled or empty one is ignored.

The receiver keeps ``credit`` messages in flight or queued: credit is topped up as the
application takes messages.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qrouter._fast.codec import Described, Symbol, UInt, encode
from qrouter._fast.engine import error_value, source_value, target_value
from qrouter.client_states import (
    ACCEPTED,
    MODIFIED,
    REJECTED,
    RELEASED,
    ClientClosed,
    LinkDetached,
    Outcome,
    make_state,
    outcome_of,
    state_code,
    state_from_bytes,
    state_to_bytes,
)
from qrouter.message import Message, decode_message, encode_message

if TYPE_CHECKING:
    from qrouter.client import Client

log = logging.getLogger("qrouter.client")

EXPIRY_POLICIES = ("link-detach", "session-end", "connection-close", "never")
# room in a frame for the rest of an ATTACH besides the unsettled map
ATTACH_OVERHEAD = 1024


def _terminus(address: str | None, durable: int, expiry: str, timeout: int) -> dict[str, Any]:
    if expiry not in EXPIRY_POLICIES:
        raise ValueError(f"expiry_policy must be one of {EXPIRY_POLICIES}")
    if durable not in (0, 1, 2):
        raise ValueError("durable is 0 (none), 1 (configuration) or 2 (unsettled-state)")
    return {
        "address": address,
        "durable": UInt(durable),
        "expiry_policy": Symbol(expiry),
        "timeout": UInt(int(timeout)),
    }


def _error_parts(error: Any) -> tuple[str | None, str | None]:
    if isinstance(error, dict):
        cond = error.get("condition")
        desc = error.get("description")
        return (str(cond) if cond is not None else None, str(desc) if desc is not None else None)
    return (None, None)


class _Link:
    """What senders and receivers share: attach / re-attach with the unsettled map, detach."""

    sender = False

    def __init__(
        self,
        client: Client,
        address: str,
        name: str,
        terminus: dict[str, Any],
        exactly_once: bool,
    ) -> None:
        self.client = client
        self.address = address
        self.name = name
        self.exactly_once = exactly_once
        self._terminus = terminus
        self.engine: Any = None  # the engine Link of the current attachment
        self.ready = False  # the router's ATTACH arrived and we reconciled
        self.closed = False
        self.error: BaseException | None = None
        self.attach_count = 0
        self.remote_terminus: dict[str, Any] | None = None
        self._first: asyncio.Future[None] = client.loop.create_future()
        # the client's state file keeps the unsettled map of a link with durable unsettled
        # state (qrouter/client_store.py). With it the first attach presents the map too (may
        # be empty): we know what is unsettled even after a restart (2.6.13)
        durable = int(terminus.get("durable") or 0)
        self._store = client.store if durable == 2 else None
        self._restored = self._store is not None

    # --- records (subclasses) --------------------------------------------------------------

    def _unsettled_items(self) -> list[tuple[bytes, Described | None]]:
        raise NotImplementedError

    def _reconcile(self, peer: dict[bytes, Any], incomplete: bool) -> None:
        raise NotImplementedError

    def _lost(self) -> None:
        raise NotImplementedError

    def _failed(self, exc: BaseException) -> None:
        raise NotImplementedError

    def _unstore(self) -> None:
        """Forget the link's stored records: it was closed for good."""

    # --- attach ----------------------------------------------------------------------------

    def _fields(self, max_frame: int) -> dict[str, Any]:
        local = target_value if self.sender else source_value
        remote = source_value if self.sender else target_value
        fields: dict[str, Any] = {
            "snd_settle_mode": 0,  # unsettled: every delivery gets an outcome
            "rcv_settle_mode": 1 if self.exactly_once else 0,
            "source" if not self.sender else "target": local(self._terminus),
            "target" if not self.sender else "source": remote({}),
        }
        if self.attach_count or self._restored:
            umap: dict[bytes, Any] = {}
            room = max_frame - ATTACH_OVERHEAD
            size = 8
            incomplete = False
            for tag, state in self._unsettled_items():
                n = len(encode(tag)) + (1 if state is None else len(encode(state)))
                if size + n > room:
                    incomplete = True
                    break
                umap[tag] = state
                size += n
            fields["unsettled"] = umap
            if incomplete:
                fields["incomplete_unsettled"] = True
        return fields

    def _attach(self, session: Any, max_frame: int) -> None:
        """Attach (or re-attach, presenting our unsettled map) on a new session."""
        if self.closed:
            return
        fields = self._fields(max_frame)
        self.ready = False
        self.engine = session.attach(self.name, self.sender, fields)
        self.engine.bind_endpoint()
        self.engine.info = self
        self.attach_count += 1

    def _on_attach(self, link: Any, fields: dict[str, Any]) -> None:
        if link is not self.engine:
            return
        terminus = fields.get("target" if self.sender else "source")
        if terminus is None:
            return  # refused: the router's DETACH with the error follows (2.6.3)
        self.remote_terminus = terminus
        peer = fields.get("unsettled") or {}
        if not isinstance(peer, dict):
            peer = {}
        peer = {bytes(k): v for k, v in peer.items() if isinstance(k, bytes | bytearray)}
        self._reconcile(peer, bool(fields.get("incomplete_unsettled")))
        self.ready = True
        if not self._first.done():
            self._first.set_result(None)

    def _on_detach(self, link: Any, closed: bool, error: Any) -> None:
        if link is not self.engine:
            return
        cond, desc = _error_parts(error)
        self.engine = None
        self.ready = False
        if cond is None and not closed:
            # the router suspended the link without an error: attach again at once
            log.info("link %r suspended by the router; re-attaching", self.name)
            self.client._reattach(self)
            return
        self._fail(LinkDetached(cond or "amqp:link:detach-forced", desc or "detached by router"))

    def _connection_lost(self) -> None:
        self.engine = None
        self.ready = False
        self._lost()

    def _fail(self, exc: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        self.error = exc
        self.client._forget(self)
        if not self._first.done():
            self._first.set_exception(exc)
            self._first.exception()  # (retrieved: a refused attach is raised by sender())
        self._failed(exc)

    async def _wait_attached(self, timeout: float | None) -> None:
        await asyncio.wait_for(asyncio.shield(self._first), timeout)

    async def close(self, suspend: bool = False) -> None:
        """Detach the link: closed (the router discards its terminus) or, with `suspend`,
        kept at the router (durable termini) for a later attach with the same name."""
        if self.closed:
            return
        if self.engine is not None:
            self.engine.detach(None, None, not suspend)
            self.engine = None
        if not suspend:
            self._unstore()
        self._fail(ClientClosed(f"link {self.name!r} closed"))
        await asyncio.sleep(0)

    @property
    def attached(self) -> bool:
        return self.ready and self.engine is not None


# --- sender ----------------------------------------------------------------------------------


@dataclass
class _Out:
    tag: bytes
    payload: bytes
    future: asyncio.Future[Outcome]
    delivery: Any = None  # the engine Delivery of the current attachment
    state: Described | None = None  # the router's last non-terminal state
    resumed: bool = False  # resent with resume=true after the router's incomplete map


class Sender(_Link):
    """Sends messages to an address; `await send(msg)` returns the Outcome."""

    sender = True

    def __init__(
        self,
        client: Client,
        address: str,
        name: str,
        terminus: dict[str, Any],
        exactly_once: bool,
        max_in_flight: int,
    ) -> None:
        super().__init__(client, address, name, terminus, exactly_once)
        self.max_in_flight = max_in_flight
        self._records: dict[bytes, _Out] = {}
        self._prefix = secrets.token_bytes(4)
        self._counter = 0
        self._space = asyncio.Event()
        self._space.set()
        self._hold_new = False  # the router's map was incomplete: only resumed sends
        # deliveries of an earlier run restored from the state file: tag -> their Outcome
        self.recovered: dict[bytes, asyncio.Future[Outcome]] = {}
        if self._store is not None:
            counter = self._store.sender_counter(name)
            if counter is not None:
                self._prefix, self._counter = counter
            for tag, state, payload in self._store.sent(name):
                rec = _Out(tag, payload, client.loop.create_future(), state=state_from_bytes(state))
                self._records[tag] = rec
                self.recovered[tag] = rec.future

    @property
    def unsettled(self) -> int:
        """Deliveries sent (or waiting to be) whose outcome is not yet known."""
        return len(self._records)

    def unsettled_tags(self) -> list[bytes]:
        return list(self._records)

    @property
    def submitted(self) -> int:
        """Messages submitted on this link so far; with a state file, across restarts of the
        application (stored with each delivery, so a crash cannot lose one without the
        other)."""
        return self._counter

    def _next_tag(self) -> bytes:
        return self._prefix + (self._counter + 1).to_bytes(8, "big")

    async def send(self, msg: Message | bytes, tag: bytes | None = None) -> Outcome:
        """Send one message (bytes: the body, as one data section) and wait for its outcome.
        Survives reconnects: the delivery is resumed or resent as §2.6.13 says."""
        while not self._space.is_set():
            await self._space.wait()
        return await self.submit(msg, tag)

    def submit(self, msg: Message | bytes, tag: bytes | None = None) -> asyncio.Future[Outcome]:
        """Send without waiting: the future resolves with the Outcome. Ignores the in-flight
        limit (send() honours it)."""
        if self.closed:
            raise self.error or ClientClosed("sender closed")
        payload = encode_message(msg if isinstance(msg, Message) else Message(body=bytes(msg)))
        if tag is None:
            tag = self._next_tag()
        elif not isinstance(tag, bytes) or not 0 < len(tag) <= 32:
            raise ValueError("a delivery-tag is 1 to 32 bytes (2.8.7)")
        if tag in self._records:
            raise ValueError(f"delivery-tag {tag!r} is already unsettled on this link")
        rec = _Out(tag, payload, self.client.loop.create_future())
        self._counter += 1
        if self._store is not None:
            # durable before the transfer goes out (2.6.13: what we present on re-attach)
            self._store.put_sent(self.name, tag, None, payload, (self._prefix, self._counter))
        self._records[tag] = rec
        if len(self._records) >= self.max_in_flight:
            self._space.clear()
        if self.attached and not self._hold_new:
            rec.delivery = self.engine.send(tag, payload)
        return rec.future

    def _unsettled_items(self) -> list[tuple[bytes, Described | None]]:
        return [(r.tag, r.state) for r in self._records.values()]

    def _finish(self, rec: _Out, outcome: Outcome) -> None:
        if self._records.get(rec.tag) is rec:
            del self._records[rec.tag]
            if self._store is not None:
                self._store.forget_sent(self.name, rec.tag)
        if not rec.future.done():
            rec.future.set_result(outcome)
        if len(self._records) < self.max_in_flight:
            self._space.set()
        if self._hold_new and not any(r.resumed for r in self._records.values()):
            # every resumed delivery is settled: exchange complete maps (2.6.13)
            self._hold_new = False
            if self.engine is not None:
                self.engine.detach(None, None, False)
                self.engine = None
                self.ready = False
                self.client._reattach(self)

    def _reconcile(self, peer: dict[bytes, Any], incomplete: bool) -> None:
        link = self.engine
        self._hold_new = incomplete
        for rec in list(self._records.values()):
            rec.resumed = False
            state = peer.get(rec.tag)  # None: absent, or held with no state
            outcome = outcome_of(state, resumed=True)
            if outcome is not None:  # a terminal state: the outcome is known
                link.send(rec.tag, b"", settled=True, resume=True, state=encode(state))
                self._finish(rec, outcome)
            elif rec.tag in peer or incomplete:
                rec.delivery = link.send(rec.tag, rec.payload, resume=True)
                rec.resumed = True
            else:
                rec.delivery = link.send(rec.tag, rec.payload)
        if incomplete and not any(r.resumed for r in self._records.values()):
            self._hold_new = False

    def _on_outcome(self, d: Any, code: int, settled: bool) -> None:
        rec = self._records.get(d.delivery_tag)
        if rec is None or rec.delivery is not d:
            return
        state = state_from_bytes(d.remote_state_bytes)
        outcome = outcome_of(state)
        if outcome is None:
            if not settled:
                rec.state = state  # e.g. received (3.4.1): kept for the unsettled map
                return
            outcome = Outcome("accepted")  # settled without an outcome
        if not d.is_settled:
            d.settle()
        self._finish(rec, outcome)

    def _lost(self) -> None:
        for rec in self._records.values():
            rec.delivery = None

    def _unstore(self) -> None:
        if self._store is not None:
            for tag in list(self._records):
                self._store.forget_sent(self.name, tag)

    def _failed(self, exc: BaseException) -> None:
        records = list(self._records.values())
        self._records.clear()
        for rec in records:
            if not rec.future.done():
                rec.future.set_exception(exc)
                if isinstance(exc, ClientClosed):
                    rec.future.exception()  # closing with sends outstanding is no error
        self._space.set()


# --- receiver --------------------------------------------------------------------------------


@dataclass
class _In:
    tag: bytes
    delivery: Any  # the engine Delivery of the current attachment, or None
    state: Described | None = None  # the application's state, once given
    orphan: bool = False  # the router forgot it: a disposition goes nowhere
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    restored: bool = False  # from the state file, not yet yielded in this run


@dataclass
class Received:
    """One message a Receiver yielded; dispose of it with accept/reject/release/modify."""

    payload: bytes
    tag: bytes
    resumed: bool
    receiver: Receiver
    _rec: _In
    _message: Message | None = None
    # received before the application restarted, which gave no state for it then: it may
    # have processed it (it did not accept it); see docs/client.md, "Durable client state"
    redelivered: bool = False

    @property
    def message(self) -> Message:
        if self._message is None:
            self._message = decode_message(self.payload)
        return self._message

    @property
    def settled(self) -> bool:
        return self._rec.settled.is_set()

    async def wait_settled(self, timeout: float | None = None) -> None:
        """Wait until the delivery is settled at both ends (exactly-once: the router settled
        after our accept)."""
        await asyncio.wait_for(self._rec.settled.wait(), timeout)

    async def accept(self) -> None:
        self.receiver._dispose(self._rec, ACCEPTED, None)

    async def reject(
        self, condition: str = "amqp:internal-error", description: str | None = None
    ) -> None:
        self.receiver._dispose(self._rec, REJECTED, error_value(condition, description))

    async def release(self) -> None:
        self.receiver._dispose(self._rec, RELEASED, None)

    async def modify(self, delivery_failed: bool = True, undeliverable_here: bool = False) -> None:
        self.receiver._dispose(self._rec, MODIFIED, (delivery_failed, undeliverable_here))


class Receiver(_Link):
    """Receives from an address: ``async for received in receiver``."""

    def __init__(
        self,
        client: Client,
        address: str,
        name: str,
        terminus: dict[str, Any],
        exactly_once: bool,
        credit: int,
    ) -> None:
        super().__init__(client, address, name, terminus, exactly_once)
        if credit < 1:
            raise ValueError("credit must be at least 1")
        self.credit = credit
        self._records: dict[bytes, _In] = {}
        self._queue: asyncio.Queue[Received | None] = asyncio.Queue()
        self.n_duplicates = 0  # transfers of a tag already yielded (not yielded again)
        if self._store is not None:
            for tag, state in self._store.received(name):
                self._records[tag] = _In(tag, None, state_from_bytes(state), restored=True)

    @property
    def unsettled(self) -> int:
        return len(self._records)

    def unsettled_tags(self) -> list[bytes]:
        return list(self._records)

    def __aiter__(self) -> AsyncIterator[Received]:
        return self

    async def __anext__(self) -> Received:
        item = await self.receive()
        if item is None:
            raise StopAsyncIteration
        return item

    async def receive(self, timeout: float | None = None) -> Received | None:
        """The next message; None once the receiver is closed; raises the link's error
        (LinkDetached, ConnectError) when it failed. TimeoutError after `timeout` seconds."""
        if self._queue.empty() and self.closed:
            if self.error is not None and not isinstance(self.error, ClientClosed):
                raise self.error
            return None
        item = await asyncio.wait_for(self._queue.get(), timeout)
        if item is None:
            self._queue.put_nowait(None)  # stays closed for later calls
            if self.error is not None and not isinstance(self.error, ClientClosed):
                raise self.error
            return None
        self._top_up()
        return item

    def _top_up(self) -> None:
        link = self.engine
        if link is None or not self.ready:
            return
        want = self.credit - self._queue.qsize()
        if link.credit + self._queue.qsize() <= self.credit // 2 and want > 0:
            link.flow(want)

    def _unsettled_items(self) -> list[tuple[bytes, Described | None]]:
        return [(r.tag, r.state) for r in self._records.values() if not r.orphan]

    def _reconcile(self, peer: dict[bytes, Any], incomplete: bool) -> None:
        if not incomplete:
            for rec in list(self._records.values()):
                if rec.tag not in peer:
                    self._drop(rec)
        self.engine.flow(max(1, self.credit - self._queue.qsize()))

    def _drop(self, rec: _In) -> None:
        if self._records.get(rec.tag) is rec:
            del self._records[rec.tag]
            if self._store is not None:
                self._store.forget_received(self.name, rec.tag)
        rec.orphan = True
        rec.settled.set()

    def _on_message(self, d: Any, payload: bytes) -> None:
        tag = d.delivery_tag
        rec = self._records.get(tag)
        if rec is not None and rec.restored and rec.state is None and payload:
            # received in an earlier run (perhaps yielded) that crashed before the application
            # gave a state: yield it again, flagged
            rec.restored = False
            rec.delivery = d
            if d.is_presettled:
                self._drop(rec)
            self._queue.put_nowait(Received(payload, tag, True, self, rec, redelivered=True))
        elif rec is not None:
            rec.restored = False
            self.n_duplicates += 1
            rec.delivery = d
            if d.is_presettled:
                self._drop(rec)  # the sender settled it: finished
            elif rec.state is not None:
                self._send_state(rec)
        elif d.resumed and (d.is_presettled or not payload):
            log.debug("link %r: ignoring resumed delivery %r we do not know", self.name, tag)
        else:
            rec = _In(tag, d)
            if d.is_presettled:
                rec.orphan = True
                rec.settled.set()
            else:
                self._records[tag] = rec
                if self._store is not None:
                    self._store.put_received(self.name, tag, None)
            self._queue.put_nowait(Received(payload, tag, bool(d.resumed), self, rec))
        self._top_up()

    def _on_settled(self, d: Any) -> None:
        rec = self._records.get(d.delivery_tag)
        if rec is not None and rec.delivery is d:
            self._drop(rec)
        if self.exactly_once:
            # settle in return: the record is gone, and the router (a guaranteed topic's)
            # learns that we will not report this tag again (docs/exactly-once.md, decision 7)
            d.confirm_settled()

    def _dispose(self, rec: _In, code: int, detail: Any) -> None:
        if rec.orphan or state_code(rec.state) in (ACCEPTED, REJECTED, RELEASED, MODIFIED):
            return
        rec.state = make_state(code, detail)
        if self._store is not None and not rec.orphan and self._records.get(rec.tag) is rec:
            # durable before the disposition goes out: never yielded again after a crash
            self._store.put_received(self.name, rec.tag, state_to_bytes(rec.state))
        if rec.delivery is not None and self.attached:
            self._send_state(rec)

    def _send_state(self, rec: _In) -> None:
        assert rec.state is not None and rec.delivery is not None
        code = state_code(rec.state)
        fields = rec.state.value if isinstance(rec.state.value, list) else []
        detail: Any = None
        if code == REJECTED and fields:
            detail = fields[0]
        elif code == MODIFIED:
            detail = tuple(fields[:2]) if len(fields) >= 2 else (True, False)
        rec.delivery.update(code, detail, settle=not self.exactly_once)
        if not self.exactly_once:
            self._drop(rec)

    def _lost(self) -> None:
        for rec in self._records.values():
            rec.delivery = None

    def _unstore(self) -> None:
        if self._store is not None:
            for tag in list(self._records):
                self._store.forget_received(self.name, tag)

    def _failed(self, exc: BaseException) -> None:
        self._queue.put_nowait(None)


__all__ = ["Received", "Receiver", "Sender", "state_to_bytes"]
