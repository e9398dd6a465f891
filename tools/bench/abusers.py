"""Abusive AMQP 1.0 clients against a router, for the abuse benchmark (docs/security.md).

    python abusers.py HOST PORT --seconds 30 --each 4 [--user NAME] [--source 127.0.0.2]

Runs `--each` clients of every kind below for `--seconds`, then prints one JSON line (what
each kind did and what the router answered) and exits. Every client reconnects when the
router closes it, so the pressure lasts the whole run; nothing waits without a bound.

    nest      a `$management` request whose body nests 200,000 described types (600 KB)
    storm     attach storms: 2,000 sender links on one connection, then drop it, again
    loris     a protocol header and OPEN, then a frame trickled one byte a second
    stall     a receiver that grants 1,000,000 credit and stops reading its socket, fed by a
              presettled sender of 4 KiB messages on its own connection
    password  SASL PLAIN with a wrong password, again and again

The frames are encoded by hand (idle_client.py's helpers); the router's frames are read with
python-qpid-proton's codec (`proton.Data`), which qrouter-tool already depends on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import struct
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from proton import Data

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from idle_client import HEADER, _described_list, _frame, _str, _uint  # noqa: E402

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
SASL_INIT, SASL_OUTCOME = 0x41, 0x44
NULL, TRUE, FALSE = b"\x40", b"\x41", b"\x42"
NEST_LEVELS = 200_000
STORM_LINKS = 2_000
STALL_CREDIT = 1_000_000
STALL_BODY = 4096
SAFE_FRAME = 512  # 2.7.1 MIN-MAX-FRAME-SIZE: every peer takes frames this large
ANSWER_S = 5.0  # how long a client waits for the router's answer before it gives up


def _sym(s: str) -> bytes:
    return b"\xa3" + bytes([len(s)]) + s.encode()


def _bin(b: bytes) -> bytes:
    return b"\xb0" + struct.pack(">I", len(b)) + b


def _sasl_frame(body: bytes) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body  # 5.3.1 SASL frame type 1


def _open(container: str) -> bytes:
    return _frame(0, _described_list(OPEN, _str(container)))


def _begin(window: int = 2048) -> bytes:
    return _frame(0, _described_list(BEGIN, NULL, _uint(0), _uint(window), _uint(window)))


def _attach(name: str, handle: int, sender: bool, address: str) -> bytes:
    source = _described_list(0x28, *([] if sender else [_str(address)]))  # 3.5.3
    target = _described_list(0x29, *([_str(address)] if sender else []))  # 3.5.4
    role = FALSE if sender else TRUE
    return _frame(
        0,
        _described_list(
            ATTACH, _str(name), _uint(handle), role, _uint(1) if sender else NULL, NULL,
            source, target,
        ),
    )  # fmt: skip


def _flow(handle: int, credit: int, window: int) -> bytes:
    fields = (_uint(0), _uint(window), _uint(0), _uint(window), _uint(handle), _uint(0))
    return _frame(0, _described_list(FLOW, *fields, _uint(credit)))


def _transfer(handle: int, delivery: int, payload: bytes, *, settled: bool, more: bool) -> bytes:
    fields = [_uint(handle), _uint(delivery), _bin(struct.pack(">I", delivery)), _uint(0)]
    fields += [TRUE if settled else FALSE, TRUE if more else FALSE]
    return _frame(0, _described_list(TRANSFER, *fields) + payload)


def nested_request() -> bytes:
    """A `$management` request whose body is an amqp-value (3.2.8) of NEST_LEVELS described
    types inside each other: three bytes a level, 600 KB in all."""
    return b"\x00\x53\x77" + b"\x00\x50\x00" * NEST_LEVELS + b"\x40"


class Peer(asyncio.Protocol):
    """Reads the router's frames and counts their performatives (and the link credit it
    grants); writes what its client tells it to."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.seen: Counter[int] = Counter()
        self.credit = 0
        self.changed = asyncio.Event()
        self.closed = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.headers = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if len(self.buf) >= 8 and self.buf[:4] == b"AMQP":
                del self.buf[:8]
                self.headers += 1
                continue
            if len(self.buf) < 8:
                break
            size, doff = struct.unpack_from(">IB", self.buf)
            if len(self.buf) < size:
                break
            body = bytes(self.buf[doff * 4 : size])
            del self.buf[:size]
            if len(body) >= 3 and body[:2] == b"\x00\x53":
                self.seen[body[2]] += 1
                if body[2] == FLOW:
                    self._flow(body)
        self.changed.set()

    def _flow(self, body: bytes) -> None:
        data = Data()
        data.decode(body)
        data.rewind()
        data.next()
        performative = data.get_object()
        fields = getattr(performative, "value", None) or []
        if len(fields) > 6 and fields[4] is not None and fields[6] is not None:
            self.credit = int(fields[6])

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.changed.set()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def until(self, test: Callable[[], bool], timeout: float = ANSWER_S) -> bool:
        """Wait (bounded) until `test()` holds or the router closed the connection."""
        deadline = time.monotonic() + timeout
        while not test() and not self.closed.done():
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                return False
        return test()

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class Abusers:
    def __init__(
        self, host: str, port: int, user: str, deadline: float, source: str | None = None
    ) -> None:
        self.host, self.port, self.user, self.deadline = host, port, user, deadline
        self.source = source  # the local address the clients connect from (None: any)
        self.stats: Counter[str] = Counter()

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    async def connect(self) -> Peer | None:
        loop = asyncio.get_running_loop()
        try:
            _, peer = await asyncio.wait_for(
                loop.create_connection(
                    Peer,
                    self.host,
                    self.port,
                    local_addr=(self.source, 0) if self.source else None,
                ),
                ANSWER_S,
            )
        except (OSError, TimeoutError):
            self.stats["connect failed"] += 1
            await asyncio.sleep(0.1)
            return None
        return peer

    async def nest(self, n: int) -> None:
        # encoded once: the abusers' own CPU should go to the router, not to Python encoding
        request = nested_request()
        step = SAFE_FRAME - 64
        chunks = [request[i : i + step] for i in range(0, len(request), step)]
        frames = b"".join(
            _transfer(0, 0, chunk, settled=False, more=i < len(chunks) - 1)
            for i, chunk in enumerate(chunks)
        )
        while self.running():
            if (peer := await self.connect()) is None:
                continue
            peer.write(HEADER + _open(f"abuse-nest-{n}") + _begin())
            peer.write(_attach("nest", 0, True, "$management"))
            if await peer.until(lambda p=peer: p.credit > 0):  # type: ignore[misc]
                peer.write(frames)
                self.stats["nest sent"] += 1
                answered = await peer.until(
                    lambda p=peer: bool(p.seen[DISPOSITION] or p.seen[DETACH] or p.seen[CLOSE])  # type: ignore[misc]
                )
                self.stats["nest answered" if answered else "nest unanswered"] += 1
            peer.drop()

    async def storm(self, n: int) -> None:
        attaches = [
            _attach(f"storm-{i}", i, True, f"abuse.storm.{n}.{i}") for i in range(STORM_LINKS)
        ]
        round_ = 0
        while self.running():
            if (peer := await self.connect()) is None:
                continue
            round_ += 1
            peer.write(HEADER + _open(f"abuse-storm-{n}-{round_}") + _begin())
            for i in range(STORM_LINKS):
                if i % 200 == 0 and not self.running():
                    break
                peer.write(attaches[i])
                if i % 200 == 199:  # let the router answer before the next burst
                    await peer.until(lambda p=peer, i=i: p.seen[ATTACH] > i or p.seen[CLOSE])  # type: ignore[misc]
            self.stats["storm attaches"] += peer.seen[ATTACH]
            self.stats["storm refused"] += peer.seen[DETACH] + peer.seen[CLOSE]
            peer.drop()

    async def loris(self, n: int) -> None:
        partial = _begin()  # a whole BEGIN frame, sent one byte a second
        while self.running():
            if (peer := await self.connect()) is None:
                continue
            peer.write(HEADER + _open(f"abuse-loris-{n}"))
            for byte in partial:
                if peer.closed.done() or not self.running():
                    break
                peer.write(bytes([byte]))
                await asyncio.wait([peer.closed], timeout=1.0)
            self.stats["loris closed by router" if peer.closed.done() else "loris held"] += 1
            peer.drop()

    async def stall(self, n: int) -> None:
        address = f"abuse.stall.{n}"
        body = b"\x00\x53\x75" + _bin(b"x" * STALL_BODY)  # a data section (3.2.6)
        while self.running():
            receiver = await self.connect()
            sender = await self.connect()
            if receiver is None or sender is None:
                for p in (receiver, sender):
                    if p is not None:
                        p.drop()
                continue
            # a session window as large as the credit: nothing but the router limits it
            receiver.write(HEADER + _open(f"abuse-stall-r{n}") + _begin(0x7FFFFFFF))
            receiver.write(_attach("stalled", 0, False, address))
            receiver.write(_flow(0, STALL_CREDIT, 0x7FFFFFFF))
            await receiver.until(lambda p=receiver: p.seen[ATTACH] > 0)  # type: ignore[misc]
            assert receiver.transport is not None
            receiver.transport.pause_reading()  # the consumer stops reading for good
            sender.write(HEADER + _open(f"abuse-stall-s{n}") + _begin(0x7FFFFFFF))
            sender.write(_attach("feeder", 0, True, address))
            delivery = 0
            while self.running() and not sender.closed.done():
                if sender.credit <= 0:
                    sender.changed.clear()
                    await asyncio.wait([asyncio.ensure_future(sender.changed.wait())], timeout=0.5)
                    continue
                burst = min(sender.credit, 64)
                sender.write(
                    b"".join(
                        _transfer(0, delivery + i, body, settled=True, more=False)
                        for i in range(burst)
                    )
                )
                delivery += burst
                sender.credit -= burst
                await asyncio.sleep(0)  # let the socket drain and flows arrive
            self.stats["stall sent"] += delivery
            receiver.drop()
            sender.drop()

    async def password(self, n: int) -> None:
        response = b"\x00" + self.user.encode() + b"\x00wrong-password"
        init = _described_list(SASL_INIT, _sym("PLAIN"), _bin(response), NULL)
        while self.running():
            if (peer := await self.connect()) is None:
                continue
            t0 = time.monotonic()
            peer.write(SASL_HEADER + _sasl_frame(init))
            if await peer.until(lambda p=peer: p.seen[SASL_OUTCOME] > 0):  # type: ignore[misc]
                self.stats["password refused"] += 1
                self.stats["password ms"] += int((time.monotonic() - t0) * 1000)
            else:
                self.stats["password unanswered"] += 1
            peer.drop()

    async def run(self, each: int, kinds: list[str]) -> dict[str, Any]:
        jobs: list[Awaitable[None]] = []
        for kind in kinds:
            job: Callable[[int], Awaitable[None]] = getattr(self, kind)
            jobs += [job(n) for n in range(each)]
        await asyncio.gather(*jobs, return_exceptions=True)
        return dict(self.stats)


KINDS = ["nest", "storm", "loris", "stall", "password"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--each", type=int, default=4, help="clients of every kind")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--user", default="bench", help="the user the wrong passwords are for")
    parser.add_argument("--source", help="connect from this local address (e.g. 127.0.0.2)")
    args = parser.parse_args()
    deadline = time.monotonic() + args.seconds
    abusers = Abusers(args.host, args.port, args.user, deadline, args.source)

    async def run() -> dict[str, Any]:
        def stop() -> None:  # SIGTERM ends the run early; the stats still print
            abusers.deadline = 0.0

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
        return await abusers.run(args.each, args.kinds.split(","))

    print(json.dumps(asyncio.run(run())), flush=True)


if __name__ == "__main__":
    main()
