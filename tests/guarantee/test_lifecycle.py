"""Subscriptions and topics over time, in real routers (issue 15 a, b, c): a subscriber that
closes and attaches again is a new subscription; a router without the topic's guarantee is
reported and does not hold the others' records; idle topics go."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from proton import Delivery, Message
from proton.utils import BlockingConnection

from qrouter.client import Client
from qrouter.client import Message as ClientMessage
from tests.client.conftest import run
from tests.guarantee.common import (
    OPTS,
    TOPIC,
    Publisher,
    Routers,
    Subscriber,
    check_exactly_once,
    records_held,
    topic_rows,
    wait_subscribers_known,
    wait_until,
)
from tests.harness import retry


def test_closed_subscriber_attaching_again_gets_messages_and_is_waited_for(router: Any) -> None:
    """Issue 15 (a): detach with closed=true ends the terminus (§2.6.6); attaching again
    with the same container-id and link name, at another router, makes a new one: it gets
    the messages published from then on, and publishers wait for its acceptance."""
    tri = Routers(router, names=("A", "B"))

    async def scenario() -> None:
        first = await Client.connect(tri.urls("A"), "sub", **OPTS)
        receiver = await first.receiver(TOPIC, "sub", exactly_once=True, credit=10)
        await wait_subscribers_known(tri, 1)
        await receiver.close()  # closed=true: unsubscribed everywhere
        await wait_subscribers_known(tri, 0)
        await first.close()
        again = await Client.connect(tri.urls("B"), "sub", **OPTS)
        receiver = await again.receiver(TOPIC, "sub", exactly_once=True, credit=10)
        await wait_subscribers_known(tri, 1)
        pubc = await Client.connect(tri.urls("A"), "pub", **OPTS)
        sender = await pubc.sender(TOPIC, "pub", exactly_once=True)
        fut = sender.submit(ClientMessage(body="m0"))
        got = await receiver.receive(timeout=10)
        assert got.message.body == "m0"
        await asyncio.sleep(0.5)
        assert not fut.done(), "accepted before the re-subscribed subscriber accepted"
        await got.accept()
        assert (await asyncio.wait_for(fut, 10)).accepted
        await wait_until(lambda: receiver.unsettled == 0, 10, lambda: "subscriber unsettled")
        await pubc.close()
        await again.close()

    run(scenario(), timeout=90)


def test_router_without_the_guarantee_is_reported_and_frees_no_one(router: Any) -> None:
    """Issue 15 (b): C has the address without the guarantee. It answers the protocol's PING
    with LACKING: A and B report it (management `lacking_routers`, one log line) and free
    their records and tombstones instead of waiting for C's PONG forever."""
    tri = Routers(router, lacking=("C",))

    async def scenario() -> None:
        subs = [await Subscriber.start(tri.urls(n), f"sub-{n}", TOPIC) for n in ("A", "B")]
        await wait_subscribers_known(tri, 2)
        pubs = [await Publisher.start(tri.urls("A"), "pub-A", TOPIC)]
        await pubs[0].publish(100)
        ab = [tri.url("A"), tri.url("B")]

        async def records_free() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while (held := await records_held(ab)) != {u: (0, 0) for u in ab}:
                assert loop.time() < deadline, f"records held (origin, local): {held}"
                await asyncio.sleep(0.2)

        await wait_until(
            lambda: all(p.sender.unsettled == 0 and not p.pending for p in pubs), 30, lambda: "pub"
        )
        await records_free()
        check_exactly_once(pubs, subs)
        for n in ("A", "B"):
            rows = await asyncio.to_thread(topic_rows, tri.url(n))
            assert [r["lacking_routers"] for r in rows] == [["C"]], rows
        assert await asyncio.to_thread(topic_rows, tri.url("C")) == []
        for n in ("A", "B"):
            text = tri.r[n].log_text()
            assert text.count("has no guarantee for this topic") == 1, text[-3000:]
        assert tri.r["C"].log_text().count("which this router does not have") >= 1
        for c in pubs + subs:
            await c.close()

    run(scenario(), timeout=120)


def test_idle_topics_are_dropped(router: Any) -> None:
    """Issue 15 (c): every distinct topic a publisher names made a state machine that
    stayed (and pinged) for the life of the router. One with no link, subscriber or record
    left goes after guarantee_timeout, and comes back when named again."""
    r = router(addresses={TOPIC: "multicast,exactly-once"}, config={"guarantee_timeout": 1.0})
    names = [f"{TOPIC}.t{i}" for i in range(20)]
    conn = BlockingConnection(r.url, timeout=10)
    for name in names:
        sender = conn.create_sender(name)
        assert sender.send(Message(body="x")).remote_state == Delivery.ACCEPTED
        sender.close()
    receiver = conn.create_receiver(f"{TOPIC}.kept", credit=1)
    assert len(topic_rows(r.url)) >= 2
    retry(
        lambda: [row["name"] for row in topic_rows(r.url)] == [f"{TOPIC}.kept"],
        timeout=15,
        message=lambda: f"topics: {[row['name'] for row in topic_rows(r.url)]}",
    )
    receiver.close()
    sender = conn.create_sender(names[0])  # named again: made again
    assert sender.send(Message(body="y")).remote_state == Delivery.ACCEPTED
    assert names[0] in [row["name"] for row in topic_rows(r.url)]
    conn.close()


def _wakeups(pid: int) -> int:
    """Voluntary context switches of the process's main thread, the event loop's: one per
    sleep that a later wake-up ended (proc(5), /proc/PID/task/PID/status). The store's and
    the journal's threads are left out: they wake for their own work."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/PID/status")


def _wakeups_per_s(pid: int, seconds: float = 3.0) -> float:
    before, t0 = _wakeups(pid), time.monotonic()
    time.sleep(seconds)
    return (_wakeups(pid) - before) / (time.monotonic() - t0)


# the 1 s housekeeping and heap trim: 2 a second; the ticker would add four (6 measured)
IDLE_WAKEUPS_PER_S = 3.5


def test_the_ticker_sleeps_while_there_is_no_topic(router: Any) -> None:
    """Issue 18: with no guaranteed topic (none named yet, or all dropped as idle) nothing
    wakes the router for the topics' ticks (0.25 s); a topic named wakes the ticker, which
    drops it again when it is idle, and naming it again wakes it once more."""
    # on the memory store whatever the suite's: a durable store's commits wake the loop on
    # their own (3-5 times a second with lmdb, measured), which this count is not about
    config = {"guarantee_timeout": 1.0, "store": "memory"}
    r = router(addresses={TOPIC: "multicast,exactly-once"}, config=config)
    time.sleep(1.0)  # the start's own work done
    idle = _wakeups_per_s(r.pid)
    assert idle < IDLE_WAKEUPS_PER_S, f"{idle:.1f} wake-ups a second with no topic"
    for round_ in range(2):
        conn = BlockingConnection(r.url, timeout=10)
        sender = conn.create_sender(f"{TOPIC}.a")
        assert sender.send(Message(body=f"x{round_}")).remote_state == Delivery.ACCEPTED
        sender.close()
        conn.close()
        retry(  # dropped after guarantee_timeout: only a tick does that
            lambda: topic_rows(r.url) == [],
            timeout=15,
            message=lambda: f"topics: {[row['name'] for row in topic_rows(r.url)]}",
        )
        time.sleep(1.0)  # the management connection's close and the last tick done
        idle = _wakeups_per_s(r.pid)
        assert idle < IDLE_WAKEUPS_PER_S, f"{idle:.1f} wake-ups a second after round {round_}"
