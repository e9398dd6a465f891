"""A non-Python AMQP stack drives the router: proton-C's example clients.

Debian's libqpid-proton11-dev-examples ships the C sources
(/usr/share/proton/examples/c: send.c, receive.c, send-ssl.c); the test
compiles them with gcc against libqpid-proton (proactor API) and runs them as
processes against the router, alone and mixed with Python clients.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from proton import Message

from tests.certs import Certs, tls_listener
from tests.clients import pump_until

EXAMPLES = Path("/usr/share/proton/examples/c")
HEADER = Path("/usr/include/proton/proactor.h")
PROGRAMS = ("send", "receive", "send-ssl")


@pytest.fixture(scope="module")
def c_clients(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (gcc) to build the proton-C example clients")
    if not HEADER.exists():
        pytest.skip(f"proton-C headers missing ({HEADER}): apt-get install libqpid-proton11-dev")
    missing = [p for p in PROGRAMS if not (EXAMPLES / f"{p}.c").exists()]
    if missing:
        pytest.skip(
            f"proton-C example sources missing in {EXAMPLES}: apt-get install libqpid-proton11-dev-examples"
        )
    out = tmp_path_factory.mktemp("proton-c")
    built = {}
    for name in PROGRAMS:
        exe = out / name
        # -lqpid-proton is the all-in-one library (core + proactor) of the -dev package
        proc = subprocess.run(
            [gcc, "-O1", "-o", str(exe), str(EXAMPLES / f"{name}.c"), "-lqpid-proton", "-lpthread"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"building {name}.c failed:\n{proc.stderr}"
        built[name] = exe
    return built


def run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=5)
        raise AssertionError(
            f"{proc.args[0]} did not finish in {timeout}s\nstdout: {out}\nstderr: {err}"
        ) from None
    return proc.returncode, out, err


def test_c_sender_to_c_receiver(router: Any, c_clients: dict[str, Path]) -> None:
    r = router()
    port = str(r.port)
    receiver = start([str(c_clients["receive"]), "127.0.0.1", port, "c/examples", "100"])
    try:
        sent = run([str(c_clients["send"]), "127.0.0.1", port, "c/examples", "100"])
    finally:
        rc, out, err = finish(receiver)
    assert sent.returncode == 0, f"send: {sent.stdout}{sent.stderr}"
    assert "100 messages sent and acknowledged" in sent.stdout
    assert rc == 0, f"receive: {out}{err}"
    assert "100 messages received" in out
    # receive.c prints each body: {"sequence"=N}; all 100, once each
    bodies = [line for line in out.splitlines() if line.startswith("{")]
    assert sorted(bodies) == sorted(f'{{"sequence"={i}}}' for i in range(1, 101))


def test_c_sender_to_python_receiver(
    router: Any, blocking: Any, c_clients: dict[str, Path]
) -> None:
    r = router()
    receiver = blocking(r.url).create_receiver("c/to-python", credit=10)
    sender = start([str(c_clients["send"]), "127.0.0.1", str(r.port), "c/to-python", "10"])
    try:
        seq = []
        for _ in range(10):
            msg = receiver.receive(timeout=15)
            seq.append(msg.body["sequence"])
            receiver.accept()
        # keep our connection pumping so the last accept goes out
        pump_until(receiver.connection, lambda: sender.poll() is not None, 15, "C sender to finish")
    finally:
        rc, out, err = finish(sender)
    assert seq == list(range(1, 11))
    assert rc == 0 and "10 messages sent and acknowledged" in out, f"{out}{err}"


def test_python_sender_to_c_receiver(
    router: Any, blocking: Any, c_clients: dict[str, Path]
) -> None:
    r = router()
    receiver = start([str(c_clients["receive"]), "127.0.0.1", str(r.port), "python/to-c", "5"])
    try:
        sender = blocking(r.url).create_sender("python/to-c")
        for i in range(5):
            sender.send(Message(body={"from": "python", "n": i}), timeout=15)
    finally:
        rc, out, err = finish(receiver)
    assert rc == 0 and "5 messages received" in out, f"{out}{err}"
    assert out.count('"from"="python"') == 5


def test_c_tls_sender(router: Any, blocking: Any, c_clients: dict[str, Path], certs: Certs) -> None:
    """send-ssl.c over a TLS listener (it accepts any server certificate)."""
    r = router(listeners=[tls_listener(certs), {}])
    tls, plain = r.listeners
    receiver = blocking(plain.url).create_receiver("c/tls", credit=10)
    sender = start([str(c_clients["send-ssl"]), "127.0.0.1", str(tls.port), "c/tls", "10"])
    try:
        seq = []
        for _ in range(10):
            seq.append(receiver.receive(timeout=15).body["sequence"])
            receiver.accept()
        pump_until(receiver.connection, lambda: sender.poll() is not None, 15, "C sender to finish")
    finally:
        rc, out, err = finish(sender)
    assert seq == list(range(1, 11))
    assert rc == 0 and "10 messages sent and acknowledged" in out, f"{out}{err}"
