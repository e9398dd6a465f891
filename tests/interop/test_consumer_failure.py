"""A consumer that goes away with deliveries in flight.

Issue 2 / DESIGN.md §4: each in-flight delivery goes back to the producer
RELEASED (never sent to the consumer) or MODIFIED with delivery-failed (it may
have seen it) — AMQP 1.0 §3.4.4, §3.4.5 — and none stays unsettled.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from proton import Delivery

from tests.clients import Handler, numbered, outcome_name, run_container

CONSUMER = Path(__file__).with_name("doomed_consumer.py")


class InFlightProducer(Handler):
    """Sends `count` unsettled messages; when the consumer reports `kill_after`
    arrivals it is made to vanish by `vanish()`; then waits for every sent
    delivery to be settled by the router."""

    def __init__(self, url: str, address: str, count: int, kill_after: int) -> None:
        # auto_accept off: a consumer living in this handler settles nothing
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.count, self.kill_after = url, address, count, kill_after
        self.sent = 0
        self.outcomes: dict[int, tuple[int, bool]] = {}
        self.consumer_got: list[int] = []
        self.vanished_at: float | None = None

    def progress(self) -> str:
        states = [outcome_name(s) for s, _ in self.outcomes.values()]
        return (
            f"sent={self.sent} consumer got={len(self.consumer_got)} vanished={self.vanished_at is not None} "
            f"settled outcomes={len(self.outcomes)} {sorted(set(states))}"
        )

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        event.container.create_sender(conn, self.address, name="in-flight-out")
        event.container.schedule(0.05, self)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count and self.vanished_at is None:
            event.sender.send(numbered(self.sent))
            self.sent += 1

    def on_delivery(self, event: Any) -> None:
        d = event.delivery
        if event.sender is not None and d.settled:
            self.outcomes[int(d.tag) - 1] = (d.remote_state, d.remote.failed)
            self._check()

    def on_timer_task(self, event: Any) -> None:
        if self.vanished_at is None:
            self.consumer_got += self.poll_consumer()
            if len(self.consumer_got) >= self.kill_after:
                self.vanish()
                self.vanished_at = time.monotonic()
        self._check()
        if not self.finished:
            event.container.schedule(0.05, self)

    def _check(self) -> None:
        if self.vanished_at is not None and len(self.outcomes) == self.sent:
            self.done()

    # overridden by the scenarios
    def poll_consumer(self) -> list[int]:
        raise NotImplementedError

    def vanish(self) -> None:
        raise NotImplementedError


class KilledConsumer(InFlightProducer):
    def __init__(
        self, url: str, address: str, count: int, kill_after: int, proc: subprocess.Popen[bytes]
    ) -> None:
        super().__init__(url, address, count, kill_after)
        self.proc = proc
        self.buf = b""

    def poll_consumer(self) -> list[int]:
        got: list[int] = []
        assert self.proc.stdout is not None
        while select.select([self.proc.stdout], [], [], 0)[0]:
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                break
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            if line.startswith(b"GOT "):
                got.append(int(line[4:]))
        return got

    def vanish(self) -> None:
        self.proc.kill()  # SIGKILL: no DETACH, no CLOSE, the socket just drops


def _start_consumer(url: str, address: str, credit: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, str(CONSUMER), url, address, str(credit)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 15
    line = b""
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline()
            if line.strip() == b"ATTACHED" or not line:
                break
    if line.strip() != b"ATTACHED":
        proc.kill()
        proc.wait(5)
        raise AssertionError(f"consumer process did not attach: {line!r}")
    return proc


def _check_outcomes(h: InFlightProducer) -> None:
    assert h.sent > 0
    assert len(h.outcomes) == h.sent, f"deliveries left unsettled: {h.progress()}"
    for i, (state, failed) in sorted(h.outcomes.items()):
        name = outcome_name(state)
        assert name in ("RELEASED", "MODIFIED"), f"message {i} came back {name}"
        if state == Delivery.MODIFIED:
            assert failed, f"message {i}: MODIFIED without delivery-failed"
        if i in h.consumer_got:
            # it reached the consumer: the router may not claim it never did
            assert state == Delivery.MODIFIED, (
                f"message {i} was delivered to the consumer but came back {name}"
            )


def test_consumer_killed_mid_stream(router: Any) -> None:
    r = router()
    address = "failure/killed"
    proc = _start_consumer(r.url, address, credit=20)
    try:
        h = KilledConsumer(r.url, address, count=50, kill_after=5, proc=proc)
        run_container(h, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
    assert len(h.consumer_got) >= 5
    _check_outcomes(h)


class DetachingConsumer(InFlightProducer):
    """Same producer; the consumer is a link in this container that detaches
    (closes its link) while holding unsettled deliveries."""

    def __init__(self, url: str, address: str, count: int, kill_after: int) -> None:
        super().__init__(url, address, count, kill_after)
        self.receiver: Any = None
        self.arrived: list[int] = []
        self.started = False

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        self.receiver = event.container.create_receiver(conn, self.address, name="detaching-in")
        self.receiver.flow(20)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver and not self.started:
            self.started = True
            super().on_start(event)

    def on_message(self, event: Any) -> None:
        self.arrived.append(event.message.id)  # never settled

    def poll_consumer(self) -> list[int]:
        got, self.arrived = self.arrived, []
        return got

    def vanish(self) -> None:
        self.receiver.close()

    def on_link_closed(self, event: Any) -> None:
        pass


def test_consumer_detaches_with_unsettled_deliveries(router: Any) -> None:
    r = router()
    h = DetachingConsumer(r.url, "failure/detached", count=50, kill_after=5)
    run_container(h, timeout=30)
    _check_outcomes(h)
