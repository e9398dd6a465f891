"""A 1 MiB message through a listener with max-frame-size 16384.

Producer and consumer both connect to that listener, so the message enters as
a multi-frame delivery (§2.6.14 transfer `more`) of at most 16 KiB frames and
leaves the same way; it must arrive byte for byte.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from proton import Message

from tests.clients import Handler, run_container

FRAME = 16384
SIZE = 1024 * 1024


class LargeMessage(Handler):
    def __init__(self, url: str, address: str, bodies: list[bytes]) -> None:
        super().__init__(prefetch=2)
        self.url, self.address, self.bodies = url, address, bodies
        self.sender: Any = None
        self.sent = 0
        self.received: list[bytes] = []
        self.accepted = 0
        self.remote_frame_sizes: list[int] = []

    def progress(self) -> str:
        return f"sent={self.sent} received={len(self.received)} accepted={self.accepted}"

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url, max_frame_size=FRAME)
        event.container.create_receiver(conn, self.address, name="big-in")

    def on_connection_opened(self, event: Any) -> None:
        self.remote_frame_sizes.append(event.connection.transport.remote_max_frame_size)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver and self.sender is None:
            conn = self.connect(event.container, self.url, max_frame_size=FRAME)
            self.sender = event.container.create_sender(conn, self.address, name="big-out")

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < len(self.bodies):
            event.sender.send(Message(body=self.bodies[self.sent]))
            self.sent += 1

    def on_message(self, event: Any) -> None:
        # proton hands a binary body out as a memoryview over its own buffer,
        # which it reuses: copy it now.
        self.received.append(bytes(event.message.body))

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == len(self.bodies):
            self.done()


def test_one_mebibyte_through_16k_frames(router: Any) -> None:
    r = router(listeners=[{"max_frame_size": FRAME}])
    bodies = [os.urandom(SIZE), os.urandom(SIZE // 2) + bytes(SIZE // 2)]
    h = run_container(LargeMessage(r.url, "large/one", bodies), timeout=60)
    assert h.remote_frame_sizes == [FRAME, FRAME]
    assert len(h.received) == 2
    for sent, got in zip(bodies, h.received, strict=True):
        assert len(got) == len(sent)
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(sent).hexdigest()
