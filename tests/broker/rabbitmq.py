"""A private RabbitMQ (Debian's rabbitmq-server 3.10, its bundled rabbitmq_amqp1_0 plugin)
for the broker tests: a plain process on loopback ports, its state in a temporary folder,
stopped by its PID (process group). Facts behind each setting: /work/shared/notes/rabbitmq.md
and docs/brokers.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.certs import make_certs
from tests.harness import HOST, free_port, port_open, tail

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # not /usr/sbin's wrapper: it changes user
STARTUP_TIMEOUT = 60.0  # seconds; it takes about 6 s on a 2-core machine


def missing() -> str | None:
    """Why RabbitMQ cannot run here (None: it can)."""
    if not os.path.exists(SERVER) or shutil.which("erl") is None:
        return "rabbitmq-server is not installed: apt-get install rabbitmq-server"
    return None


class RabbitMQ:
    """One broker node. `start()` waits until its AMQP port accepts connections and records
    how long that took (`startup_seconds`); `kill()` is SIGKILL (its state stays on disk,
    durable queues survive); `start()` again restarts it on the same ports and state."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.tls_port = free_port()  # TLS with a throw-away CA (tests/certs.py): self.certs.ca
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.node = f"qrouter-test-{os.getpid()}-{self.port}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0
        self.log = directory / "rabbitmq.out"
        home = directory / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(f"qroutertest{self.port}")
            cookie.chmod(0o400)
        (directory / "enabled_plugins").write_text("[rabbitmq_amqp1_0].\n")
        self.certs = make_certs(directory / "certs")
        (directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {HOST}:{self.port}\n"
            f"listeners.ssl.default = {HOST}:{self.tls_port}\n"
            f"ssl_options.cacertfile = {self.certs.ca}\n"
            f"ssl_options.certfile = {self.certs.server_cert}\n"
            f"ssl_options.keyfile = {self.certs.server_key}\n"
            "ssl_options.verify = verify_none\n"
            "ssl_options.fail_if_no_peer_cert = false\n"
            "loopback_users = none\n"  # guest from 127.0.0.1 only anyway: loopback ports
            "log.console = true\n"
            "log.file = false\n"
        )
        self.env = {
            **os.environ,
            "HOME": str(home),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": HOST,
            "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(directory / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq.conf"),
        }
        self.env.pop("RABBITMQ_ALLOW_INPUT", None)  # an interactive shell halts at EOF

    def start(self) -> None:
        started = time.monotonic()
        if self.epmd is None:
            # our own epmd in the foreground, stopped by its PID: the one the broker would
            # start itself daemonizes (`epmd -daemon`) out of the broker's process group
            epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
            self.epmd = subprocess.Popen(
                [epmd, "-address", HOST, "-port", str(self.epmd_port)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [SERVER],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: epmd goes with it
            )
        deadline = started + STARTUP_TIMEOUT
        while not port_open(self.port, HOST, timeout=0.5):
            if self.proc.poll() is not None:
                raise AssertionError(f"RabbitMQ exited at start:\n{tail(self.log)}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"RabbitMQ not up after {STARTUP_TIMEOUT}s:\n{tail(self.log)}")
            time.sleep(0.1)
        self.startup_seconds = time.monotonic() - started

    def _signal(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None and sig != signal.SIGKILL:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the group we started: beam, epmd, erl_child_setup
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash: nothing flushed that was not yet)."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._wait_closed()

    def stop(self) -> None:
        """SIGTERM (a clean shutdown, 1-2.5 s), SIGKILL if it lingers."""
        if self.proc is None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        self._signal(signal.SIGKILL)  # anything left in the group
        self.proc.wait(timeout=10)
        self.proc = None
        if self.epmd is not None:
            self.epmd.kill()
            self.epmd.wait(timeout=10)
            self.epmd = None

    def _wait_closed(self) -> None:
        deadline = time.monotonic() + 10
        while port_open(self.port, HOST, timeout=0.2) and time.monotonic() < deadline:
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"amqp://{HOST}:{self.port}"
