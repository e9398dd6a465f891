"""A load client on qrouter's own client API (qrouter.client), the counterpart of amqp_load.c.

    client_load.py send HOST PORT ADDR COUNT BODY_SIZE --mode plain|at-least-once|exactly-once
                   [--window N] [--rate R] [--container ID]
    client_load.py recv HOST PORT ADDR COUNT CREDIT BODY_SIZE --mode ... [--container ID]
                   [--ready FILE]

It prints the same report lines as amqp_load (tools/bench/run.py reads both):

    SEND count= settled_mode=unsettled accepted= other= secs= rate= cpu_s= acc_n= acc_p50= ...
    RECV count= expected= secs= rate= lat_us p50= p90= p99= p99.9= max= cpu_s=

The links are what an application of that kind uses (docs/client.md, docs/exactly-once.md):

* plain: terminus durability 0, receiver-settle-mode first;
* at-least-once: durable (2, expiry never) links, resumed on a reconnect; settle-mode first;
* exactly-once: durable links with receiver-settle-mode second (``exactly_once=True``).

No state file: the unsettled maps live in the Client (they survive reconnects and router
restarts, not a crash of this process).

The sender submits COUNT messages as fast as the window of unsettled deliveries allows
(``--window``; or at ``--rate`` msg/s), each body starting with its CLOCK_MONOTONIC send time
in ns, and times each one's outcome (accept latency: submit -> Outcome). Its rate is COUNT
over the span from the first submit to the last outcome. The receiver accepts every message
and takes its one-way latency from the timestamp, read from the last BODY_SIZE bytes of the
payload (the data section is the message's last section); with exactly-once it then waits
(at most 5 s) until the router has settled every delivery. It gives up after 5 s without a
message, and writes FILE (``--ready``) once its link is attached.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import resource
import struct
import sys
import time
from pathlib import Path
from typing import Any

from qrouter.client import Client, Outcome

IDLE_S = 5.0
MODES = ("plain", "at-least-once", "exactly-once")


def link_options(mode: str) -> tuple[int, bool]:
    """(terminus durability, exactly_once) of the mode's links; expiry is always never."""
    return (0 if mode == "plain" else 2), mode == "exactly-once"


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def percentiles(values: list[int]) -> list[int]:
    """p50, p90, p99, p99.9 and max (amqp_load.c's indexing), zeros when empty."""
    if not values:
        return [0] * 5
    v = sorted(values)
    n = len(v)
    return [v[n // 2], v[int(n * 0.9)], v[int(n * 0.99)], v[int(n * 0.999)], v[-1]]


async def send(args: argparse.Namespace) -> str:
    url = f"amqp://{args.host}:{args.port}"
    client = await Client.connect(url, args.container or "client-load-send", reconnect=False)
    durable, eo = link_options(args.mode)
    sender = await client.sender(
        args.addr,
        f"load-send-{args.addr}",
        durable=durable,
        exactly_once=eo,
        max_in_flight=args.window,
    )
    pad = b"x" * (max(args.body, 8) - 8)
    acc_us: list[int] = []
    counts = {"accepted": 0, "other": 0, "failed": 0}
    room = asyncio.Event()
    done = asyncio.Event()
    in_flight = 0
    t_last = 0

    def finished(t0: int, fut: asyncio.Future[Outcome]) -> None:
        nonlocal in_flight, t_last
        t_last = time.monotonic_ns()
        acc_us.append((t_last - t0) // 1000)
        in_flight -= 1
        if fut.cancelled() or fut.exception() is not None:
            counts["failed"] += 1
        elif fut.result().state == "accepted":
            counts["accepted"] += 1
        else:
            counts["other"] += 1
        if in_flight < args.window:
            room.set()
        if len(acc_us) == args.count:
            done.set()

    t_first = time.monotonic_ns()
    for i in range(args.count):
        if args.rate:
            due = t_first + i * 1_000_000_000 // args.rate
            wait = due - time.monotonic_ns()
            if wait > 0:
                await asyncio.sleep(wait / 1e9)
        while in_flight >= args.window:
            room.clear()
            await room.wait()
        t = time.monotonic_ns()
        in_flight += 1
        fut = sender.submit(struct.pack("<q", t) + pad)
        fut.add_done_callback(functools.partial(finished, t))
    timeout = 30 + args.count / 1000
    try:
        await asyncio.wait_for(done.wait(), timeout)
    except TimeoutError:
        print(f"sender: {args.count - len(acc_us)} outcomes missing after {timeout:.0f} s")
    secs = (t_last - t_first) / 1e9 if acc_us else 0.0
    await client.close()
    q = percentiles(acc_us)
    return (
        f"SEND count={args.count} settled_mode=unsettled accepted={counts['accepted']}"
        f" other={counts['other'] + counts['failed']} secs={secs:.3f}"
        f" rate={args.count / secs if secs else 0:.0f} cpu_s={cpu_s():.2f} acc_n={len(acc_us)}"
        f" acc_p50={q[0]} acc_p90={q[1]} acc_p99={q[2]} acc_p99.9={q[3]} acc_max={q[4]}"
    )


async def recv(args: argparse.Namespace) -> str:
    url = f"amqp://{args.host}:{args.port}"
    client = await Client.connect(url, args.container or "client-load-recv", reconnect=False)
    durable, eo = link_options(args.mode)
    receiver = await client.receiver(
        args.addr, f"load-recv-{args.addr}", durable=durable, exactly_once=eo, credit=args.credit
    )
    if args.ready:
        Path(args.ready).touch()
    tail = max(args.body, 8)
    lat_us: list[int] = []
    received = 0
    t_first = t_last = 0
    last_progress = time.monotonic()

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(0.5)
            if time.monotonic() - last_progress > IDLE_S:
                print(f"receiver idle {IDLE_S:.0f}s, giving up at {received}/{args.count}")
                await receiver.close(suspend=True)
                return

    dog = asyncio.get_running_loop().create_task(watchdog())
    async for msg in receiver:
        t = time.monotonic_ns()
        payload = msg.payload
        if len(payload) >= tail:
            (ts,) = struct.unpack_from("<q", payload, len(payload) - tail)
            lat_us.append(max(0, (t - ts) // 1000))
        if received == 0:
            t_first = t
        t_last = t
        received += 1
        last_progress = time.monotonic()
        await msg.accept()
        if received >= args.count:
            break
    if args.mode == "exactly-once":
        # the router settles after the publisher did (§3.8.3): wait for it, bounded
        deadline = time.monotonic() + IDLE_S
        while receiver.unsettled and time.monotonic() < deadline and not receiver.closed:
            await asyncio.sleep(0.01)
    dog.cancel()
    await client.close()
    secs = (t_last - t_first) / 1e9
    q = percentiles(lat_us)
    return (
        f"RECV count={received} expected={args.count} secs={secs:.3f}"
        f" rate={received / secs if secs else 0:.0f} lat_us p50={q[0]} p90={q[1]} p99={q[2]}"
        f" p99.9={q[3]} max={q[4]} cpu_s={cpu_s():.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("role", choices=("send", "recv"))
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("addr")
    p.add_argument("count", type=int)
    p.add_argument("rest", type=int, nargs="+", help="send: BODY_SIZE; recv: CREDIT BODY_SIZE")
    p.add_argument("--mode", choices=MODES, default="plain")
    p.add_argument("--window", type=int, default=1000, help="unsettled deliveries at most")
    p.add_argument("--rate", type=int, default=0, help="msg/s (0: as fast as the window allows)")
    p.add_argument("--container", help="the container-id (distinct per receiver)")
    p.add_argument("--ready", help="a file to create once the link is attached")
    args = p.parse_args(argv)
    if args.role == "send":
        args.body = args.rest[0]
    else:
        if len(args.rest) < 2:
            p.error("recv needs CREDIT BODY_SIZE")
        args.credit, args.body = args.rest[:2]
    runner: Any
    try:  # as the router does: uvloop when installed
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    line = str(runner(send(args) if args.role == "send" else recv(args)))
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
