"""Stalled consumers for the backpressure tests (issue 13): a raw-socket receiver that grants
a lot of credit and then stops reading its socket, a proton producer that sends whenever it
has credit, and the router's resident memory.

The receiver is a raw socket on purpose: a proton client's socket is read by its own I/O
loop, and a test that wants the router's writes to back up must be sure nobody reads them.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from proton import Message
from proton.reactor import AtMostOnce
from qrouter._fast.codec import UInt, decode

from tests.clients import Handler, _Timer
from tests.engine.pump import (
    ACCEPTED,
    AMQP_HEADER,
    ATTACH,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    TRANSFER,
    attach_frame,
    begin_frame,
    described,
    open_frame,
    perf,
)
from tests.harness import HOST

HEARTBEAT = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # 2.4.5: an empty frame


def rss_kib(pid: int) -> int:
    """VmRSS of a process, in KiB (/proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def body(i: int, size: int) -> bytes:
    """Message i's body: its number where the receiver finds it, padded to `size` bytes."""
    head = b"seq=%010d;" % i
    return head + b"." * (size - len(head))


class RawConsumer:
    """ATTACH a receiver on `address`, FLOW `credit`, then read nothing until `resume()`.

    While stalled it still sends an empty frame every second (the router closes a connection
    it has heard nothing from for its idle time-out: that is a different protection). After
    `resume()` a thread reads everything, counts the deliveries, checks they come in order
    (the number in each body), and, for unsettled ones, accepts and settles them in ranges."""

    def __init__(self, port: int, address: str, credit: int = 1_000_000) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=10)
        self.address = address
        self.received = 0
        self.next_expected = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.reading = threading.Event()
        self.buf = bytearray()
        self.unacked: list[int] = []  # delivery-ids received unsettled, not yet accepted
        self.lock = threading.Lock()  # one writer at a time (heartbeats, dispositions)
        self._send(
            AMQP_HEADER
            + open_frame("stalled-consumer", max_frame_size=UInt(65536))
            + begin_frame()
            + attach_frame("stalled", 0, sender=False, address=address)
            + perf(
                FLOW,
                next_incoming_id=UInt(0),
                incoming_window=UInt(0x7FFFFFFF),
                next_outgoing_id=UInt(0),
                outgoing_window=UInt(0x7FFFFFFF),
                handle=UInt(0),
                delivery_count=UInt(0),
                link_credit=UInt(credit),
            )
        )
        # read until the router has answered the ATTACH, then stop reading
        deadline = time.monotonic() + 10
        while not self._attached():
            if time.monotonic() > deadline:
                raise AssertionError("the router did not answer the ATTACH within 10 s")
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError("the router closed the connection")
            self.buf += data
        self.heartbeats = threading.Thread(target=self._heartbeat, daemon=True)
        self.heartbeats.start()
        self.reader = threading.Thread(target=self._read, daemon=True)

    def _send(self, data: bytes) -> None:
        with self.lock:
            self.sock.sendall(data)

    def _attached(self) -> bool:
        for code, _fields, _payload in self._frames():
            if code == ATTACH:
                return True
        return False

    def _frames(self) -> list[tuple[int | None, Any, bytes]]:
        """Take the whole frames out of self.buf (skipping the protocol header)."""
        out = []
        pos = 0
        buf = self.buf
        while True:
            if buf[pos : pos + 4] == b"AMQP" and len(buf) - pos >= 8:
                pos += 8
                continue
            if len(buf) - pos < 8:
                break
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if len(buf) - pos < size:
                break
            doff = buf[pos + 4]
            frame_body = bytes(buf[pos + doff * 4 : pos + size])
            pos += size
            if not frame_body:
                out.append((None, None, b""))
                continue
            value, end = decode(frame_body)
            out.append((int(value.descriptor), value.value, frame_body[end:]))
        del buf[:pos]
        return out

    def _heartbeat(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self._send(HEARTBEAT)
            except OSError:
                return

    def resume(self) -> None:
        """Start reading again (in a thread)."""
        self.sock.settimeout(0.5)
        self.reading.set()
        self.reader.start()

    def _read(self) -> None:
        payload = bytearray()
        while not self.stop.is_set():
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError as exc:
                self.errors.append(f"socket: {exc}")
                return
            if not data:
                self.errors.append("the router closed the connection")
                return
            self.buf += data
            for code, fields, rest in self._frames():
                if code == TRANSFER:
                    first = len(fields) > 1 and fields[1] is not None
                    settled = len(fields) > 4 and bool(fields[4])
                    more = len(fields) > 5 and bool(fields[5])
                    if first and not settled:
                        self.unacked.append(int(fields[1]))
                    payload += rest
                    if not more:
                        self._delivered(bytes(payload))
                        payload.clear()
                elif code in (DETACH, END, CLOSE):
                    self.errors.append(f"the router sent performative 0x{code:x}: {fields}")
            if self.unacked:
                self._accept()

    def _delivered(self, message: bytes) -> None:
        p = message.find(b"seq=")
        n = int(message[p + 4 : p + 14]) if p >= 0 else -1
        if n != self.next_expected and len(self.errors) < 10:
            self.errors.append(
                f"delivery {self.received}: got message {n}, expected {self.next_expected}"
            )
        self.next_expected = n + 1
        self.received += 1

    def _accept(self) -> None:
        # 2.7.6: one DISPOSITION per contiguous range of delivery-ids, accepted and settled
        ids = sorted(self.unacked)
        self.unacked.clear()
        start = prev = ids[0]
        ranges = []
        for i in ids[1:]:
            if i != prev + 1:
                ranges.append((start, prev))
                start = i
            prev = i
        ranges.append((start, prev))
        self._send(
            b"".join(
                perf(
                    DISPOSITION,
                    role=True,
                    first=UInt(a),
                    last=UInt(b),
                    settled=True,
                    state=described(ACCEPTED),
                )
                for a, b in ranges
            )
        )

    def close(self) -> None:
        self.stop.set()
        if self.reader.is_alive():
            self.reader.join(5)
        self.sock.close()


class Producer(Handler):
    """Sends `n` numbered messages of `size` bytes to `address` whenever it has credit,
    presettled or not; stays connected until `finish()` (or until every message is accepted,
    unsettled). `sent` and `last_sent` tell when it stalled."""

    def __init__(
        self, url: str, address: str, n: int, size: int, *, settled: bool, anonymous: bool = False
    ) -> None:
        super().__init__(prefetch=0, auto_settle=True)
        self.anonymous = anonymous  # a null target: each message carries `to` (anonymous relay)
        self.url = url
        self.address = address
        self.n = n
        self.size = size
        self.settled = settled
        self.sent = 0
        self.accepted = 0
        self.last_sent = time.monotonic()
        self.finish_asked = False
        self.sender: Any = None

    def on_start(self, event: Any) -> None:
        conn = self.connect(event.container, self.url)
        options = AtMostOnce() if self.settled else None
        target = None if self.anonymous else self.address
        self.sender = event.container.create_sender(conn, target, options=options)
        self._poll(event)

    def _poll(self, event: Any) -> None:
        if self.finish_asked:
            self.done()
            return
        event.container.schedule(0.1, _Timer(self._poll))

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit > 0 and self.sent < self.n:
            to = self.address if self.anonymous else None
            event.sender.send(Message(address=to, body=body(self.sent, self.size)))
            self.sent += 1
            self.last_sent = time.monotonic()

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1

    def on_rejected(self, event: Any) -> None:
        self.fail(f"message rejected: {event.delivery.remote.condition}")

    def on_released(self, event: Any) -> None:
        self.fail("message released")

    def finish(self) -> None:
        self.finish_asked = True

    def progress(self) -> str:
        return f"sent {self.sent} of {self.n}, accepted {self.accepted}"


def wait_stalled(producer: Producer, quiet: float = 1.0, timeout: float = 60.0) -> None:
    """Wait (bounded) until the producer has sent something, then nothing for `quiet` s."""
    deadline = time.monotonic() + timeout
    while producer.sent == 0 or time.monotonic() - producer.last_sent < quiet:
        if time.monotonic() > deadline:
            raise AssertionError(f"the producer never stalled: {producer.progress()}")
        time.sleep(0.1)
