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
