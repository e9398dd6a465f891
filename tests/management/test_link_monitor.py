"""The stuck-link warnings: credit stalls and deliveries unsettled for more than 10 s.

The rules on fake links with a fake clock (no waiting), then once against a real router,
whose log must show both warnings with their [C<conn>][L<link>] prefixes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from proton import Message

from qrouter.link_monitor import LinkMonitor
from tests.harness import retry


@dataclass(eq=False)
class FakeConn:
    conn_id: int
    links_: list[Any] = field(default_factory=list)

    def links(self) -> list[Any]:
        return self.links_


@dataclass(eq=False)
class FakeLink:
    conn: FakeConn
    handle: int = 0
    name: str = "l"
    is_sender: bool = True
    state: int = 1
    credit: int = 10
    no_credit_since: float = 0.0
    n_delivered: int = 0
    delivery_count: int = 0
    unsettled_count: int = 0
    pending_count: int = 0
    address_name: str | None = "a"
    endpoint: bool = False
    journal_address: str | None = None


class FakeCore:
    def __init__(self, *links: FakeLink) -> None:
        self.connections = {link.conn for link in links}


def monitor_for(*links: FakeLink) -> LinkMonitor:
    conn = links[0].conn
    conn.links_.extend(links)
    return LinkMonitor(FakeCore(*links))  # type: ignore[arg-type]


@pytest.fixture
def conn() -> FakeConn:
    return FakeConn(7)


def test_credit_stall_warned_once_then_cleared(conn: FakeConn, caplog: Any) -> None:
    link = FakeLink(conn, handle=3, credit=0, no_credit_since=100.0)
    m = monitor_for(link)
    caplog.set_level(logging.INFO, logger="qrouter.links")
    m.check(105.0)
    assert m.without_credit == 1 and m.stalled == 0 and not caplog.records
    m.check(110.5)
    m.check(111.5)
    assert m.stalled == 1 and m.credit_stalls_total == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("[C7][L3] link 'l' (out")
    assert "without credit for 10 s" in warnings[0]
    link.credit, link.no_credit_since = 5, 0.0
    m.check(112.0)
    assert m.without_credit == 0 and "credit again after 12 s" in caplog.records[-1].getMessage()


def test_a_guaranteed_topics_publisher_named_by_its_topic(conn: FakeConn, caplog: Any) -> None:
    # an endpoint link (qrouter/guarantee.py) has no engine Address: its topic is named, and
    # why it has no credit is its own unsettled deliveries, not the address's consumers
    link = FakeLink(conn, is_sender=False, credit=0, no_credit_since=1.0, unsettled_count=500)
    link.address_name, link.endpoint, link.journal_address = None, True, "events"
    m = monitor_for(link)
    caplog.set_level(logging.INFO, logger="qrouter.links")
    m.check(12.0)
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "(in, address 'events') without credit for 11 s" in warning
    assert "500 of its deliveries are unsettled" in warning


def test_a_link_that_never_had_credit(conn: FakeConn) -> None:
    # the engine stamps no_credit_since only when credit drops to zero
    link = FakeLink(conn, is_sender=False, credit=0)
    m = monitor_for(link)
    m.check(50.0)
    assert m.no_credit_since(link) == 50.0
    m.check(61.0)
    assert m.stalled == 1 and m.credit_stalls_total == 1


def test_unsettled_for_more_than_10_s(conn: FakeConn, caplog: Any) -> None:
    link = FakeLink(conn, n_delivered=5, unsettled_count=2)
    m = monitor_for(link)
    for t in range(0, 10):
        m.check(float(t))
    assert m.stuck_deliveries == 0
    # 3 more delivered since t=0, 2 still unsettled: nothing says an old one is among them
    link.n_delivered, link.unsettled_count = 8, 2
    m.check(10.0)
    assert m.stuck_deliveries == 0
    # 4 unsettled, only 3 delivered since the sample 10 s ago: at least one is older
    link.unsettled_count = 4
    m.check(11.0)
    assert m.stuck_deliveries == 1 and m.stuck_links == 1
    assert "1 deliveries unsettled for more than 10 s" in caplog.records[-1].getMessage()
    m.check(12.0)
    assert m.stuck_warnings_total == 1  # one warning per episode
    link.unsettled_count = 0
    m.check(13.0)
    assert m.stuck_deliveries == 0


def test_incoming_links_count_with_wrapping_delivery_count(conn: FakeConn) -> None:
    link = FakeLink(conn, is_sender=False, delivery_count=2**32 - 2, unsettled_count=1)
    m = monitor_for(link)
    m.check(0.0)
    link.delivery_count = 1  # wrapped: 3 transfers later
    link.unsettled_count = 3
    m.check(10.0)
    assert m.stuck_deliveries == 0  # 3 unsettled, 3 new: the old one may have settled
    link.unsettled_count = 4
    m.check(10.5)
    assert m.stuck_deliveries == 1


def test_warnings_in_a_real_router_log(router: Any, blocking: Any) -> None:
    r = router(listeners=[{"idle_timeout": 0}])
    conn = blocking(r.url)
    consumer = conn.create_receiver("slow", credit=1, name="slow-consumer")
    producer = conn.create_sender("slow", name="slow-producer")
    for i in range(2):
        producer.link.send(Message(body=i))
    assert consumer.receive(timeout=10).body == 0  # received, never settled; credit used up

    def logged() -> bool:
        text = r.outfile.read_text()
        return (
            "'slow-consumer' (out, address 'slow') without credit for" in text
            and "'slow-consumer' (out, address 'slow'): " in text
            and "'slow-producer' (in, address 'slow'): " in text
            and "deliveries unsettled for more than 10 s" in text
        )

    retry(logged, timeout=25, delay=0.5, message="no stuck-link warnings in the log")
    text = r.outfile.read_text()
    line = next(x for x in text.splitlines() if "without credit for" in x)
    assert "WARNING" in line and "qrouter.links: [C" in line and "][L" in line
