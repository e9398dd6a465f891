"""The byte relay of the latency bench (tools/bench/byte_relay.c, issue 18): it builds with the
system C compiler, copies bytes both ways unchanged (also when the far side reads late), closes
the pair when one side closes, and carries an AMQP exchange of the proton-C yardstick
(amqp_load) end to end, through one relay and two in series. Real loopback sockets, bounded
waits; the latency figures themselves are benchmarks, run by hand."""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from qrouter_tools.bench.run import (
    _report,
    find_relay,
    run_of,
    wait_listening,
)

WAIT_S = 10.0


@pytest.fixture(scope="module")
def relay_bin() -> Path:
    if not shutil.which(os.environ.get("CC", "cc")):
        pytest.skip("no C compiler: the bench's byte relay is built with the system cc")
    return find_relay()


@contextmanager
def relay(binary: Path, target: int, spin_us: int = 0) -> Iterator[int]:
    """A relay on an ephemeral port to 127.0.0.1:target; yields its port."""
    proc = subprocess.Popen(
        [str(binary), "0", str(target), str(spin_us)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], WAIT_S)
        assert ready, "the relay did not say it listens"
        line = proc.stdout.readline().split()
        assert line[0] == "listening", line
        yield int(line[1])
    finally:
        proc.terminate()
        proc.wait(WAIT_S)


def listener() -> socket.socket:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(WAIT_S)
    return srv


def recv_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(min(1 << 16, n - len(out)))
        assert chunk, f"closed after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


@pytest.mark.parametrize("spin_us", [0, 50])
def test_bytes_pass_unchanged_both_ways_also_when_read_late(relay_bin: Path, spin_us: int) -> None:
    payload = os.urandom(4 << 20)  # more than the socket buffers: the relay must hold and resume
    with listener() as srv, relay(relay_bin, srv.getsockname()[1], spin_us) as port:
        client = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        server, _ = srv.accept()
        server.settimeout(WAIT_S)
        with client, server:
            client.sendall(b"hello")
            assert recv_exactly(server, 5) == b"hello"
            server.sendall(b"back")
            assert recv_exactly(client, 4) == b"back"
            # 4 MiB written while the server does not read yet: the relay must hold and resume
            writer = threading.Thread(target=client.sendall, args=(payload,), daemon=True)
            writer.start()
            time.sleep(0.2)
            received = recv_exactly(server, len(payload))
            writer.join(WAIT_S)
            assert not writer.is_alive()
            assert bytes(received) == payload
            # one side closing closes the other
            client.close()
            assert server.recv(10) == b""


def test_a_refused_onward_connection_closes_the_client(relay_bin: Path) -> None:
    with listener() as srv:
        dead = srv.getsockname()[1]
    with relay(relay_bin, dead) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as client:
            assert client.recv(10) == b""


@pytest.mark.parametrize("hops", [1, 2])
def test_an_amqp_exchange_passes_through_relays(relay_bin: Path, load_bin: Path, hops: int) -> None:
    with socket.socket() as s:  # the receiver's port: free now, the receiver listens on it
        s.bind(("127.0.0.1", 0))
        recv_port = s.getsockname()[1]
    count = "500"
    recv = subprocess.Popen(
        [str(load_bin), "recv", "127.0.0.1", str(recv_port), "q", count, "100", "100", "listen"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with ExitStack() as stack:
            target = recv_port
            for _ in range(hops):
                target = stack.enter_context(relay(relay_bin, target))
            assert wait_listening(recv_port, recv, WAIT_S), "the receiver does not listen"
            send = subprocess.run(
                [str(load_bin), "send", "127.0.0.1", str(target), "q", count, "100", "0", "2000"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        out = recv.communicate(timeout=30)[0]
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait(WAIT_S)
    run = run_of(_report("SEND", send.stdout), [_report("RECV", out)], presettled=False)
    assert (run.sent, run.received, run.other) == (500, 500, 0)
    assert run.p50 > 0


def test_latency_rows_compare_qrouter_with_the_relay_of_as_many_hops() -> None:
    from qrouter_tools.bench import run as m
    from qrouter_tools.bench.latency import kinds, rows_of

    names = kinds((0, 50))
    assert names == [
        "direct",
        "relay (1 hop)",
        "relay (1 hop), spin 50 µs",
        "qrouter (1 hop)",
        "relay (2 hops)",
        "relay (2 hops), spin 50 µs",
        "qrouter (2 hops)",
    ]

    def run(p50: int, p99: int, cpu: float | None) -> m.Run:
        return m.Run(2000.0, 1000, 1000, 0, p50, p50, p99, router_cpu_s=cpu, p999=p99 * 2)

    runs: dict[str, list[m.Run]] = {k: [] for k in names}
    runs["direct"] = [run(40, 100, None)]
    runs["relay (1 hop)"] = [run(60, 200, 0.02), run(50, 150, 0.02), run(70, 300, 0.02)]
    runs["qrouter (1 hop)"] = [run(90, 400, 0.03)]
    runs["relay (2 hops)"] = [run(80, 400, 0.04)]
    runs["qrouter (2 hops)"] = [run(160, 800, 0.1)]
    rows = {r.scenario: r for r in rows_of(m, 2000, names, runs, {})}
    relay = rows["relay (1 hop) @2,000/s"]
    assert (relay.p50_us, relay.p99_us) == (60, 200)  # the median run by p99
    assert relay.router_cpu_us_per_msg == pytest.approx(20.0)
    assert "p50s 60/50/70" in relay.note and "× direct p50 1.50 / p99 2.00" in relay.note
    one = rows["qrouter (1 hop) @2,000/s"].note
    assert "× relay p50 1.50 / p99 2.00" in one and "CPU × relay 1.50" in one
    two = rows["qrouter (2 hops) @2,000/s"].note
    assert "× direct p50 4.00 / p99 8.00" in two and "× relay p50 2.00 / p99 2.00" in two
    assert rows["relay (2 hops), spin 50 µs @2,000/s"].note == "failed: no run"
