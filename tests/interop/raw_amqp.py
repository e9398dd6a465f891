"""A raw-socket AMQP peer for the tests that need to misbehave on purpose (deadlines,
slow-loris, login bursts): frames are built and read with the socketless harness's helpers
(tests/engine/pump.py), every read bounded by the socket's timeout."""

from __future__ import annotations

import socket
import time

from qrouter._fast.codec import Symbol

from tests.engine.pump import (
    SASL_HEADER,
    SASL_INIT,
    SASL_RESPONSE,
    Frame,
    parse_output,
    perf,
)

HOST = "127.0.0.1"


class RawSocket:
    def __init__(self, port: int, timeout: float = 10.0, source: str | None = None) -> None:
        # source: another loopback address (127.0.0.2 ...), a second "host" for the router
        self.sock = socket.create_connection(
            (HOST, port), timeout=timeout, source_address=(source, 0) if source else None
        )
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, n: int) -> bool:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return False
            self.buf += chunk
        return True

    def header(self) -> bytes:
        assert self._fill(8), "closed before a protocol header"
        h, self.buf = self.buf[:8], self.buf[8:]
        return h

    def frame(self) -> Frame | None:
        """The next frame, or None at end of stream."""
        if not self._fill(4):
            return None
        size = int.from_bytes(self.buf[:4], "big")
        if not self._fill(size):
            return None
        raw, self.buf = self.buf[:size], self.buf[size:]
        return parse_output(raw)[1][0]

    def frames_until_eof(self) -> list[Frame]:
        out = []
        while (f := self.frame()) is not None:
            out.append(f)
        return out

    def wait_closed(self) -> float:
        """Read until the router closes the socket (anything it sends is dropped); the
        seconds that took. socket.timeout if it does not close within the timeout."""
        start = time.monotonic()
        while self.sock.recv(65536):
            pass
        return time.monotonic() - start

    def close(self) -> None:
        self.sock.close()


def plain_login(
    port: int, user: str, password: str, timeout: float = 30.0, source: str | None = None
) -> tuple[int, float]:
    """One SASL PLAIN exchange (5.3.2) on a new socket: (outcome code, seconds from the
    sasl-init to the outcome). Code -1: the router closed without an outcome."""
    s = RawSocket(port, timeout, source)
    try:
        s.send(SASL_HEADER)
        assert s.header() == SASL_HEADER
        s.frame()  # sasl-mechanisms
        start = time.monotonic()
        s.send(
            perf(
                SASL_INIT,
                mechanism=Symbol("PLAIN"),
                initial_response=b"\0" + user.encode() + b"\0" + password.encode(),
            )
        )
        outcome = s.frame()
        took = time.monotonic() - start
        return (-1 if outcome is None else int(outcome.fields["code"])), took
    finally:
        s.close()


def scram_login(
    port: int, user: str, password: str, timeout: float = 30.0, source: str | None = None
) -> tuple[int, float]:
    """One SASL SCRAM-SHA-256 exchange (RFC 7677 over 5.3.3.2-5.3.3.6) on a new socket, the
    client's messages computed by scramp (not our implementation): (outcome code, seconds from
    the sasl-response carrying the proof to the outcome). Code -1: closed without one."""
    import scramp

    client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
    s = RawSocket(port, timeout, source)
    try:
        s.send(SASL_HEADER)
        assert s.header() == SASL_HEADER
        s.frame()  # sasl-mechanisms
        first = client.get_client_first().encode()
        s.send(perf(SASL_INIT, mechanism=Symbol("SCRAM-SHA-256"), initial_response=first))
        challenge = s.frame()
        if challenge is None or "challenge" not in challenge.fields:
            return (-1 if challenge is None else int(challenge.fields["code"])), 0.0
        client.set_server_first(bytes(challenge.fields["challenge"]).decode())
        start = time.monotonic()
        s.send(perf(SASL_RESPONSE, response=client.get_client_final().encode()))
        outcome = s.frame()
        took = time.monotonic() - start
        return (-1 if outcome is None else int(outcome.fields["code"])), took
    finally:
        s.close()
