"""The anonymous relay and addresses that cannot be reached.

* A sender with a null target (AMQP 1.0 §3.5.4: the target is given per
  message by the `to` property) reaches consumers on different addresses.
* A message the router cannot route — no `to` on an anonymous link, or a
  `to` on an address configured `unavailable` — is REJECTED with an error
  condition (§3.4.2), never silently dropped or left unsettled.
"""

from __future__ import annotations

from typing import Any

from proton import LinkException, Message, Timeout
from proton.utils import LinkDetached

from tests.clients import Handler, outcome_name, run_container

ADDRESSES = {"closed": "unavailable"}


class Relay(Handler):
    def __init__(self, url: str) -> None:
        super().__init__(prefetch=10)
        self.url = url
        self.opened = 0
        self.sender: Any = None
        self.sent = False
        self.got: dict[str, list[str]] = {"relay/a": [], "relay/b": []}
        self.accepted = 0

    def progress(self) -> str:
        return f"got={self.got} accepted={self.accepted}"

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        for addr in self.got:
            event.container.create_receiver(conn, addr, name=f"rcv-{addr}")

    def on_link_opened(self, event: Any) -> None:
        if event.receiver:
            self.opened += 1
            if self.opened == 2:
                conn = self.connect(event.container, self.url)
                self.sender = event.container.create_sender(conn, None, name="relay-sender")
        elif event.sender:
            # §3.5.4: a null target stays null in the router's ATTACH
            assert event.sender.remote_target.address is None

    def on_sendable(self, event: Any) -> None:
        if self.sent:
            return
        self.sent = True
        for i in range(6):
            addr = "relay/a" if i % 2 == 0 else "relay/b"
            event.sender.send(Message(address=addr, body=f"{addr}#{i}"))

    def on_message(self, event: Any) -> None:
        self.got[event.receiver.remote_source.address].append(event.message.body)

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == 6:
            self.done()

    def on_rejected(self, event: Any) -> None:
        self.fail(f"rejected: {event.delivery.remote.condition}")


def test_anonymous_relay_routes_by_to(router: Any) -> None:
    r = router()
    h = run_container(Relay(r.url), timeout=20)
    assert h.got == {
        "relay/a": ["relay/a#0", "relay/a#2", "relay/a#4"],
        "relay/b": ["relay/b#1", "relay/b#3", "relay/b#5"],
    }


def _send_anonymous(blocking: Any, url: str, msg: Message) -> Any:
    conn = blocking(url)
    sender = conn.create_sender(None)
    conn.wait(lambda: sender.link.credit > 0, timeout=10, msg="credit on the anonymous link")
    d = sender.link.send(msg)
    conn.wait(
        lambda: d.settled or d.remote_state != 0, timeout=10, msg="outcome of an unroutable message"
    )
    return d


def test_relay_without_to_is_rejected(router: Any, blocking: Any) -> None:
    r = router()
    d = _send_anonymous(blocking, r.url, Message(body="nowhere"))
    assert outcome_name(d.remote_state) == "REJECTED"
    cond = d.remote.condition
    assert cond is not None and cond.name, "REJECTED without an error condition"


def test_relay_to_unavailable_address_is_rejected(router: Any, blocking: Any) -> None:
    r = router(addresses=ADDRESSES)
    d = _send_anonymous(blocking, r.url, Message(address="closed/x", body="blocked"))
    assert outcome_name(d.remote_state) == "REJECTED"
    cond = d.remote.condition
    assert cond is not None and cond.name, "REJECTED without an error condition"


def test_sender_to_unavailable_address(router: Any, blocking: Any) -> None:
    """Attaching to an `unavailable` address: the router either refuses the
    link (ATTACH with a null target then DETACH with an error condition,
    §2.6.3) or gives credit and REJECTS what comes; either way the producer
    hears why within a bounded time."""
    r = router(addresses=ADDRESSES)
    conn = blocking(r.url)
    try:
        sender = conn.create_sender("closed/y")
        conn.wait(
            lambda: sender.link.credit > 0,
            timeout=5,
            msg="credit or detach on an unavailable address",
        )
    except LinkDetached as exc:
        # LinkDetached.condition is the remote condition's name
        assert exc.condition, "link refused without an error condition"
        return
    except LinkException as exc:
        # BlockingSender saw a null target but no DETACH (with its reason) followed within 1 s.
        raise AssertionError(
            f"refused without a DETACH carrying an error condition: {exc}"
        ) from None
    except Timeout:
        raise AssertionError(
            "sender attached to an unavailable address got neither credit nor a detach"
        ) from None
    d = sender.link.send(Message(body="blocked"))
    conn.wait(lambda: d.settled, timeout=10, msg="outcome for a message to an unavailable address")
    assert outcome_name(d.remote_state) == "REJECTED"
    assert d.remote.condition is not None and d.remote.condition.name
