"""The credit of a guaranteed topic's publisher link, as the router reports it (issue 15: the
"11 s without credit" of a slow bench run).

A guaranteed topic grants its publishers credit from Python (`Link.flow`, qrouter/guarantee.py
`_top_up`). The engine stamps `Link.no_credit_since` when a link's credit reaches zero; that
grant must clear the stamp, or the link monitor (qrouter/link_monitor.py) and management count
the first stall of the link for the rest of its life: a publisher that once filled its window
was reported "without credit for 10 s" ten seconds later while it had credit and was sending.
"""

from __future__ import annotations

import asyncio
from typing import Any

from qrouter.client import Client, Message
from qrouter.guarantee import PUBLISHER_WINDOW as WINDOW  # the credit a publisher link gets
from tests.client.conftest import run, wait_until
from tests.guarantee.common import topic_rows

TOPIC = "events"


def link_rows(url: str) -> list[dict[str, Any]]:
    """The router's links (management QUERY of type link); blocking."""
    from qrouter_tools.management_client import ConnectOptions, ManagementClient

    with ManagementClient(ConnectOptions(url=url, timeout=5.0)) as c:
        return c.query("link")


def publisher_row(url: str, name: str) -> dict[str, Any] | None:
    rows = [r for r in link_rows(url) if r["name"] == name and r["address"] == TOPIC]
    return rows[0] if rows else None


def test_credit_given_back_clears_the_no_credit_stamp(router: Any) -> None:
    r = router(addresses={TOPIC: "multicast,exactly-once"})
    row: dict[str, Any] | None = None

    async def poll(pred: Any, timeout: float, what: str) -> None:
        async def check() -> bool:
            nonlocal row
            row = await asyncio.to_thread(publisher_row, r.url, "pub")
            return row is not None and bool(pred(row))

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await check():
            if loop.time() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {row}")
            await asyncio.sleep(0.1)

    async def main() -> None:
        sub_client = await Client.connect(r.url, "sub", reconnect=False)
        receiver = await sub_client.receiver(TOPIC, "sub", exactly_once=True, credit=WINDOW)
        await wait_until(
            lambda: [t["subscribers"] for t in topic_rows(r.url)] == [1],
            10,
            lambda: f"topics {topic_rows(r.url)}",
        )
        pub_client = await Client.connect(r.url, "pub", reconnect=False)
        sender = await pub_client.sender(TOPIC, "pub", exactly_once=True, max_in_flight=2 * WINDOW)
        # a full window, held unaccepted by the subscriber: the router's credit runs out
        futures = [sender.submit(Message(body=i)) for i in range(WINDOW)]
        held = [await receiver.receive(timeout=20) for _ in range(WINDOW)]
        await poll(
            lambda x: x["credit"] == 0 and x["no_credit_seconds"] > 0,
            20,
            "the publisher's credit used up, and the stall seen",
        )
        # the subscriber accepts: the publisher gets ACCEPTED, settles, credit comes back
        for received in held:
            assert received is not None
            await received.accept()
        outcomes = await asyncio.wait_for(asyncio.gather(*futures), 20)
        assert {o.state for o in outcomes} == {"accepted"}
        await poll(lambda x: x["credit"] > 0, 20, "credit given back to the publisher")
        # credit again: no stall to report (it was counted from the first one, for ever)
        assert row is not None and row["no_credit_seconds"] == 0.0, row
        await pub_client.close()
        await sub_client.close()

    run(main(), timeout=90)
