"""One harness for tests that run real router processes.

Modelled on skupper-router's ``tests/system_test.py``: every router is a real
``python -m qrouter start`` process, started in the test's own folder, listening
on free loopback ports only. Its output goes to a log file in that folder; the
test checks the exit status it expects when it stops the router, and the log
tail is printed whenever something goes wrong (early exit, bad exit status, a
port that never opened, a failed test).

Every wait here is bounded: nothing blocks for longer than the timeout it is
given, and every timeout has a default.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

HOST = "127.0.0.1"
# The root of the work tree: the router runs from it so `python -m qrouter`
# imports this checkout (with its in-place built extensions), not an older
# installed copy.
ROOT = Path(__file__).resolve().parent.parent

DEFAULT_TIMEOUT = float(os.environ.get("QROUTER_TEST_TIMEOUT", "20"))

T = TypeVar("T")


class HarnessError(AssertionError):
    """A router process did not behave as the test expected.

    An AssertionError so pytest reports it as a test failure with its message,
    which carries the router's log tail.
    """


def free_port(host: str = HOST) -> int:
    """A TCP port on *host* that nothing listens on right now.

    Binding port 0 lets the kernel pick; the socket is closed at once and the
    port handed to the router. SO_REUSEADDR keeps the TIME_WAIT of a previous
    test from getting in the way. (A tiny race with another process picking the
    same port is possible; the kernel hands out ephemeral ports round-robin,
    which makes it very unlikely.)

    The kernel may hand the same port out twice in a row, since nothing holds
    it between the calls: a router given one port for its normal and its
    inter-router listener then refuses to start. So a port handed out before in
    this process is never handed out again.
    """
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise HarnessError("no loopback port left that was not handed out before")


_handed_out: set[int] = set()


def retry(
    fn: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    delay: float = 0.05,
    max_delay: float = 0.5,
    message: str | Callable[[], str] = "",
) -> T:
    """Call *fn* until it returns a truthy value; return that value.

    Exceptions raised by *fn* count as "not yet" until the deadline, then the
    last one is chained to the HarnessError. The delay between calls doubles
    up to *max_delay*.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    result: T | None = None
    while True:
        try:
            result = fn()
            if result:
                return result
            last_exc = None
        except Exception as exc:  # noqa: BLE001 - any failure means "retry"
            last_exc = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, max_delay)
    text = message() if callable(message) else message
    detail = f"{text} " if text else ""
    raise HarnessError(
        f"{detail}(retry of {getattr(fn, '__name__', fn)!r} gave up after {timeout}s; "
        f"last result {result!r}, last error {last_exc!r})"
    ) from last_exc


def port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """True when a TCP connect to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 60) -> str:
    """The last *lines* lines of a text file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"<no log file {path}>"
    chunk = text.splitlines()[-lines:]
    return "\n".join(chunk) if chunk else "<empty log>"


# --------------------------------------------------------------------------
# TOML writing: tomllib only reads, and the config files the harness writes
# use a handful of value types.


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        s = str(value).replace("\\", "\\\\").replace('"', '\\"')
        return f'"{s}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):  # an inline table (e.g. connector = [{host = ...}])
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(top: Mapping[str, Any], tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Render top-level keys then arrays of tables (``[[listener]]``...)."""
    out = [f"{k} = {_toml_value(v)}" for k, v in top.items() if v is not None]
    for name, rows in tables.items():
        for row in rows:
            out.append("")
            out.append(f"[[{name}]]")
            out.extend(f"{k} = {_toml_value(v)}" for k, v in row.items() if v is not None)
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------


@dataclass
class Listener:
    """One listening socket of a router.

    ``options`` are the extra ``[[listener]]`` keys (``tls_cert``,
    ``sasl_mechanisms``, ``max_frame_size``...). A listener with options makes
    the router start from a TOML config file, since ``--listen`` takes only
    ``HOST:PORT``.
    """

    port: int
    host: str = HOST
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        scheme = "amqps" if self.options.get("tls_cert") else "amqp"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class Process(subprocess.Popen):  # type: ignore[type-arg]
    """A subprocess whose output goes to ``<directory>/<name>.out``.

    ``expect`` is the exit status the test expects when it is stopped (None
    means "still running"); ``teardown()`` checks it.
    """

    def __init__(
        self,
        args: Sequence[str],
        name: str,
        directory: Path,
        expect: int | None = 0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.outfile = self.directory / f"{name}.out"
        self.cmdfile = self.directory / f"{name}.cmd"
        self.expect = expect
        self.reported = False
        self.stopping = False  # stop() was called: an exit from now on is expected
        self.args_list = list(args)
        # A process started again under the same name (a router restarted on its store) keeps
        # its predecessor's log as <name>.out.1, .2 ...: the lines before a kill are what
        # explains a failure after the restart. The new log starts empty, as tests read it.
        if self.outfile.exists():
            n = 1
            while self.outfile.with_name(f"{name}.out.{n}").exists():
                n += 1
            self.outfile.rename(self.outfile.with_name(f"{name}.out.{n}"))
        self.cmdfile.write_text(" ".join(self.args_list) + "\n")
        self._out = open(self.outfile, "wb")  # noqa: SIM115 - closed in teardown
        full_env = dict(os.environ)
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        super().__init__(
            self.args_list,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(self.directory),
            env=full_env,
            start_new_session=True,  # a ^C to pytest does not hit the router first
        )

    def log_tail(self, lines: int = 60) -> str:
        if not self._out.closed:
            self._out.flush()
        return tail(self.outfile, lines)

    def failure(self, what: str) -> HarnessError:
        # Reported once: teardown does not raise the same exit status again.
        self.reported = True
        return HarnessError(
            f"{self.name} (pid {self.pid}): {what}\n"
            f"command: {' '.join(self.args_list)}\n"
            f"--- last lines of {self.outfile} ---\n{self.log_tail()}"
        )

    def check_running(self) -> None:
        """Fail at once, with the log tail, if the process has exited."""
        rc = self.poll()
        if rc is not None:
            raise self.failure(f"exited early with status {rc}")

    def stop(self, timeout: float = 10.0, expect: int | None = 0) -> int:
        """SIGTERM, wait at most *timeout*, and check the exit status.

        A process that ignores SIGTERM past the timeout is SIGKILLed and the
        test fails: clean shutdown on SIGTERM is part of the contract.
        """
        self.stopping = True
        if self.poll() is None:
            self.send_signal(signal.SIGTERM)
            try:
                self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                self.wait(5)
                self._close_out()
                raise self.failure(f"did not exit within {timeout}s of SIGTERM") from None
        self._close_out()
        rc = self.returncode
        if expect is not None and rc != expect:
            raise self.failure(f"exit status {rc}, expected {expect}")
        return rc

    def kill(self) -> None:
        """SIGKILL (for crash tests); waits, bounded, for the process to go."""
        if self.poll() is None:
            super().kill()
            self.wait(10)
        self.expect = None  # the status after SIGKILL is not the test's concern

    def teardown(self) -> None:
        """Stop a process still running and check its expected exit status."""
        if self.expect is None or (self.reported and self.poll() is not None):
            if self.poll() is None:
                super().kill()
                self.wait(10)
            self._close_out()
            return
        if not self.stopping and self.poll() is not None:
            # Nobody asked it to stop: a crash, or a signal from outside the test.
            self._close_out()
            raise self.failure(f"exited during the test (status {self.returncode})")
        self.stop(expect=self.expect)

    def _close_out(self) -> None:
        if not self._out.closed:
            self._out.close()


def _address_row(prefix: str, dist: str) -> dict[str, str]:
    """A config-file address entry from ``PREFIX`` and ``DISTRIBUTION[,GUARANTEE]``."""
    row = {("pattern" if ("*" in prefix or "#" in prefix) else "prefix"): prefix}
    distribution, _, guarantee = dist.partition(",")
    row["distribution"] = distribution
    if guarantee:
        row["guarantee"] = guarantee
    return row


class Router(Process):
    """A ``qrouter`` process.

    Plain listeners are given as ``--listen HOST:PORT``; when any listener has
    options, or *config* holds top-level settings, the whole setup is written
    to ``<name>.toml`` and passed with ``--config`` instead (the CLI and the
    config file both get exercised across the suite).
    """

    def __init__(
        self,
        directory: Path,
        name: str = "router",
        listeners: Iterable[Mapping[str, Any] | Listener] | int = 1,
        addresses: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        router_id: str | None = None,
        log_level: str = "debug",
        extra_args: Sequence[str] = (),
        expect: int | None = 0,
        wait: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.listeners: list[Listener] = []
        if isinstance(listeners, int):
            listeners = [{} for _ in range(listeners)]
        for spec in listeners:
            if isinstance(spec, Listener):
                self.listeners.append(spec)
                continue
            opts = dict(spec)
            host = opts.pop("host", HOST)
            port = opts.pop("port", None) or free_port(host)
            self.listeners.append(Listener(port=port, host=host, options=opts))
        self.addresses = dict(addresses or {})
        self.config = dict(config or {})
        self.router_id = router_id or name
        self.config_file: Path | None = None

        args = [sys.executable, "-m", "qrouter", "start", "--log-level", log_level]
        if self.config or any(lst.options for lst in self.listeners):
            self.config_file = Path(directory) / f"{name}.toml"
            Path(directory).mkdir(parents=True, exist_ok=True)
            top = {"id": self.router_id, **self.config}
            listener_rows = [
                {"host": lst.host, "port": lst.port, **lst.options} for lst in self.listeners
            ]
            address_rows = [_address_row(p, d) for p, d in self.addresses.items()]
            self.config_file.write_text(
                to_toml(top, {"listener": listener_rows, "address": address_rows})
            )
            args += ["--config", str(self.config_file)]
        else:
            args += ["--id", self.router_id]
            for lst in self.listeners:
                args += ["--listen", lst.address]
            for prefix, dist in self.addresses.items():
                args += ["--address", f"{prefix}={dist}"]
        # the tox factor's terminus store (QROUTER_STORE) backs every router of the suite
        store = os.environ.get("QROUTER_STORE", "memory")
        if store != "memory" and "--store" not in extra_args and "store" not in self.config:
            args += ["--store", store, "--store-path", str(Path(directory) / f"{name}-store")]
        args += list(extra_args)

        env = {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        }
        super().__init__(args, name=name, directory=Path(directory), expect=expect, env=env)
        if wait:
            self.wait_ports(timeout)

    @property
    def port(self) -> int:
        return self.listeners[0].port

    @property
    def url(self) -> str:
        """URL of the first listener (``amqp://127.0.0.1:PORT``)."""
        return self.listeners[0].url

    def addr(self, address: str, listener: int = 0) -> str:
        """URL of *address* on a listener, for proton's ``create_sender``."""
        return f"{self.listeners[listener].url}/{address}"

    def wait_ports(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until every listener accepts TCP connections.

        Fails at once, with the log tail, if the router exits meanwhile.
        """
        deadline = time.monotonic() + timeout
        for lst in self.listeners:
            while True:
                self.check_running()
                if port_open(lst.port, lst.host, timeout=0.5):
                    break
                if time.monotonic() > deadline:
                    raise self.failure(f"port {lst.address} not open after {timeout}s")
                time.sleep(0.05)


class MeshRouter(Router):
    """A ``qrouter`` process that is part of a mesh (issue 4, docs/mesh.md).

    It listens for other routers on ``inter_port`` (a free port unless given, so a restarted
    router can reuse its predecessor's) and connects to the inter-router ports in
    ``connect``. ``wait_ports`` waits for the inter-router port too. Everything else is as for
    `Router`.
    """

    def __init__(
        self,
        directory: Path,
        name: str = "router",
        *,
        inter_port: int | None = None,
        connect: Sequence[int] = (),
        extra_args: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        self.inter_port = inter_port or free_port()
        self.connect_ports = list(connect)
        args = [
            "--inter-router-listen",
            f"{HOST}:{self.inter_port}",
            "--inter-router-connect",
            ",".join(f"{HOST}:{port}" for port in self.connect_ports),
            *extra_args,
        ]
        super().__init__(directory, name=name, extra_args=args, **kwargs)

    def wait_ports(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().wait_ports(timeout)
        deadline = time.monotonic() + timeout
        while not port_open(self.inter_port, HOST, timeout=0.5):
            self.check_running()
            if time.monotonic() > deadline:
                raise self.failure(f"inter-router port {self.inter_port} not open after {timeout}s")
            time.sleep(0.05)

    def log_text(self) -> str:
        """The whole log so far (tests look for a line, e.g. a refusal)."""
        if not self._out.closed:
            self._out.flush()
        return self.outfile.read_text(errors="replace")
