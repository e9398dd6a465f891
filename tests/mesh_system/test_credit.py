"""Credit across the mesh: bounded buffering, no starvation between addresses."""

from __future__ import annotations

import time
from typing import Any

from proton import Message

from tests.clients import Handler, ThreadedRun, run_container
from tests.harness import retry
from tests.mesh_system.mesh import Traffic, mesh

LINK_CAPACITY = 250  # the router's default: most credit it grants one producer link


class Stalled(Handler):
    """A receiver on one router that takes `prefetch` messages and never settles them, and a
    sender on another that sends whenever it has credit."""

    def __init__(self, sender_url: str, receiver_url: str, address: str) -> None:
        super().__init__(prefetch=0, auto_accept=False)  # 10 credit, granted once
        self.sender_url = sender_url
        self.receiver_url = receiver_url
        self.address = address
        self.sent = 0
        self.received = 0

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.receiver_url)
        event.container.create_receiver(conn, self.address)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None:
            event.receiver.flow(10)
            conn = self.connect(event.container, self.sender_url)
            event.container.create_sender(conn, self.address)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit > 0:
            event.sender.send(Message(body=self.sent))
            self.sent += 1

    def on_message(self, event: Any) -> None:
        self.received += 1  # held: never settled

    def progress(self) -> str:
        return f"sent {self.sent}, received {self.received}"


def test_stalled_consumer_pushes_back_to_the_producer(router: Any) -> None:
    r = mesh(router, [("A", "B"), ("B", "C")], ["A", "B", "C"])
    run = ThreadedRun(Stalled(r["A"].url, r["C"].url, "stall.q"), timeout=30).start()
    h: Stalled = run.handler  # type: ignore[assignment]
    retry(lambda: h.received == 10, timeout=10, message=h.progress)
    # the path fills for a while after the consumer stops (slower on a loaded machine):
    # wait, bounded, until the producer has sent nothing for half a second
    seen = [h.sent, time.monotonic()]

    def settled() -> bool:
        if h.sent != seen[0]:
            seen[:] = [h.sent, time.monotonic()]
        return time.monotonic() - seen[1] >= 0.5

    retry(settled, timeout=10, message=lambda: f"the producer still gets credit: {h.progress()}")
    before = h.sent
    time.sleep(1.0)
    print(f"\nsent {h.sent} into a chain of 3 whose consumer holds 10")
    # everything the producer could send sits in bounded places: the consumer's 10, and at
    # most one link capacity per router on the way
    assert h.sent == before, "no more credit once the path is full"
    assert h.sent <= 10 + 3 * LINK_CAPACITY, h.progress()
    h.container.stop()  # type: ignore[union-attr]
    run.thread.join(10)


def test_busy_address_does_not_starve_another(router: Any) -> None:
    r = mesh(router, [("A", "B")], ["A", "B"])
    stalled = ThreadedRun(Stalled(r["A"].url, r["B"].url, "busy.q"), timeout=60).start()
    h: Stalled = stalled.handler  # type: ignore[assignment]
    retry(lambda: h.received == 10, timeout=10, message=h.progress)
    # the same inter-router connection carries another address at full speed meanwhile
    t = run_container(Traffic(r["A"].url, [r["B"].url], "free.q", 2000), timeout=30)
    assert t.received[0] == list(range(2000))
    h.container.stop()  # type: ignore[union-attr]
    stalled.thread.join(10)
