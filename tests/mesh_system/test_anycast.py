"""Anycast across the mesh: chain, balanced over two routers, propagation bounds,
dynamic reply-to (docs/mesh.md, "Data plane")."""

from __future__ import annotations

import time
from typing import Any

from tests.clients import ThreadedRun, run_container
from tests.mesh_system.mesh import Requester, Server, Traffic, mesh

# Measured bound (docs/mesh.md): an address is usable / withdrawn at the far end of a chain
# of 3 well within this.
PROPAGATION_BOUND = 1.0


def test_chain_of_three_2000_unsettled_in_order(router: Any) -> None:
    r = mesh(router, [("A", "B"), ("B", "C")], ["A", "B", "C"])
    t = run_container(Traffic(r["A"].url, [r["C"].url], "chain.q", 2000), timeout=60)
    assert t.received[0] == list(range(2000)), "in order, each once"
    assert len(t.accepted) == 2000
    assert t.released == t.modified == 0


def test_large_messages_over_two_hops(router: Any) -> None:
    # 1 MiB messages: many frames on every hop (max-frame-size 64 KiB)
    r = mesh(router, [("A", "B"), ("B", "C")], ["A", "B", "C"])
    t = run_container(Traffic(r["A"].url, [r["C"].url], "big.q", 20, pad=1 << 20), timeout=60)
    assert t.received[0] == list(range(20))


def test_balanced_over_receivers_on_two_routers(router: Any) -> None:
    # A in the middle: B and C are one hop away, each with a receiver
    r = mesh(router, [("A", "B"), ("A", "C")], ["A", "B", "C"])
    t = run_container(Traffic(r["A"].url, [r["B"].url, r["C"].url], "bal.q", 1000), timeout=60)
    counts = [len(x) for x in t.received]
    assert sum(counts) == 1000 and len(t.accepted) == 1000
    assert min(counts) >= 200, f"both routers' receivers get a share: {counts}"


def test_closest_prefers_the_local_consumer(router: Any) -> None:
    r = mesh(router, [("A", "B")], ["A", "B"], addresses={"closest": "closest"})
    # receivers on A (local to the sender) and on B: closest sends everything to A's while it
    # has credit (a prefetch of 500 > 200 messages)
    t = run_container(
        Traffic(r["A"].url, [r["A"].url, r["B"].url], "closest.q", 200, prefetch=500),
        timeout=60,
    )
    assert [len(x) for x in t.received] == [200, 0]


class _Credit(Traffic):
    """Measures how long a sender on one router waits for credit after a receiver attaches
    on another, and how long until the credit is withdrawn after the receiver goes."""

    def __init__(self, sender_url: str, receiver_url: str, address: str) -> None:
        super().__init__(sender_url, [], address, 0)
        self.receiver_url = receiver_url
        self.t_attach = 0.0
        self.t_credit = 0.0
        self.t_detach = 0.0
        self.t_revoked = 0.0
        self.rconn: Any = None

    def on_start(self, event: Any) -> None:
        self._start_sender(event)  # no credit: nobody consumes yet

    def on_link_opened(self, event: Any) -> None:
        if event.sender is not None:
            event.container.schedule(0.5, self)  # no credit must arrive meanwhile
        elif event.receiver is not None:
            self.t_attach = time.monotonic()

    def on_sendable(self, event: Any) -> None:
        pass

    def on_timer_task(self, event: Any) -> None:
        now = time.monotonic()
        if not self.rconn:
            if self.sender.credit:
                self.fail("credit before any receiver existed")
                return
            self.rconn = self.connect(event.container, self.receiver_url)
            event.container.create_receiver(self.rconn, self.address)
        elif not self.t_credit:
            if self.sender.credit > 0:
                self.t_credit = now
                self.t_detach = now
                self.rconn.close()
        elif not self.t_revoked and self.sender.credit == 0:
            self.t_revoked = now
            self.done()
            return
        event.container.schedule(0.005, self)

    def progress(self) -> str:
        return f"attach {self.t_attach} credit {self.t_credit} revoked {self.t_revoked}"


def test_address_propagation_and_withdrawal_bound(router: Any) -> None:
    r = mesh(router, [("A", "B"), ("B", "C")], ["A", "B", "C"])
    time.sleep(0.5)  # let the mesh form
    h = run_container(_Credit(r["A"].url, r["C"].url, "prop.q"), timeout=30)
    added = h.t_credit - h.t_attach
    withdrawn = h.t_revoked - h.t_detach
    print(f"\npropagation over 2 hops: {added * 1000:.1f} ms, withdrawal {withdrawn * 1000:.1f} ms")
    assert added < PROPAGATION_BOUND
    assert withdrawn < PROPAGATION_BOUND


def test_dynamic_reply_to_across_three_routers(router: Any) -> None:
    r = mesh(router, [("A", "B"), ("B", "C")], ["A", "B", "C"])
    server = ThreadedRun(Server(r["C"].url, "svc"), timeout=60).start()
    try:
        req = run_container(Requester(r["A"].url, "svc", 50), timeout=30)
        assert sorted(req.replies) == sorted(f"re:req{i}" for i in range(50))
        assert req.reply_to is not None and req.reply_to.startswith("_dynamic/A/")
    finally:
        server.handler.container.stop()  # type: ignore[union-attr]
        server.join(15)
