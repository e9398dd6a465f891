"""What a `TopicRouter` needs from the router that embeds it (the lead's data plane
implements it; tests/eo/sim.py has the simulated one).

Every call is an output of the state machine; the router applies them in order, after the
`RecordStore` commit of the same input (the state machine commits first, then calls these).
"""

from __future__ import annotations

from typing import Any, Protocol

from qrouter.eo.records import AttId, Pub


class Port(Protocol):
    def to_router(self, router_id: str, message: dict[str, Any]) -> None:
        """Send one control message on the FIFO channel to `router_id` (see messages.py)."""

    def deliver(self, att: AttId, out_tag: bytes, body: bytes, resume: bool) -> None:
        """Transfer `body` with delivery-tag `out_tag` (unsettled) on subscriber link `att`;
        `resume`: the subscriber reported the tag on attach (AMQP resume=true)."""

    def settle_subscriber(self, att: AttId, out_tag: bytes) -> None:
        """Send disposition(settled=true) for `out_tag` on subscriber link `att`."""

    def accept_publisher(self, pub: Pub, tag: bytes) -> None:
        """Send disposition(ACCEPTED, settled=false) for `tag` on publisher link `pub`."""

    def resend(self, pub: Pub, tags: list[bytes]) -> None:
        """Answer the publisher's re-attach so that it resends these deliveries (they are
        left out of the unsettled map the router sends back)."""

    def log(self, level: str, msg: str) -> None:
        """level: "debug", "info", "warning" or "error"."""
