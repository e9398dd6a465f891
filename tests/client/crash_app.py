"""An application using router.client with a state file, for tests/client/test_client_crash.py,
which SIGKILLs and restarts it.

    python -m tests.client.crash_app pub URL STATE_FILE N
        publish m0 .. m{N-1} exactly-once on the topic; after a restart, continue from
        `sender.submitted` (the client resumes the unsettled ones); exit 0 when all are
        accepted
    python -m tests.client.crash_app sub URL STATE_FILE N OUT
        receive exactly-once; each message is processed by appending its body to OUT (fsync)
        and then accepted; exit 0 once N distinct bodies are in OUT and nothing is unsettled

Processing and accepting are two steps: a crash between them leaves a message the client
yields again after the restart, flagged `redelivered` (docs/client.md); only then does the
application look in OUT for it. Everything else it processes blindly, so a message the client
yields twice unflagged shows up twice in OUT.
"""

from __future__ import annotations

import asyncio
import os
import sys

from qrouter.client import Client

TOPIC = "events"
OPTS = {"backoff": (0.05, 0.5), "reconnect_timeout": 60.0, "connect_timeout": 5.0}


async def publish(url: str, state: str, n: int) -> None:
    client = await Client.connect(url, "crash-pub", state_file=state, **OPTS)
    sender = await client.sender(TOPIC, "pub-out", exactly_once=True, max_in_flight=20)
    print(f"restored {len(sender.recovered)} start {sender.submitted}", flush=True)
    futures = list(sender.recovered.values())
    for i in range(sender.submitted, n):
        while sender.unsettled >= sender.max_in_flight:
            await asyncio.sleep(0.005)
        futures.append(sender.submit(f"m{i}".encode()))
        # a steady stream of at least 4.8 s for 400 messages, so that the test's first kill of
        # each application (within 3 s) lands mid-stream however fast the machine is
        await asyncio.sleep(0.012)
    outcomes = await asyncio.wait_for(asyncio.gather(*futures), 60)
    bad = [o.state for o in outcomes if not o.accepted]
    print(f"done {sender.submitted} unsettled {sender.unsettled} bad {bad}", flush=True)
    await client.close(suspend=True)
    sys.exit(1 if bad or sender.unsettled else 0)


async def subscribe(url: str, state: str, n: int, out: str) -> None:
    client = await Client.connect(url, "crash-sub", state_file=state, **OPTS)
    receiver = await client.receiver(TOPIC, "sub-in", exactly_once=True, credit=20)
    seen: set[str] = set()
    if os.path.exists(out):
        with open(out) as f:
            seen = {line.strip() for line in f if line.strip()}
    redelivered = 0
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    while len(seen) < n or receiver.unsettled:
        if len(seen) >= n:
            # every message processed: the router's settlements follow; they are not what
            # this test checks (tests/guarantee cover them), so wait for them a while only
            deadline = deadline or loop.time() + 10
            if loop.time() > deadline:
                break
        try:
            received = await receiver.receive(timeout=0.5)
        except TimeoutError:
            continue
        assert received is not None
        body = received.message.body
        text = body.decode() if isinstance(body, bytes) else str(body)
        if received.redelivered:
            redelivered += 1
        if not (received.redelivered and text in seen):
            os.write(fd, (text + "\n").encode())
            os.fsync(fd)
            seen.add(text)
        await received.accept()
    left = [(t, r.state, r.restored) for t, r in receiver._records.items()]
    print(f"done {len(seen)} redelivered {redelivered} unsettled {left}", flush=True)
    await client.close(suspend=True)


def main() -> None:
    role, url, state, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if role == "pub":
        asyncio.run(publish(url, state, n))
    else:
        asyncio.run(subscribe(url, state, n, sys.argv[5]))


if __name__ == "__main__":
    main()
