"""Dynamic reply-to round trip (AMQP 1.0 §3.5.3 source `dynamic`).

A client attaches a receiver with a dynamic source; the router answers the
ATTACH with a unique address routed to that receiver. The client sends
requests with reply-to = that address; a server answers each to its reply-to,
and the answer arrives on the dynamic receiver only.
"""

from __future__ import annotations

from typing import Any

from proton import Message

from tests.clients import Handler, ThreadedRun, pump_until, run_container
from tests.harness import retry

SERVICE = "service/echo"


class EchoServer(Handler):
    """Answers `count` requests to their reply-to, using an anonymous sender
    (null target, per-message `to`: the anonymous relay) or one sender per
    reply address, then stops once every answer has been accepted."""

    def __init__(self, url: str, count: int, anonymous: bool = True) -> None:
        super().__init__(prefetch=10)
        self.url, self.count, self.anonymous = url, count, anonymous
        self.ready = False
        self.answered = self.accepted = 0
        self.conn: Any = None
        self.relay: Any = None
        self.senders: dict[str, Any] = {}
        # answers waiting for credit, per sender (a sender to a reply
        # address must carry only that address's answers)
        self.backlog: dict[str, list[Message]] = {}

    def progress(self) -> str:
        return f"answered={self.answered} accepted={self.accepted} backlog={self.backlog}"

    def on_start(self, event: Any) -> None:
        self.conn = self.connect(event.container, self.url)
        event.container.create_receiver(self.conn, SERVICE, name="echo-server")
        if self.anonymous:
            self.relay = event.container.create_sender(self.conn, None, name="echo-relay")

    def on_link_opened(self, event: Any) -> None:
        if event.receiver:
            self.ready = True

    def on_message(self, event: Any) -> None:
        req = event.message
        answer = Message(body=f"echo:{req.body}", correlation_id=req.id, address=req.reply_to)
        if self.anonymous:
            snd = self.relay
        else:
            snd = self.senders.get(req.reply_to)
            if snd is None:
                snd = event.container.create_sender(
                    self.conn, req.reply_to, name=f"to-{req.reply_to}"
                )
                self.senders[req.reply_to] = snd
        self.backlog.setdefault(snd.name, []).append(answer)
        self._flush(snd)

    def on_sendable(self, event: Any) -> None:
        self._flush(event.sender)

    def _flush(self, snd: Any) -> None:
        backlog = self.backlog.get(snd.name, [])
        while backlog and snd.credit:
            snd.send(backlog.pop(0))
            self.answered += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            self.done()

    def on_rejected(self, event: Any) -> None:
        self.fail(f"answer rejected: {event.delivery.remote.condition}")


def _server(router: Any, count: int, anonymous: bool) -> ThreadedRun:
    server = EchoServer(router.url, count, anonymous)
    run = ThreadedRun(server, timeout=30).start()
    retry(lambda: server.ready or not run.thread.is_alive(), timeout=10)
    assert server.ready, f"echo server did not attach: {server.errors}"
    return run


def test_dynamic_reply_to_blocking_client(router: Any, blocking: Any) -> None:
    r = router()
    server = _server(r, 5, anonymous=True)
    conn = blocking(r.url)
    replies = conn.create_receiver(None, dynamic=True, credit=10)
    reply_to = replies.link.remote_source.address
    assert reply_to, "router gave the dynamic source no address"
    sender = conn.create_sender(SERVICE)
    for i in range(5):
        sender.send(Message(id=f"req-{i}", body=i, reply_to=reply_to), timeout=10)
    answers = {}
    for _ in range(5):
        msg = replies.receive(timeout=10)
        answers[msg.correlation_id] = msg.body
        replies.accept()
    assert answers == {f"req-{i}": f"echo:{i}" for i in range(5)}
    # the server stops once its answers are accepted: pump our accepts out
    pump_until(conn, lambda: not server.thread.is_alive(), 20, "echo server to finish")
    server.join()


class Client(Handler):
    """Container client: two dynamic receivers (addresses must differ), one
    request to the service per reply address."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.reply_addresses: dict[str, str] = {}
        self.sender: Any = None
        self.sent = False
        self.answers: dict[str, Any] = {}

    def progress(self) -> str:
        return f"reply addresses={self.reply_addresses} answers={self.answers}"

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        for name in ("replies-a", "replies-b"):
            event.container.create_receiver(conn, None, dynamic=True, name=name)
        self.sender = event.container.create_sender(conn, SERVICE, name="requests")

    def on_link_opened(self, event: Any) -> None:
        if event.receiver:
            self.reply_addresses[event.receiver.name] = event.receiver.remote_source.address
            self._maybe_send()

    def on_sendable(self, event: Any) -> None:
        self._maybe_send()

    def _maybe_send(self) -> None:
        if self.sent or len(self.reply_addresses) < 2 or not self.sender.credit:
            return
        self.sent = True
        for name, addr in sorted(self.reply_addresses.items()):
            self.sender.send(Message(id=name, body=name, reply_to=addr))

    def on_message(self, event: Any) -> None:
        # the answer to request `name` must arrive on the receiver `name`
        self.answers[event.message.correlation_id] = (event.receiver.name, event.message.body)
        if len(self.answers) == 2:
            self.done()


def test_dynamic_reply_to_container_client_sender_per_reply(router: Any) -> None:
    r = router()
    server = _server(r, 2, anonymous=False)
    h = run_container(Client(r.url), timeout=20)
    a, b = h.reply_addresses["replies-a"], h.reply_addresses["replies-b"]
    assert a and b and a != b, f"dynamic addresses not unique: {a!r} {b!r}"
    assert h.answers == {
        "replies-a": ("replies-a", "echo:replies-a"),
        "replies-b": ("replies-b", "echo:replies-b"),
    }
    server.join()
