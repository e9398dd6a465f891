"""busy_poll_us is honoured (docs/performance.md, "Latency across the load range"): a router
that spins after active loop iterations still routes every message, in order, and says at
shutdown how many spins it ran; one without the option runs none. Real router processes,
python-qpid-proton clients; nothing here is timed."""

from __future__ import annotations

import re
from typing import Any

import pytest
from proton import Message
from proton.reactor import AtMostOnce

from tests.clients import run_container
from tests.mesh_system.mesh import Traffic, mesh

N = 200  # messages


def _spins(log: str) -> int | None:
    m = re.search(r"busy poll: (\d+) spins, (\d+) ended by a readable socket", log)
    return int(m.group(1)) if m else None


def _route(blocking: Any, url: str) -> None:
    conn = blocking(url)
    rcv = conn.create_receiver("busy", credit=50)
    snd = conn.create_sender("busy", options=AtMostOnce())  # send() need not wait for rcv
    got = []
    for i in range(N):
        snd.send(Message(body=i), timeout=10)
        got.append(rcv.receive(timeout=10).body)
    assert got == list(range(N))
    conn.close()


@pytest.mark.parametrize("how", ["file", "flag"])
def test_busy_poll_spins_and_routes(router: Any, blocking: Any, how: str) -> None:
    if how == "file":
        r = router(config={"busy_poll_us": 200}, log_level="info")
    else:
        r = router(extra_args=["--busy-poll-us", "200"], log_level="info")
    _route(blocking, r.url)
    r.stop()
    log = r.outfile.read_text(errors="replace")
    assert "busy poll: up to 200 µs" in log
    spins = _spins(log)
    assert spins is not None and spins > 0, log[-2000:]


def test_off_by_default(router: Any, blocking: Any) -> None:
    r = router(log_level="info")
    _route(blocking, r.url)
    r.stop()
    log = r.outfile.read_text(errors="replace")
    assert "busy poll" not in log


def test_busy_poll_over_two_hops(router: Any) -> None:
    """Both routers of a chain spin with the option, and the inter-router hop still carries
    500 unsettled messages from A to a receiver on B, in order, each accepted."""
    r = mesh(router, [("A", "B")], ["A", "B"], extra_args=["--busy-poll-us", "100"])
    t = run_container(Traffic(r["A"].url, [r["B"].url], "busy.chain", 500), timeout=60)
    assert t.received[0] == list(range(500)), "in order, each once"
    assert len(t.accepted) == 500
    for name in ("A", "B"):
        r[name].stop()
        spins = _spins(r[name].outfile.read_text(errors="replace"))
        assert spins is not None and spins > 0, name
