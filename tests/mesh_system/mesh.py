"""Topologies and proton clients for the mesh system tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from proton import Message
from proton.reactor import DynamicNodeProperties

from tests.clients import Handler, RcvSettleSecond  # noqa: F401 - re-exported for tests
from tests.harness import MeshRouter, free_port, retry

Make = Callable[..., Any]


def mesh(
    router: Make, edges: Sequence[tuple[str, str]], names: Sequence[str], **kwargs: Any
) -> dict[str, Any]:
    """Start one router per name; for each edge (a, b), b connects to a. Routers start in
    `names` order, so list the routers that are connected to first. `kwargs` go to every
    router (e.g. addresses)."""
    ports = {name: free_port() for name in names}
    made: dict[str, Any] = {}
    for name in names:
        peers = [ports[a] for a, b in edges if b == name]
        made[name] = router(name, cls=MeshRouter, inter_port=ports[name], connect=peers, **kwargs)
    return made


class Traffic(Handler):
    """Receivers on some routers, one sender on another; `n` numbered messages, unsettled.

    Every message's outcome is recorded; RELEASED / MODIFIED ones are sent again when
    `resend` is set. Done when every message is accepted and the receivers together got
    `expect` messages (default n)."""

    def __init__(
        self,
        sender_url: str,
        receiver_urls: Sequence[str],
        address: str,
        n: int,
        *,
        expect: int | None = None,
        resend: bool = False,
        pace: float = 0.0,
        window: int = 1000000,
        prefetch: int = 10,
        pad: int = 0,
    ) -> None:
        super().__init__(prefetch=prefetch, auto_accept=False)
        self.sender_url = sender_url
        self.receiver_urls = list(receiver_urls)
        self.address = address
        self.n = n
        self.expect = n if expect is None else expect
        self.resend = resend
        self.pace = pace
        self.window = window
        self.received: list[list[int]] = [[] for _ in receiver_urls]
        self.accepted: set[int] = set()
        self.accept_times: list[tuple[float, int]] = []
        self.sent_times: dict[int, float] = {}
        self.released = 0
        self.modified = 0
        self.queue: list[int] = list(range(n))
        self.ready = 0
        self.sender: Any = None
        self.unsettled = 0
        self.receivers: list[Any] = []
        self.pad = "x" * pad

    def on_start(self, event: Any) -> None:
        for url in self.receiver_urls:
            conn = self.connect(event.container, url)
            self.receivers.append(event.container.create_receiver(conn, self.address))
        if not self.receivers:
            self._start_sender(event)

    def _start_sender(self, event: Any) -> None:
        conn = self.connect(event.container, self.sender_url)
        self.sender = event.container.create_sender(conn, self.address)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None and event.receiver in self.receivers:
            self.ready += 1
            if self.ready == len(self.receivers):
                self._start_sender(event)

    def on_sendable(self, event: Any) -> None:
        self._send()

    def on_timer_task(self, event: Any) -> None:
        self._send()

    def _send(self) -> None:
        s = self.sender
        while s is not None and s.credit > 0 and self.queue and self.unsettled < self.window:
            i = self.queue.pop(0)
            props: dict[str, Any] = {"i": i, "pad": self.pad} if self.pad else {"i": i}
            d = s.send(Message(body=i, properties=props))
            d.i = i  # type: ignore[attr-defined]
            self.sent_times[i] = time.monotonic()
            self.unsettled += 1
            if self.pace:
                assert self.container is not None
                self.container.schedule(self.pace, self)
                return

    def on_message(self, event: Any) -> None:
        idx = self.receivers.index(event.receiver)
        self.received[idx].append(int(event.message.body))
        self.accept(event.delivery)
        self._check()

    def on_accepted(self, event: Any) -> None:
        self.unsettled -= 1
        i = event.delivery.i
        self.accepted.add(i)
        self.accept_times.append((time.monotonic(), i))
        self._check()
        self._send()

    def on_released(self, event: Any) -> None:
        self.unsettled -= 1
        if event.delivery.remote_state == event.delivery.MODIFIED:
            self.modified += 1
        else:
            self.released += 1
        if self.resend:
            self.queue.append(event.delivery.i)
            self._send()
        elif not self.finished:
            self.fail(f"message {event.delivery.i} came back {event.delivery.remote_state}")

    def on_rejected(self, event: Any) -> None:
        self.fail(f"message {event.delivery.i} rejected: {event.delivery.remote_condition}")

    def total(self) -> int:
        return sum(len(r) for r in self.received)

    def _check(self) -> None:
        if len(self.accepted) == self.n and self.total() >= self.expect:
            self.done()

    def progress(self) -> str:
        return (
            f"accepted {len(self.accepted)}/{self.n}, received "
            f"{[len(r) for r in self.received]}, released {self.released}, "
            f"modified {self.modified}, queue {len(self.queue)}"
        )


class Requester(Handler):
    """Request/response through a dynamic reply address on the requester's router."""

    def __init__(self, url: str, service: str, n: int) -> None:
        super().__init__()
        self.url = url
        self.service = service
        self.n = n
        self.replies: list[str] = []
        self.reply_to: str | None = None
        self.sender: Any = None
        self.sent = 0

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        event.container.create_receiver(conn, None, options=DynamicNodeProperties({}), dynamic=True)
        self.sender = event.container.create_sender(conn, self.service)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None:
            self.reply_to = event.receiver.remote_source.address
            self.on_sendable(event)

    def on_sendable(self, event: Any) -> None:
        while self.reply_to and self.sender.credit > 0 and self.sent < self.n:
            self.sender.send(Message(body=f"req{self.sent}", reply_to=self.reply_to))
            self.sent += 1

    def on_message(self, event: Any) -> None:
        self.replies.append(event.message.body)
        if len(self.replies) == self.n:
            self.done()

    def progress(self) -> str:
        return f"reply_to {self.reply_to}, sent {self.sent}, replies {len(self.replies)}"


class Server(Handler):
    """Answers every request on `service` to its reply-to (anonymous relay)."""

    def __init__(self, url: str, service: str) -> None:
        super().__init__()
        self.url = url
        self.service = service
        self.relay: Any = None
        self.answered = 0

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        event.container.create_receiver(conn, self.service)
        self.relay = event.container.create_sender(conn, None)

    def on_message(self, event: Any) -> None:
        reply = Message(address=event.message.reply_to, body=f"re:{event.message.body}")
        self.relay.send(reply)
        self.answered += 1


def wait_log(router: Any, text: str, timeout: float = 10.0) -> str:
    return retry(
        lambda: text in router.log_text(),
        timeout=timeout,
        message=lambda: f"{router.name}: no {text!r} in the log",
    )
