"""The asyncio client (qrouter/client.py) against a real router process: send/receive,
exactly-once, outcomes, the router's OPEN, reconnect over a list of URLs, refusal, stealing,
and interop with python-qpid-proton through the router."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from qrouter._fast.codec import Symbol

from qrouter.client import Client, ConnectError, LinkDetached, Message
from tests.client.conftest import run
from tests.clients import pump_until
from tests.harness import free_port

FAST = {"backoff": (0.05, 0.5), "reconnect_timeout": 30.0, "connect_timeout": 5.0}


def test_open_names_the_product(router: Any) -> None:
    r = router(router_id="Router.C")

    async def main() -> None:
        async with await Client.connect(r.url, "open-test", **FAST) as c:
            assert c.remote_properties.get(Symbol("product")) == "qrouter"
            assert c.remote_properties.get(Symbol("version"))
            assert c.remote_container_id == "Router.C"
            assert c.connected and c.connects == 1

    run(main())


def test_send_and_receive(router: Any) -> None:
    r = router()

    async def main() -> None:
        async with await Client.connect(r.url, "sr", **FAST) as c:
            rcv = await c.receiver("sr/q", "sr-in", credit=10)
            snd = await c.sender("sr/q", "sr-out")
            futures = [
                snd.submit(Message(body=f"m{i}", application_properties={"i": i}, subject="s"))
                for i in range(50)
            ]
            got = []
            async for rec in rcv:
                got.append((rec.message.body, rec.message.application_properties["i"]))
                assert rec.message.subject == "s"
                await rec.accept()
                if len(got) == 50:
                    break
            assert got == [(f"m{i}", i) for i in range(50)]
            outcomes = await asyncio.gather(*futures)
            assert {o.state for o in outcomes} == {"accepted"}
            assert snd.unsettled == 0 and rcv.unsettled == 0
            # bytes are the body, in a data section
            fut = snd.submit(b"\x00\x01raw")
            rec = await rcv.receive(timeout=10)
            assert rec is not None and rec.message.body == b"\x00\x01raw"
            await rec.accept()
            assert (await fut).accepted

    run(main())


def test_exactly_once_round_trip(router: Any) -> None:
    """rcv-settle-mode second (3.8.3): the receiver's accept goes unsettled, the sender
    settles on the outcome, the router relays the settlement and the receiver settles."""
    r = router()

    async def main() -> None:
        async with await Client.connect(r.url, "eo", **FAST) as c:
            rcv = await c.receiver("eo/q", "eo-in", exactly_once=True)
            snd = await c.sender("eo/q", "eo-out", exactly_once=True)
            futures = [snd.submit(Message(body=i)) for i in range(20)]
            seen = []
            while len(seen) < 20:
                rec = await rcv.receive(timeout=10)
                assert rec is not None
                seen.append(rec)
                await rec.accept()
            assert [rec.message.body for rec in seen] == list(range(20))
            assert all(o.accepted for o in await asyncio.gather(*futures))
            for rec in seen:
                await rec.wait_settled(10)
            assert rcv.unsettled == 0 and snd.unsettled == 0
            assert rcv.n_duplicates == 0

    run(main())


def test_outcomes_reach_the_sender(router: Any) -> None:
    r = router()

    async def main() -> None:
        async with await Client.connect(r.url, "oc", **FAST) as c:
            rcv = await c.receiver("oc/q", "oc-in", credit=1)
            snd = await c.sender("oc/q", "oc-out")

            async def one(dispose: Any) -> Any:
                fut = snd.submit(b"x")
                rec = await rcv.receive(timeout=10)
                assert rec is not None
                await dispose(rec)
                return await asyncio.wait_for(fut, 10)

            rej = await one(lambda rec: rec.reject("app:bad-order", "no such item"))
            assert (rej.state, rej.condition, rej.description) == (
                "rejected",
                "app:bad-order",
                "no such item",
            )
            mod = await one(lambda rec: rec.modify(True, True))
            assert mod.state == "modified" and mod.undeliverable_here
            acc = await one(lambda rec: rec.accept())
            assert acc.state == "accepted"

    run(main())


def test_connect_skips_a_dead_url(router: Any) -> None:
    r = router()
    dead = f"amqp://127.0.0.1:{free_port()}"

    async def main() -> None:
        async with await Client.connect([dead, r.url], "failover", **FAST) as c:
            assert c.url == r.url
            rcv = await c.receiver("fo/q", "fo-in")
            snd = await c.sender("fo/q", "fo-out")
            fut = snd.submit(b"hi")
            rec = await rcv.receive(timeout=10)
            assert rec is not None
            await rec.accept()
            assert (await fut).accepted

    run(main())


def test_connect_gives_up() -> None:
    dead = [f"amqp://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]

    async def main() -> None:
        with pytest.raises(ConnectError):
            await Client.connect(dead, "nobody", reconnect=False)
        with pytest.raises(ConnectError):
            await Client.connect(dead, "nobody", backoff=(0.01, 0.02), max_attempts=4)

    run(main())


def test_reconnect_after_router_restart(router: Any) -> None:
    """The router goes away (SIGTERM) and comes back on the same port: the client reconnects
    and re-attaches its links; traffic continues on the same Sender / Receiver objects."""
    port = free_port()
    r = router(listeners=[{"port": port}])

    async def main() -> None:
        async with await Client.connect(r.url, "comeback", **FAST) as c:
            rcv = await c.receiver("cb/q", "cb-in")
            snd = await c.sender("cb/q", "cb-out")
            fut = snd.submit(b"before")
            rec = await rcv.receive(timeout=10)
            assert rec is not None and rec.message.body == b"before"
            await rec.accept()
            assert (await fut).accepted

            await asyncio.get_running_loop().run_in_executor(None, r.stop)
            router("router2", listeners=[{"port": port}])
            fut = snd.submit(b"after")
            rec = await rcv.receive(timeout=20)
            assert rec is not None and rec.message.body == b"after"
            await rec.accept()
            assert (await asyncio.wait_for(fut, 10)).accepted
            assert c.connects == 2

    run(main(), timeout=60)


def test_refused_link_raises(router: Any) -> None:
    r = router(addresses={"closed": "unavailable"})

    async def main() -> None:
        async with await Client.connect(r.url, "refused", **FAST) as c:
            with pytest.raises(LinkDetached) as info:
                await c.receiver("closed/q", "nope")
            assert info.value.condition == "amqp:not-found"
            # the connection and other links are fine
            await c.receiver("open/q", "yes")

    run(main())


def test_link_stealing_fails_the_older_link(router: Any) -> None:
    r = router()

    async def main() -> None:
        c1 = await Client.connect(r.url, "thief-test", **FAST)
        c2 = await Client.connect(r.url, "thief-test", **FAST)
        try:
            first = await c1.receiver("st/q", "shared")
            await c2.receiver("st/q", "shared")
            with pytest.raises(LinkDetached) as info:
                await first.receive(timeout=10)
            assert info.value.condition == "amqp:link:stolen"
        finally:
            await c1.close()
            await c2.close()

    run(main())


def test_proton_interop_through_the_router(router: Any, blocking: Any) -> None:
    """Our sender -> proton receiver and proton sender -> our receiver: message sections
    survive both encoders."""
    r = router()
    pconn = blocking(r.url)
    prcv = pconn.create_receiver("px/to-proton", credit=5)

    async def main() -> None:
        async with await Client.connect(r.url, "interop", **FAST) as c:
            snd = await c.sender("px/to-proton", "px-out")
            fut = snd.submit(
                Message(
                    body={"a": 1}, subject="hi", message_id=7, application_properties={"k": "v"}
                )
            )
            loop = asyncio.get_running_loop()
            msg = await loop.run_in_executor(None, lambda: prcv.receive(timeout=10))
            assert (msg.body, msg.subject, msg.id, msg.properties) == (
                {"a": 1},
                "hi",
                7,
                {"k": "v"},
            )
            prcv.accept()
            # proton's blocking API writes only inside its own calls: pump until the outcome
            await loop.run_in_executor(
                None, lambda: pump_until(pconn, fut.done, 10, "the accept to reach us")
            )
            assert fut.result().accepted

            rcv = await c.receiver("px/from-proton", "px-in")
            import proton

            psnd = pconn.create_sender("px/from-proton")
            send = loop.run_in_executor(
                None, lambda: psnd.send(proton.Message(body="from proton", subject="p"), 10)
            )
            rec = await rcv.receive(timeout=10)
            assert rec is not None
            assert (rec.message.body, rec.message.subject) == ("from proton", "p")
            await rec.accept()
            await send

    run(main())
