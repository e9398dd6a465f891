"""Guaranteed topics' batches received on an inter-router control link, without sockets.

One router "B" (`qrouter.core.Core` with its `Mesh`, in this process) and a neighbour "A" made
of hand-built frames: OPEN as a router, both control links, HELLO and link state, so that B
has a route and a channel to A. Then N control messages as A's `Mesh.send_eo` writes them
(one envelope each, in sequence, holding RECORDS records for a topic B has) are fed to B's
connection, and the thread time B spends per control message is printed: received in the
engine (`EoControl`, qrouter/_fast/eo_control.pxi), and through `Mesh.on_message` (the
entry unbound: the path before it), alternating, ROUNDS rounds each:

    python tools/bench/eo_control.py [N] [RECORDS] [ROUNDS]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1] if (HERE.parents[1] / "setup.py").exists() else None
if CHECKOUT and str(CHECKOUT) not in sys.path:
    sys.path.insert(0, str(CHECKOUT))  # the checkout's router package, as run.py does

TOPIC = "events"


def _frame(code: int, fields: list[Any], channel: int = 0, payload: bytes = b"") -> bytes:
    """An AMQP frame (2.3.1) holding performative `code` with `fields`, then `payload`."""
    from qrouter._fast.codec import Described, ULong, encode

    body = encode(Described(ULong(code), fields)) + payload
    return (8 + len(body)).to_bytes(4, "big") + b"\x02\x00" + channel.to_bytes(2, "big") + body


class Neighbour:
    """Router A on an inter-router connection to `core` (router B), fed by hand."""

    def __init__(self, core: Any, loop: asyncio.AbstractEventLoop) -> None:
        from qrouter._fast.codec import Described, UInt, ULong

        from qrouter.config import ListenerConfig
        from qrouter.inter_router import CONTROL_ADDRESS, CONTROL_LINK, P_ID, P_INSTANCE, P_ROLE

        self.core = core
        self.conn = core.new_connection(ListenerConfig(role="inter-router"))
        self.sent = 0
        props = {P_ROLE: "inter-router", P_ID: "A", P_INSTANCE: ULong(7)}
        window = [UInt(0), UInt(0x7FFFFFFF), UInt(0x7FFFFFFF)]
        target = Described(ULong(0x29), [CONTROL_ADDRESS])  # 3.5.4
        source = Described(ULong(0x28), [])  # 3.5.3
        self.conn.feed(b"AMQP\x00\x01\x00\x00")
        self.conn.feed(_frame(0x10, ["A", None, None, None, None, None, None, None, None, props]))
        self.conn.feed(_frame(0x11, [None, *window]))  # 2.7.2 begin
        loop.run_until_complete(asyncio.sleep(0))  # B begins and attaches its control sender
        # 2.7.3 attach: A's control sender (B's ctl_in), then the answer to B's on channel 1
        self.conn.feed(
            _frame(
                0x12,
                [CONTROL_LINK, UInt(0), False, None, None, source, target, None, None, UInt(0)],
            )
        )
        self.conn.feed(_frame(0x11, [UInt(1), *window], channel=1))
        self.conn.feed(_frame(0x12, [CONTROL_LINK, UInt(0), True, None, None, source, target], 1))
        self.conn.take_output()

    def frames(self, payloads: list[bytes]) -> bytes:
        """2.7.5 transfers of `payloads` on A's control sender, presettled."""
        from qrouter._fast.codec import UInt

        out = []
        for payload in payloads:
            tag = self.sent.to_bytes(4, "big")
            out.append(_frame(0x14, [UInt(0), UInt(self.sent), tag, UInt(0), True], 0, payload))
            self.sent += 1
        return b"".join(out)

    def say(self, message: dict[str, Any]) -> None:
        from qrouter._fast.codec import Described, encode

        from qrouter.inter_router import AMQP_VALUE

        self.conn.feed(self.frames([encode(Described(AMQP_VALUE, message))]))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    records = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3

    from qrouter._fast.engine import eo_message

    from qrouter.config import AddressConfig, RouterConfig
    from qrouter.core import Core
    from qrouter.inter_router import Mesh
    from qrouter.mesh.messages import Hello, LinkStateUpdate

    core = Core(
        RouterConfig(
            id="B",
            addresses=[
                AddressConfig(prefix=TOPIC, distribution="multicast", guarantee="exactly-once")
            ],
        )
    )
    loop = asyncio.new_event_loop()
    mesh = core.mesh = Mesh(core)
    mesh.loop = loop
    a = Neighbour(core, loop)
    a.say(Hello("A", 7, ("B",)).to_wire())
    a.say(LinkStateUpdate("A", 7, 1, {"B": 1}).to_wire())
    mesh.engine.tick(loop.time())
    ch = core.guarantees.channels["A"]
    core.guarantees.topic(TOPIC)
    peer = next(iter(mesh.peers.values()))
    # SEEN of deliveries B does not hold: the core looks each up and is done (the receive
    # path's own cost is what this measures, not the state machine's)
    seen = [("SEEN", TOPIC, i.to_bytes(32, "big"), (("c", "l"),)) for i in range(records)]

    def run(engine: bool) -> float:
        if engine:
            mesh._bind_control(peer)
        else:
            mesh._unbind_control(peer)
        payloads = [
            eo_message([{"to": "B", "from": "A", "e": ch.epoch, "n": ch.in_n + i, "ms": seen}])
            for i in range(n)
        ]
        data = a.frames(payloads)
        first = ch.in_n
        t = time.thread_time()
        for at in range(0, len(data), 65536):
            a.conn.feed(data[at : at + 65536])
            a.conn.take_output()
        spent = time.thread_time() - t
        assert ch.in_n == first + n, (ch.in_n, first, n)
        return spent / n * 1e6

    run(True)  # warm up (and B's origin check looks the link up)
    results: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for engine in (True, False):
            results[engine].append(run(engine))
    print(f"{n:,} control messages of one envelope with {records} records each, µs a message:")
    for engine, label in ((True, "in the engine (EoControl)"), (False, "through Mesh.on_message")):
        values = " / ".join(f"{v:.2f}" for v in results[engine])
        print(f"  {label:28} median {statistics.median(results[engine]):6.2f}   ({values})")


if __name__ == "__main__":
    main()
