"""A consumer process for tests/interop/test_consumer_failure.py.

Usage: python doomed_consumer.py URL ADDRESS CREDIT

Attaches a receiver with CREDIT, never settles anything, prints ``ATTACHED``
and then ``GOT <message-id>`` per message (flushed), and waits to be killed.
It exits by itself after 60 s so an orphan never lingers.
"""

from __future__ import annotations

import sys
from typing import Any

from proton.handlers import MessagingHandler
from proton.reactor import Container


class Doomed(MessagingHandler):  # type: ignore[misc]
    def __init__(self, url: str, address: str, credit: int) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.credit = url, address, credit

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, reconnect=False)
        rcv = event.container.create_receiver(conn, self.address, name="doomed")
        rcv.flow(self.credit)
        event.container.schedule(60, self)

    def on_link_opened(self, event: Any) -> None:
        print("ATTACHED", flush=True)

    def on_message(self, event: Any) -> None:
        print(f"GOT {event.message.id}", flush=True)

    def on_timer_task(self, event: Any) -> None:
        event.container.stop()


if __name__ == "__main__":
    Container(Doomed(sys.argv[1], sys.argv[2], int(sys.argv[3]))).run()
