"""Wake-ups per message (issue 18): at a low rate every message is its own wake-up, so what a
router costs there is set by how often it sleeps and is woken. Through a real router and
through the bench's byte relay, the proton-C yardstick (amqp_load) sends unsettled messages
spaced a few milliseconds apart, and the intermediary's voluntary context switches
(`Router.wakeups`, /proc/PID/task/*/status) over the run are counted: at most two per message,
the message's read and its disposition's, as for the relay, plus the handshakes and the
router's timers (about ten a second). A timer, a deferred flush or a blocking call per message
or per read would add one per message. A count, not a timing; the latency scenario's note
(`wake-ups/msg`) carries the same figure."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from qrouter_tools.bench import latency
from qrouter_tools.bench import run as bench
from qrouter_tools.bench.run import Config, Router, find_relay

COUNT = 300
RATE = 300  # messages 3.3 ms apart: the sender's 1 ms timer sends each on its own
PER_MSG = 2.25  # the message's read and its disposition's; a third per message fails
FIXED = 60  # the handshakes, the receiver's flows, the router's timers over about 1.5 s


def config(load: Path, logs: Path) -> Config:
    return Config(
        load=load, count=COUNT, repeat=1, body=100, credit=100, rate=RATE, idle_n=0, logs=logs
    )


def test_a_message_costs_the_router_at_most_two_wake_ups(load_bin: Path, tmp_path: Path) -> None:
    cfg = config(load_bin, tmp_path)
    with Router(tmp_path, "wake-ups") as router:
        before = router.wakeups()
        run = bench.run_load(cfg, router.port, "wakeups.q", count=COUNT, rate=RATE)
        router.check()
        woken = router.wakeups() - before
    assert run.received == COUNT and run.sent == COUNT
    assert 0 < woken <= PER_MSG * COUNT + FIXED, f"{woken} wake-ups for {COUNT} messages"


def test_the_relay_rows_count_wake_ups_as_the_routers(load_bin: Path, tmp_path: Path) -> None:
    """The floor the router is compared with: the byte relay pays the same two per message."""
    if not shutil.which(os.environ.get("CC", "cc")):
        pytest.skip("no C compiler: the bench's byte relay is built with the system cc")
    find_relay()
    run = latency.relay_run(bench, config(load_bin, tmp_path), 1, 0, "wakeups.r", COUNT, RATE)
    assert run.received == COUNT
    assert run.router_wakeups is not None
    assert 0 < run.router_wakeups <= PER_MSG * COUNT + FIXED, run.router_wakeups
    rows = latency.rows_of(bench, RATE, ["relay (1 hop)"], {"relay (1 hop)": [run]}, {})
    assert f"wake-ups/msg {run.router_wakeups / COUNT:.2f}" in rows[0].note
