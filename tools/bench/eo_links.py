"""A guaranteed topic's client links on one router, without sockets or other routers.

One router (`qrouter.core.Core`, in this process) with a guaranteed topic, a
python-qpid-proton publisher and three proton subscribers wired to it in memory (their
transports fed to the router's connections directly), N messages of 100 bytes published,
accepted by every subscriber and settled (exactly-once: the subscribers settle after the
router, receiver-settle-mode second). Prints the router's CPU time per message: the thread
time spent in its connections (`feed`, `take_output`) and in the guaranteed topics' group
commit (`Guarantees.flush`), not the clients'. No inter-router traffic, so it shows what the
client links and the state machine cost, and it moves far less with the machine's load than
run.py's triangle:

    python tools/bench/eo_links.py [N] [exactly-once|at-least-once]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1] if (HERE.parents[1] / "setup.py").exists() else None
if CHECKOUT and str(CHECKOUT) not in sys.path:
    sys.path.insert(0, str(CHECKOUT))  # the checkout's router package, as run.py does

TOPIC = "events"
BODY = b"\x00\x53\x75\xa0\x64" + b"x" * 100  # 3.2.6 a data section of 100 bytes


class _Client:
    """A proton connection wired to its own router connection; `moved` counts the router's
    CPU time in `spent`."""

    def __init__(self, core: Any, container: str, spent: list[float]) -> None:
        import proton

        from qrouter.config import ListenerConfig

        self.spent = spent
        self.conn = core.new_connection(ListenerConfig())
        self.transport = proton.Transport()
        self.connection = proton.Connection()
        self.connection.container = container
        self.transport.bind(self.connection)
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self.backlog = b""

    def step(self) -> int:
        clock = time.thread_time
        moved = 0
        n = self.transport.pending()
        if n > 0:
            data = self.transport.peek(n)
            self.transport.pop(n)
            t = clock()
            self.conn.feed(data)
            self.spent[0] += clock() - t
            moved += n
        t = clock()
        out = self.conn.take_output()
        self.spent[0] += clock() - t
        self.backlog += out
        room = self.transport.capacity()
        if self.backlog and room > 0:
            self.transport.push(self.backlog[:room])
            moved += min(room, len(self.backlog))
            self.backlog = self.backlog[room:]
        return moved + len(out)


def main(n: int, mode: str) -> float:
    import proton

    from qrouter.config import AddressConfig, RouterConfig
    from qrouter.core import Core

    eo = mode == "exactly-once"
    core = Core(
        RouterConfig(
            id="bench",
            addresses=[AddressConfig(prefix=TOPIC, distribution="multicast", guarantee=mode)],
        )
    )
    g = core.guarantees
    spent = [0.0]
    subs = [_Client(core, f"bench-sub-{i}", spent) for i in range(3)]
    receivers = []
    for c in subs:
        rcv = c.session.receiver("subscriber")
        rcv.source.address = TOPIC
        rcv.rcv_settle_mode = proton.Link.RCV_SECOND if eo else proton.Link.RCV_FIRST
        rcv.open()
        rcv.flow(n)
        receivers.append(rcv)
    pub = _Client(core, "bench-publisher", spent)
    clients = [*subs, pub]

    def settle_down() -> None:
        """Move bytes and run the group commit until nothing moves (the event loop would)."""
        for _ in range(1000):
            while sum(c.step() for c in clients):
                pass
            if not (g.outputs or g.writes):
                return
            t = time.thread_time()
            g.flush()
            spent[0] += time.thread_time() - t
        raise RuntimeError("the router did not settle down")

    settle_down()
    snd = pub.session.sender("publisher")
    snd.target.address = TOPIC
    snd.open()
    settle_down()
    sent = received = 0
    waiting: list[Any] = []  # exactly-once: accepted, waiting for the router's settlement
    while received < 3 * n:
        for _ in range(min(snd.credit, 200, n - sent)):
            snd.delivery(f"t{sent}")
            snd.send(BODY)
            snd.advance()
            sent += 1
        settle_down()
        for rcv in receivers:
            while rcv.current is not None and not rcv.current.partial:
                d = rcv.current
                rcv.recv(d.pending)
                rcv.advance()
                d.update(proton.Delivery.ACCEPTED)
                if eo:
                    waiting.append(d)
                else:
                    d.settle()
                received += 1
        settle_down()
        for d in [d for d in waiting if d.settled]:
            d.settle()  # in return: the subscriber has seen the router's settlement
        waiting = [d for d in waiting if not d.settled]
        settle_down()
    for d in waiting:
        d.settle()
    settle_down()
    return spent[0] / n * 1e6


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    guarantee = sys.argv[2] if len(sys.argv) > 2 else "exactly-once"
    us = main(count, guarantee)
    print(
        f"{guarantee}, 1 -> 3 on one router, {count} messages: {us:.1f} us of router CPU a message"
    )
