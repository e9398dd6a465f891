"""A durable producer resuming after a router crash gets credit for what it must resume.

2.6.13: after a re-attach the sender resends (resume=true) the deliveries both ends still
hold. The router grants a producer credit while its consumers have some to spare; after a
SIGKILL and a restart on LMDB, the consumer that re-attached first spends its credit on the
router's own resumed copies, so without credit of its own the producer could never send the
transfers the resumption asks of it. Raw frames on both ends (tests/engine/pump.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from qrouter._fast.codec import Symbol, UInt

from qrouter import stores
from tests.engine.pump import (
    AMQP_HEADER,
    DISPOSITION,
    SOURCE,
    TARGET,
    Frame,
    attach_frame,
    begin_frame,
    described,
    flow_frame,
    message_bytes,
    open_frame,
    perf,
    transfer_frame,
)
from tests.harness import free_port
from tests.interop.raw_amqp import RawSocket

N = 10
ADDRESS = "resume/credit"

pytestmark = pytest.mark.skipif(
    not stores.available("lmdb"),
    reason=f"the lmdb store's driver is not installed: pip install {stores.DRIVERS['lmdb']}",
)


def durable(code: int) -> Any:
    """A terminus with durable unsettled-state that never expires (3.5.5, 3.5.6)."""
    return described(code, address=ADDRESS, durable=UInt(2), expiry_policy=Symbol("never"))


def connect(port: int, container: str) -> RawSocket:
    s = RawSocket(port, timeout=15.0)
    s.send(AMQP_HEADER)
    assert s.header() == AMQP_HEADER
    s.send(open_frame(container) + begin_frame())
    return s


def until(s: RawSocket, want: Callable[[Frame], bool], what: str) -> list[Frame]:
    """Frames up to and including the first *want* accepts (each read bounded by the
    socket's timeout); a DETACH or CLOSE on the way fails the test."""
    seen: list[Frame] = []
    while True:
        f = s.frame()
        assert f is not None, f"connection closed waiting for {what}; got {seen}"
        seen.append(f)
        assert f.name not in ("detach", "close"), f"{f.name} waiting for {what}: {f.fields}"
        if want(f):
            return seen


def consumer(port: int, credit: int, unsettled: dict[bytes, Any] | None) -> RawSocket:
    s = connect(port, "consumer")
    s.send(
        attach_frame("in", 0, sender=False, source=durable(SOURCE), unsettled=unsettled)
        + flow_frame(handle=UInt(0), delivery_count=0, link_credit=credit)
    )
    return s


def producer_attach(s: RawSocket, unsettled: dict[bytes, Any] | None) -> None:
    s.send(
        attach_frame(
            "out",
            0,
            sender=True,
            target=durable(TARGET),
            snd_settle_mode=0,
            rcv_settle_mode=1,
            unsettled=unsettled,
        )
    )


def transfers(s: RawSocket, n: int) -> list[Frame]:
    got: list[Frame] = []
    while len(got) < n:
        f = until(s, lambda f: f.name == "transfer", f"transfer {len(got) + 1} of {n}")[-1]
        got.append(f)
    return got


def test_resuming_producer_gets_credit_after_sigkill(router: Any, tmp_path: Path) -> None:
    port = free_port()
    args = ["--store", "lmdb", "--store-path", str(tmp_path / "store")]

    def start(n: int) -> Any:
        # the same id, port and store: the restarted router has these termini (2.6.1)
        return router(f"r{n}", router_id="r", listeners=[{"port": port}], extra_args=args)

    r = start(0)
    tags = [f"t{i}".encode() for i in range(N)]
    cons = consumer(port, N, None)
    until(cons, lambda f: f.name == "attach", "the consumer's attach")
    prod = connect(port, "producer")
    producer_attach(prod, None)
    until(prod, lambda f: f.name == "flow" and (f.fields.get("link_credit") or 0) >= N, "credit")
    for i, tag in enumerate(tags):
        prod.send(transfer_frame(0, i, tag, message_bytes(body=f"m{i}")))
    # the consumer has all N (the router records each before forwarding it) and settles
    # none: the router holds all N, forwarded, unsettled at both ends
    first_run = transfers(cons, N)  # in the producer's order (one link, one consumer)
    index = {bytes(f.fields["delivery_tag"]): i for i, f in enumerate(first_run)}
    assert len(index) == N
    r.kill()
    cons.close()
    prod.close()

    start(1)
    # the consumer comes back first and its credit goes to the router's resumed copies
    cons = consumer(port, N, {tag: None for tag in index})
    resent = transfers(cons, N)
    assert {bytes(f.fields["delivery_tag"]) for f in resent} == set(index)
    # the producer resumes: its map names all N, which the router still holds
    prod = connect(port, "producer")
    producer_attach(prod, {tag: None for tag in tags})
    seen = until(
        prod,
        lambda f: f.name == "flow" and (f.fields.get("link_credit") or 0) >= N,
        f"credit for the {N} deliveries to resume",
    )
    attach = next(f for f in seen if f.name == "attach")
    assert set(attach.fields["unsettled"] or {}) == set(tags), "the router holds all N"
    # 2.6.13: the resuming transfers re-bind to the held deliveries (no new copies) and
    # the consumer's outcome for one reaches the producer
    for i, tag in enumerate(tags):
        prod.send(transfer_frame(0, i, tag, message_bytes(body=f"m{i}"), resume=True))
    first = resent[0]
    cons.send(
        perf(
            DISPOSITION,
            role=True,
            first=first.fields["delivery_id"],
            settled=True,
            state=described(0x24),
        )
    )
    outcome = until(prod, lambda f: f.name == "disposition", "the consumer's outcome")[-1]
    assert outcome.fields["first"] == index[bytes(first.fields["delivery_tag"])]
    cons.close()
    prod.close()
