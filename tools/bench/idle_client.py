"""Hold idle AMQP 1.0 connections and links open against a router, for RSS measurements.

    python idle_client.py HOST PORT

Reads commands on stdin, one per line, and answers each with one JSON line on stdout:

    open CONNS LINKS   open CONNS more connections, each with one session and LINKS receiver
                       links (no credit); answers {"ready": n, "failed": n, "secs": s, "error": e}
                       once every new connection got the router's OPEN, BEGIN and all ATTACHes.

End of input closes everything and exits; so does --hold seconds without input.

The frames are encoded by hand (a dozen bytes each) so that 10,000 connections cost the client
little and the tool needs no AMQP library. Every connection gets its own container-id and every
link its own name and address, so the router's link registry sees distinct links.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import struct
import sys
import time

HEADER = b"AMQP\x00\x01\x00\x00"
EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # 2.3.1 an empty frame is a heartbeat
OPEN, BEGIN, ATTACH, DETACH, END, CLOSE = 0x10, 0x11, 0x12, 0x16, 0x17, 0x18
CONCURRENT_OPENS = 64  # below the listen backlog (asyncio: 100): overflow drops handshakes
READY_TIMEOUT = 30.0
HEARTBEAT_S = 5.0


def _str(s: str) -> bytes:
    b = s.encode()
    return b"\xa1" + bytes([len(b)]) + b  # str8-utf8 (1.6.20); our strings are < 256 bytes


def _uint(v: int) -> bytes:
    return b"\x70" + struct.pack(">I", v)


def _described_list(code: int, *fields: bytes) -> bytes:
    body = b"".join(fields)
    return (
        b"\x00\x53"
        + bytes([code])
        + b"\xd0"
        + struct.pack(">II", len(body) + 4, len(fields))
        + body
    )


def _frame(channel: int, body: bytes) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body  # 2.3.2 AMQP frame


def open_bytes(container: str, links: int) -> bytes:
    """Protocol header, OPEN, BEGIN and LINKS receiver ATTACHes (2.7.1, 2.7.2, 2.7.3)."""
    null, receiver = b"\x40", b"\x41"
    out = [HEADER, _frame(0, _described_list(OPEN, _str(container)))]
    out.append(_frame(0, _described_list(BEGIN, null, _uint(0), _uint(2048), _uint(2048))))
    for i in range(links):
        source = _described_list(0x28, _str(f"bench.idle.{container}.{i}"))  # 3.5.3 source
        target = _described_list(0x29)
        attach = _described_list(
            ATTACH, _str(f"idle-{i}"), _uint(i), receiver, null, null, source, target
        )
        out.append(_frame(0, attach))
    return b"".join(out)


class IdleConnection(asyncio.Protocol):
    def __init__(self, payload: bytes, links: int) -> None:
        self.payload = payload
        self.links = links
        self.seen: dict[int, int] = {}
        self.buf = b""
        self.header_done = False
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.header_done:
            if len(self.buf) < 8:
                return
            if self.buf[:8] != HEADER:
                return self._fail(f"unexpected protocol header {self.buf[:8]!r}")
            self.header_done, self.buf = True, self.buf[8:]
        while len(self.buf) >= 8:
            size, doff = struct.unpack_from(">IB", self.buf)
            if len(self.buf) < size:
                return
            body, self.buf = self.buf[doff * 4 : size], self.buf[size:]
            if len(body) >= 3 and body[:2] == b"\x00\x53":
                self.seen[body[2]] = self.seen.get(body[2], 0) + 1
        if any(self.seen.get(p) for p in (DETACH, END, CLOSE)):
            return self._fail(f"router sent {self.seen}")
        done = self.seen.get(OPEN) and self.seen.get(BEGIN)
        if done and self.seen.get(ATTACH, 0) >= self.links and not self.ready.done():
            self.ready.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"connection lost: {exc}")

    def _fail(self, why: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(why))


class Client:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conns: list[IdleConnection] = []
        self.gate = asyncio.Semaphore(CONCURRENT_OPENS)

    async def _open_one(self, n: int, links: int) -> IdleConnection:
        async with self.gate:
            loop = asyncio.get_running_loop()
            payload = open_bytes(f"idle-{os.getpid()}-{n}", links)
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: IdleConnection(payload, links), self.host, self.port
                ),
                READY_TIMEOUT,
            )
            await asyncio.wait_for(asyncio.shield(conn.ready), READY_TIMEOUT)
            return conn

    async def open(self, count: int, links: int) -> dict[str, object]:
        t0 = time.monotonic()
        first = len(self.conns)
        tasks = [self._open_one(first + i, links) for i in range(count)]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        self.conns += [r for r in results if isinstance(r, IdleConnection)]
        return {
            "ready": count - len(errors),
            "failed": len(errors),
            "secs": round(time.monotonic() - t0, 3),
            "error": repr(errors[0]) if errors else None,
        }

    async def heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            for conn in self.conns:
                if conn.transport is not None and not conn.transport.is_closing():
                    conn.transport.write(EMPTY_FRAME)

    def close(self) -> None:
        for conn in self.conns:
            if conn.transport is not None:
                conn.transport.abort()


async def serve(host: str, port: int, hold: float) -> None:
    client = Client(host, port)
    beat = asyncio.create_task(client.heartbeat())
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), hold)
            if not line:
                break
            cmd, *args = line.split()
            if cmd == "open":
                answer = await client.open(int(args[0]), int(args[1]))
            else:
                answer = {"error": f"unknown command {cmd!r}"}
            print(json.dumps(answer), flush=True)
    except TimeoutError:
        pass
    finally:
        beat.cancel()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--hold", type=float, default=600.0, help="exit after this long idle")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(serve(args.host, args.port, args.hold))
    os._exit(0)  # the stdin reader thread may still block in readline


if __name__ == "__main__":
    main()
