"""The exactly-once state machine alone (qrouter/eo), without routers or sockets.

Three `TopicRouter`s A, B, C wired directly (messages handed over in order), a publisher on
A and one subscriber on each (a client that cannot resume, as the bench's proton
receivers), N messages each transferred, accepted by all three, settled. Prints the CPU
time per message of the three state machines together, with in-memory records. It moves
far less with the machine's load than the triangle scenarios of run.py, so it shows what a
change to the protocol's code costs:

    python tools/bench/eo_state.py [N]
"""

from __future__ import annotations

import sys
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1] if (HERE.parents[1] / "setup.py").exists() else None
if CHECKOUT and str(CHECKOUT) not in sys.path:
    sys.path.insert(0, str(CHECKOUT))  # the checkout's router package, as run.py does

if TYPE_CHECKING:
    from qrouter.eo import AttId, Pub

PUB = ("bench-publisher", "sender")


class _Port:
    def __init__(self, wire: deque[tuple[str, str, dict[str, Any]]], name: str) -> None:
        self.wire = wire
        self.name = name

    def to_router(self, router_id: str, message: dict[str, Any]) -> None:
        self.wire.append((self.name, router_id, message))

    def deliver(self, att: AttId, out_tag: bytes, body: bytes, resume: bool) -> None:
        pass

    def settle_subscriber(self, att: AttId, out_tag: bytes) -> None:
        pass

    def accept_publisher(self, pub: Pub, tag: bytes) -> None:
        pass

    def resend(self, pub: Pub, tags: list[bytes]) -> None:
        pass

    def log(self, level: str, msg: str) -> None:
        pass


def run(n: int) -> float:
    """CPU seconds per message of the three state machines."""
    from qrouter.eo import TopicRouter, outgoing_tag

    wire: deque[tuple[str, str, dict[str, Any]]] = deque()
    routers = {r: TopicRouter(r, _Port(wire, r), instance=1, topic="bench") for r in "ABC"}

    def pump() -> None:
        while wire:
            src, dst, msg = wire.popleft()
            routers[dst].receive(src, msg, 0.0)

    for x in "ABC":
        for y in "ABC":
            if x != y:
                routers[x].router_up(y, 0.0)
    pump()
    subs = {
        r: routers[r].subscriber_attached((f"sub-{r}", "receiver"), [], 0.0, resumable=False)
        for r in "ABC"
    }
    pump()
    driver = routers["A"]
    driver.publisher_attached(PUB, [], 0.0)
    t0 = time.process_time()
    for i in range(n):
        tag = i.to_bytes(4, "big")
        driver.publisher_transfer(PUB, tag, b"x" * 100, 0.0)
        pump()
        out_tag = outgoing_tag(*PUB, tag)
        for r in "ABC":
            routers[r].subscriber_accepted(subs[r], out_tag, 0.0)
        pump()
        driver.publisher_settled(PUB, tag, 0.0)
        pump()
        if i % 250 == 0:  # the PING barrier lets tombstones go
            for r in "ABC":
                routers[r].tick(i / 1000)
            pump()
    per = (time.process_time() - t0) / n
    if driver.origin_records():
        raise SystemExit("records left at the driver: the run did not complete")
    return per


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    per = run(n)
    print(f"{n:,} messages: {per * 1e6:.1f} µs of CPU per message (3 state machines)")


if __name__ == "__main__":
    main()
