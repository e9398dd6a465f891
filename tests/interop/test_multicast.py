"""Multicast: one copy per receiver; the producer gets one outcome per message.

The outcome is the strongest of the copies' terminal states
(REJECTED > ACCEPTED > MODIFIED > RELEASED, DESIGN.md §4), reported once all
copies are terminal. Presettled multicast goes out presettled.
"""

from __future__ import annotations

from typing import Any

import pytest
from proton import Condition
from proton.reactor import AtMostOnce

from tests.clients import Handler, numbered, outcome_name, run_container, settle_with

ADDRESSES = {"mcast": "multicast"}


class Multicast(Handler):
    def __init__(
        self,
        url: str,
        address: str,
        receivers: int,
        count: int,
        outcomes: list[str] | None = None,
        presettled: bool = False,
    ) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.n, self.count = url, address, receivers, count
        # outcomes[i]: what receiver i does with every message
        self.outcomes = outcomes or ["accept"] * receivers
        self.presettled = presettled
        self.got: dict[str, list[int]] = {}
        self.remote_settled: dict[str, int] = {}
        self.opened = 0
        self.sent = 0
        self.states: dict[int, int] = {}
        self.conditions: dict[int, Any] = {}

    def progress(self) -> str:
        return f"sent={self.sent} got={ {k: len(v) for k, v in self.got.items()} } outcomes={len(self.states)}"

    def on_start(self, event: Any) -> None:
        for i in range(self.n):
            conn = self.connect(event.container, self.url)
            rcv = event.container.create_receiver(conn, self.address, name=f"r{i}")
            rcv.flow(self.count)
            self.got[rcv.name] = []
            self.remote_settled[rcv.name] = 0

    def on_link_opened(self, event: Any) -> None:
        if event.receiver:
            self.opened += 1
            if self.opened == self.n:
                conn = self.connect(event.container, self.url)
                opts = [AtMostOnce()] if self.presettled else None
                event.container.create_sender(conn, self.address, options=opts)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(numbered(self.sent))
            self.sent += 1
        self._check_done()

    def on_message(self, event: Any) -> None:
        name = event.receiver.name
        self.got[name].append(event.message.body)
        if event.delivery.settled:  # remote settled: the copy came presettled
            self.remote_settled[name] += 1
            event.delivery.settle()
        else:
            i = int(name[1:])
            cond = (
                Condition("test:rejected", f"by {name}") if self.outcomes[i] == "reject" else None
            )
            settle_with(event.delivery, self.outcomes[i], cond)
        self._check_done()

    def on_delivery(self, event: Any) -> None:
        if event.sender and event.delivery.remote_state and event.delivery.settled:
            d = event.delivery
            self.states[d.tag] = d.remote_state
            self.conditions[d.tag] = d.remote.condition
            self._check_done()  # proton's auto_settle settles it after this

    def _check_done(self) -> None:
        if all(len(v) == self.count for v in self.got.values()) and (
            self.presettled or len(self.states) == self.count
        ):
            self.done()


def test_multicast_to_three_receivers(router: Any) -> None:
    r = router(addresses=ADDRESSES)
    h = run_container(Multicast(r.url, "mcast/three", 3, 50), timeout=30)
    for name, bodies in h.got.items():
        assert bodies == list(range(50)), f"{name} did not get one ordered copy of each message"
    assert sorted(outcome_name(s) for s in h.states.values()) == ["ACCEPTED"] * 50


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        (["accept", "reject", "release"], "REJECTED"),
        (["release", "accept", "modify"], "ACCEPTED"),
        (["release", "modify", "release"], "MODIFIED"),
    ],
    ids=["reject-wins", "accept-beats-modify", "modify-beats-release"],
)
def test_multicast_strongest_outcome(router: Any, outcomes: list[str], expected: str) -> None:
    r = router(addresses=ADDRESSES)
    h = run_container(Multicast(r.url, "mcast/outcome", 3, 5, outcomes=outcomes), timeout=30)
    assert [outcome_name(s) for s in h.states.values()] == [expected] * 5
    if expected == "REJECTED":
        # the rejecting copy's error condition reaches the producer
        assert all(c is not None and c.name == "test:rejected" for c in h.conditions.values())


def test_multicast_presettled_goes_out_presettled(router: Any) -> None:
    r = router(addresses=ADDRESSES)
    h = run_container(Multicast(r.url, "mcast/presettled", 3, 50, presettled=True), timeout=30)
    for name, bodies in h.got.items():
        assert bodies == list(range(50))
        assert h.remote_settled[name] == 50, f"{name} got unsettled copies of presettled messages"
