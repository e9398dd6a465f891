"""qrouter benchmark: one table of router throughput, latency and memory, beside direct runs.

    python tools/bench/run.py                      # from a checkout (engine built in place)
    python -m qrouter_tools.bench.run              # after `pip install .`
    ... --scenarios direct,one-hop-unsettled --count 200000 --repeat 3 --json out.json --markdown

The load client is our proton-C yardstick, amqp_load.c, compiled on first use (and whenever the
source is newer) into tools/bench/bin/ in a checkout, else ~/.cache/qrouter/bench/; the
`*-client` scenarios use client_load.py, the same load on qrouter.client, instead. Every router
scenario starts its own router on a free 127.0.0.1 port and stops it afterwards. Each rate figure
is the median of --repeat runs, beside the direct client-to-client run of the same invocation
(the receiver listens, the sender connects to it) as a ratio. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "amqp_load.c"
RELAY_SOURCE = HERE / "byte_relay.c"  # a TCP byte relay: the least work of an intermediary
WAKEUP_SOURCE = HERE / "wakeup.c"  # what one process waking another costs here
CLIENT_LOAD = HERE / "client_load.py"  # the load client on qrouter.client (client_load.py)
CHECKOUT = HERE.parents[1] if (HERE.parents[1] / "setup.py").exists() else None
HOST = "127.0.0.1"
ROUTER_START_S = 20.0
ROUTER_STOP_S = 10.0
ATTACH_WAIT_S = 0.3  # receiver first; the router gives the sender credit only once it attached
IDLE10K = 10_000
MESH_FORM_S = 1.0  # two-hop: let the routers connect and exchange hellos first


class BenchError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    load: Path  # the amqp_load binary
    count: int
    repeat: int
    body: int
    credit: int
    rate: int
    idle_n: int
    logs: Path
    relay_spins: tuple[int, ...] = (0,)  # latency: the byte relays' spins, µs (0: none)
    # the guaranteed pubsub rows' messages a run (at most --count): short runs, comparable
    # with the rows of earlier sessions; a longer one includes the LMDB checkpoints' cost
    guaranteed_count: int = 20_000


@dataclass
class Run:
    """One load-client run: the sender and its receivers."""

    rate: float  # unsettled: sender, first send to last outcome; presettled: receiver span
    sent: int
    received: int
    other: int  # outcomes other than ACCEPTED
    p50: int
    p90: int
    p99: int
    router_cpu_s: float | None = None
    p999: int = 0
    recv_rate: float = 0.0  # the slowest receiver's: messages over its first → last arrival
    # accept latency (unsettled senders): its transfer → its outcome arriving, µs
    acc_p50: int = 0
    acc_p90: int = 0
    acc_p99: int = 0
    sender_cpu_s: float = 0.0  # the sender process's own CPU (its cpu_s)
    # seconds the routers' threads were runnable but waiting for a CPU (schedstat): a run
    # slowed by other processes on the machine, not by the routers (issue 15's slow runs)
    router_wait_s: float | None = None
    # the routers' (or relays') voluntary context switches over the run (Router.wakeups)
    router_wakeups: int | None = None
    # each router's own time on a CPU over the run, s (the triangle's A, B, C; schedstat's,
    # to the ns: the clock ticks of router_cpu_s are 0.5 µs a message at 20,000 messages)
    router_cpu_each: list[float] = field(default_factory=list)


@dataclass
class Row:
    scenario: str
    msgs_per_s: float | None = None
    ratio: float | None = None
    p50_us: int | None = None
    p90_us: int | None = None
    p99_us: int | None = None
    loss: int | None = None
    router_cpu_us_per_msg: float | None = None
    router_rss_mib: float | None = None
    accept_p50_us: int | None = None  # the publisher's send → outcome (mesh-accept-latency*)
    accept_p99_us: int | None = None
    note: str = ""
    runs: list[float] = field(default_factory=list)  # msg/s of every repeat
    runs_router_wait_s: list[float] = field(default_factory=list)  # Run.router_wait_s of each

    @property
    def us_per_msg(self) -> float | None:
        return 1e6 / self.msgs_per_s if self.msgs_per_s else None


# ---------------------------------------------------------------- processes and /proc


_handed_out: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one handed out before in this run.

    Nothing holds a port between calls, so the kernel may return the same one twice;
    a router given it for two listeners would refuse to start.
    """
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def listening(port: int) -> bool:
    """True when something listens on 127.0.0.1:port (read from /proc, so nothing connects)."""
    want = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        return any(
            p[1] == want and p[3] == "0A" for p in (line.split() for line in f) if len(p) > 3
        )


def wait_listening(port: int, proc: subprocess.Popen[Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if listening(port):
            return True
        time.sleep(0.01)
    return False


def stop(proc: subprocess.Popen[bytes], timeout: float = ROUTER_STOP_S) -> bool:
    """SIGTERM, then SIGKILL after timeout; True when it stopped on SIGTERM."""
    if proc.poll() is not None:
        return True
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        return False


def tail(path: Path, lines: int = 2) -> str:
    """The last lines of a log that say something (not a traceback's ^^^ markers)."""
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    text = [t.strip() for t in text if t.strip(" ^~")]
    return " | ".join(text[-lines:])[-300:] or "(no output)"


class Router:
    """One router process: `python -m qrouter start` on a free loopback port."""

    what = "router"  # in the errors

    def __init__(self, logs: Path, name: str, *extra: str) -> None:
        self.port = free_port()
        slug = re.sub(r"[^\w.-]+", "-", name)
        self.log = logs / f"router-{slug}-{self.port}.log"
        listen = ["--listen", f"{HOST}:{self.port}"]
        self.args = [sys.executable, "-m", "qrouter", "start", *listen, "--log-level", "warning"]
        self.args += extra
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Router:
        env = dict(os.environ)
        if CHECKOUT:  # run the checkout's router, with its in-place built engine
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(CHECKOUT), env.get("PYTHONPATH")])
            )
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
            )
        if not wait_listening(self.port, self.proc, ROUTER_START_S):
            stop(self.proc)
            raise BenchError(f"{self.what} failed to start: {tail(self.log)}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        if not stop(self.proc):
            print(f"warning: router ignored SIGTERM for {ROUTER_STOP_S}s, killed", file=sys.stderr)

    def check(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise BenchError(f"{self.what} exited ({self.proc.returncode}): {tail(self.log)}")

    def cpu_s(self) -> float:
        """utime + stime of the router process (proc(5): fields 14 and 15 of stat)."""
        assert self.proc is not None
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def run_ns(self) -> int:
        """CPU time of all the router's threads so far, ns (proc(5): /proc/PID/task/*/schedstat)."""
        assert self.proc is not None
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread that ended meanwhile
        return total

    def wait_ns(self) -> int:
        """Time the router's threads spent runnable but waiting for a CPU so far, ns (the
        second field of /proc/PID/task/*/schedstat)."""
        assert self.proc is not None
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, ValueError, IndexError):
                pass  # a thread that ended meanwhile
        return total

    def wakeups(self) -> int:
        """Voluntary context switches of all the router's threads so far: each is a sleep (in
        epoll_wait, a lock, a blocking call) that a later wake-up ended (proc(5):
        /proc/PID/task/*/status). Over a run at a low rate it counts the router's wake-ups."""
        assert self.proc is not None
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
            except (OSError, ValueError, IndexError):
                pass  # a thread that ended meanwhile
        return total

    def settle_s(self, quiet_ms: float = 20, limit_s: float = 30) -> float:
        """Seconds until the router goes idle: less than 2% of a core over `quiet_ms`. A
        router that still works after the clients finished (the journal writer's backlog)
        has not finished the run."""
        start = last_busy = time.monotonic()
        before = self.run_ns()
        while time.monotonic() - start < limit_s:
            time.sleep(quiet_ms / 4000)
            now, used = time.monotonic(), self.run_ns()
            if used - before > quiet_ms * 1e6 / 4 * 0.02:
                last_busy = now
            before = used
            if now - last_busy >= quiet_ms / 1000:
                break
        return last_busy - start

    def rss_kib(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise BenchError("no VmRSS")

    def rss_split_kib(self) -> tuple[int, int]:
        """(RssAnon, RssFile + RssShmem) in KiB: the process's own memory, and the file
        pages mapped in (an LMDB store's memory map counts there)."""
        assert self.proc is not None
        anon = file = 0
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1])
            elif line.startswith(("RssFile:", "RssShmem:")):
                file += int(line.split()[1])
        return anon, file


class Relay(Router):
    """One byte_relay process (byte_relay.c) on a free loopback port, relaying each connection
    to 127.0.0.1:target; the same CPU and liveness readings as a router's."""

    what = "byte relay"

    def __init__(self, logs: Path, name: str, target: int, spin_us: int = 0) -> None:
        self.port = free_port()
        slug = re.sub(r"[^\w.-]+", "-", name)
        self.log = logs / f"relay-{slug}-{self.port}.log"
        self.args = [str(find_relay()), str(self.port), str(target), str(spin_us)]
        self.proc = None


# ---------------------------------------------------------------- the load client


def bench_bin_dir() -> Path:
    """Where the bench's C tools are compiled: tools/bench/bin/ in a checkout, else the cache."""
    if CHECKOUT:
        return HERE / "bin"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qrouter" / "bench"


def build_c(source: Path, name: str, link_options: list[list[str]]) -> Path:
    """`source` compiled with the system C compiler into bench_bin_dir()/name, unless the
    binary there is newer; each of `link_options` tried in turn. Raises BenchError."""
    cache = bench_bin_dir()
    binary = cache / name
    if binary.exists() and binary.stat().st_mtime >= source.stat().st_mtime:
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{name}.{os.getpid()}"  # then rename: concurrent builds stay safe
    err = ""
    for libs in link_options:
        cmd = [os.environ.get("CC", "cc"), "-O2", "-o", str(tmp), str(source), *libs]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            tmp.replace(binary)
            return binary
        err = done.stderr.strip()
    raise BenchError(f"cannot build {name}: {err[-300:]}")


def find_load_client(explicit: Path | None) -> Path:
    """The amqp_load binary: given, or compiled from amqp_load.c when missing or older."""
    if explicit:
        return explicit
    # Debian's libqpid-proton.so holds core and proactor; other builds split them.
    try:
        return build_c(
            SOURCE,
            "amqp_load",
            [["-lqpid-proton"], ["-lqpid-proton-proactor", "-lqpid-proton-core"]],
        )
    except BenchError as e:
        raise BenchError(f"{e} (needs cc and libqpid-proton-dev)") from None


def find_relay() -> Path:
    """The byte_relay binary (byte_relay.c: the floor of an intermediary, issue 18), compiled
    like amqp_load; it needs only the C library."""
    return build_c(RELAY_SOURCE, "byte_relay", [[]])


def find_wakeup() -> Path:
    """The wakeup binary (wakeup.c: one process waking another, the floor under a hop's added
    latency, issue 18), compiled like the relay."""
    return build_c(WAKEUP_SOURCE, "wakeup", [[]])


def _report(prefix: str, out: str) -> dict[str, str]:
    for line in out.splitlines():
        if line.startswith(prefix + " "):
            return dict(tok.split("=", 1) for tok in line.split()[1:] if "=" in tok)
    raise BenchError(f"load client printed no {prefix} line: {out.strip()[-300:]!r}")


def run_load(
    cfg: Config,
    port: int,
    addr: str,
    *,
    count: int,
    presettled: bool = False,
    rate: int = 0,
    receivers: int = 1,
    listen: bool = False,
    send_port: int | None = None,
    durable: bool = False,
    recv_ports: list[int] | None = None,
    attach_wait: float = 0.0,
    env: dict[str, str] | None = None,
    client: str | None = None,
) -> Run:
    """Start the receiver(s), then the sender; wait (bounded) for all of them. The sender
    connects to `send_port` when given (another router of a mesh), else to `port`; receiver i
    to recv_ports[i] when given. With `client` (plain, at-least-once or exactly-once) the
    clients are client_load.py on qrouter.client with that kind of links, not amqp_load."""
    timeout = 30 + count / 1000 + (count / rate if rate else 0)
    load = str(cfg.load)
    ports = recv_ports or [port]
    send = [load, "send", HOST, str(send_port or port), addr, str(count), str(cfg.body)]
    send.append(str(int(presettled)))
    send.append(str(rate))
    procs: list[subprocess.Popen[str]] = []
    ready: list[Path] = []  # client_load receivers create these once attached
    if client:
        env = client_env(env)
        py = [sys.executable, str(CLIENT_LOAD)]
        send = py + ["send", HOST, str(send_port or port), addr, str(count), str(cfg.body)]
        send += ["--mode", client, "--rate", str(rate), "--window", str(cfg.credit)]
    # AMQP_LOAD_DURABLE: the clients ask for unsettled-state durability (our copy of the tool)
    if durable:
        env = {**(env or os.environ), "AMQP_LOAD_DURABLE": "1"}
    try:
        for i in range(receivers):
            rport = str(ports[i % len(ports)])
            renv: dict[str, str] | None = env
            if receivers > 1:  # each its own link: distinct container-ids (amqp_load.c)
                renv = {**(env or os.environ), "AMQP_LOAD_CONTAINER": f"amqp-load-recv-{i}"}
            recv = [load, "recv", HOST, rport, addr, str(count), str(cfg.credit), str(cfg.body)]
            if client:
                ready.append(cfg.logs / f"ready-{addr}-{i}-{os.getpid()}-{time.monotonic_ns()}")
                recv = py + ["recv", HOST, rport, addr, str(count), str(cfg.credit)]
                recv += [str(cfg.body), "--mode", client, "--ready", str(ready[-1])]
                recv += ["--container", f"client-load-recv-{i}"]
            procs.append(
                subprocess.Popen(
                    recv + ["listen"] * listen,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=renv,
                )
            )
        if listen:
            wait_listening(port, procs[0], 5.0)
        else:
            wait_ready(ready, procs, 30.0)
            time.sleep(attach_wait or ATTACH_WAIT_S)
        procs.append(
            subprocess.Popen(
                send, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
            )
        )
        deadline = time.monotonic() + timeout
        outs = []
        for p in reversed(procs):  # sender first: receivers end at most 5 s after it
            try:
                outs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                raise BenchError(f"load client timed out after {timeout:.0f} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        for f in ready:
            f.unlink(missing_ok=True)
    return run_of(_report("SEND", outs[0]), [_report("RECV", o) for o in outs[1:]], presettled)


def run_of(sender: dict[str, str], recvs: list[dict[str, str]], presettled: bool) -> Run:
    """The Run of one sender's and its receivers' report lines (amqp_load or client_load.py;
    a sender's accept-latency fields may be missing: a line of an older amqp_load)."""
    received = sum(int(r["count"]) for r in recvs)
    if presettled:
        msgs_s = min(float(r["rate"]) for r in recvs)
    else:
        msgs_s = float(sender["rate"])
    worst = max(recvs, key=lambda r: int(r["p99"]))  # the slowest receiver's percentiles
    return Run(
        rate=msgs_s,
        sent=int(sender["count"]),
        received=received,
        other=int(sender["other"]),
        p50=int(worst["p50"]),
        p90=int(worst["p90"]),
        p99=int(worst["p99"]),
        p999=int(worst.get("p99.9", 0)),
        recv_rate=min(float(r["rate"]) for r in recvs),
        acc_p50=int(sender.get("acc_p50", 0)),
        acc_p90=int(sender.get("acc_p90", 0)),
        acc_p99=int(sender.get("acc_p99", 0)),
        sender_cpu_s=float(sender.get("cpu_s", 0)),
    )


def client_env(env: dict[str, str] | None) -> dict[str, str]:
    """The environment of a client_load.py process: a checkout's qrouter importable."""
    env = dict(env or os.environ)
    if CHECKOUT:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHECKOUT), env.get("PYTHONPATH")]))
    return env


def wait_ready(files: list[Path], procs: list[subprocess.Popen[str]], timeout: float) -> None:
    """Wait (bounded) until every client_load receiver has its link attached."""
    deadline = time.monotonic() + timeout
    while not all(f.exists() for f in files):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise BenchError(f"a client_load receiver did not attach within {timeout:.0f} s")
        time.sleep(0.02)


# ---------------------------------------------------------------- scenarios


class Bench:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rows: list[Row] = []
        self.baselines: dict[tuple[bool, int], Row] = {}
        self.durable_base: float | None = None  # memory-store rate of the durable scenario
        self.client_plain: float | None = None  # mesh-multicast-client's rate

    def median(
        self, name: str, runs: list[Run], base: Row | None, receivers: int = 1, rate: int = 0
    ) -> Row:
        """The median run: by msg/s, or by p99 latency at a fixed rate (where msg/s is set)."""
        run = sorted(runs, key=lambda r: r.p99 if rate else r.rate)[len(runs) // 2]
        row = Row(
            name,
            run.rate,
            p50_us=run.p50,
            p90_us=run.p90,
            p99_us=run.p99,
            loss=run.sent * receivers - run.received,
            runs=[round(r.rate) for r in runs],
            runs_router_wait_s=[
                round(r.router_wait_s, 2) for r in runs if r.router_wait_s is not None
            ],
        )
        if base and base.msgs_per_s and run.rate:
            row.ratio = run.rate / base.msgs_per_s
        if run.router_cpu_s is not None and run.sent:
            row.router_cpu_us_per_msg = run.router_cpu_s * 1e6 / run.sent
        if run.other:
            row.note = f"{run.other} not ACCEPTED"
        if run.acc_p99:
            row.accept_p50_us, row.accept_p99_us = run.acc_p50, run.acc_p99
        return row

    def direct(self, presettled: bool = False, rate: int = 0) -> Row:
        """The direct client-to-client run of the same invocation (cached per invocation)."""
        key = (presettled, rate)
        if key not in self.baselines:
            name = f"direct {'presettled' if presettled else 'unsettled'}"
            name += f" @{rate}/s" if rate else ""
            count = self.count(rate)
            try:
                runs = []
                for _ in range(self.cfg.repeat):
                    port = free_port()
                    run = run_load(
                        self.cfg,
                        port,
                        "bench",
                        count=count,
                        rate=rate,
                        listen=True,
                        presettled=presettled,
                    )
                    runs.append(run)
                row = self.median(name, runs, None, rate=rate)
            except BenchError as e:
                row = Row(name, note=f"failed: {e}")
            self.baselines[key] = row
            self.rows.append(row)
        return self.baselines[key]

    def count(self, rate: int) -> int:
        return min(self.cfg.count, rate * 10) if rate else self.cfg.count  # ≤ 10 s at a fixed rate

    def through_router(
        self,
        name: str,
        *,
        presettled: bool = False,
        rate: int = 0,
        receivers: int = 1,
        router_args: tuple[str, ...] = (),
        addr: str = "",
        durable: bool = False,
    ) -> Row:
        base = self.direct(presettled, rate)
        try:
            with Router(self.cfg.logs, name, *router_args) as router:
                runs = []
                for i in range(self.cfg.repeat):
                    cpu0 = router.cpu_s()
                    run = run_load(
                        self.cfg,
                        router.port,
                        addr or f"bench.{name}.{i}",
                        count=self.count(rate),
                        presettled=presettled,
                        rate=rate,
                        receivers=receivers,
                        durable=durable,
                    )
                    router.check()
                    run.router_cpu_s = router.cpu_s() - cpu0
                    runs.append(run)
                row = self.median(name, runs, base, receivers, rate)
                row.router_rss_mib = router.rss_kib() / 1024
        except BenchError as e:
            return Row(name, note=str(e))
        if rate:
            row.ratio = None  # a fixed rate: compare the latency with the direct row instead
        return row

    def two_hop(self, name: str, *, presettled: bool = False) -> Row:
        """Router chain A -> B (issue 4): the sender on A, the receiver on B."""
        base = self.direct(presettled)
        ir_port = free_port()
        try:
            with (
                Router(
                    self.cfg.logs,
                    name + " A",
                    "--id",
                    "A",
                    "--inter-router-listen",
                    f"{HOST}:{ir_port}",
                ) as a,
                Router(
                    self.cfg.logs,
                    name + " B",
                    "--id",
                    "B",
                    "--inter-router-connect",
                    f"{HOST}:{ir_port}",
                ) as b,
            ):
                time.sleep(MESH_FORM_S)
                runs = []
                for i in range(self.cfg.repeat):
                    cpu0 = a.cpu_s() + b.cpu_s()
                    run = run_load(
                        self.cfg,
                        b.port,
                        f"bench.{name}.{i}",
                        count=self.cfg.count,
                        presettled=presettled,
                        send_port=a.port,
                    )
                    a.check()
                    b.check()
                    run.router_cpu_s = a.cpu_s() + b.cpu_s() - cpu0
                    runs.append(run)
                row = self.median(name, runs, base)
                row.router_rss_mib = (a.rss_kib() + b.rss_kib()) / 1024
        except BenchError as e:
            return Row(name, note=str(e))
        return row

    @contextmanager
    def triangle_routers(
        self, name: str, spec: str, store: str | None = None
    ) -> Iterator[tuple[Router, Router, Router]]:
        """Routers A, B, C connected to each other, the address entry `bench.t=<spec>`
        (multicast, maybe with a guarantee), the mesh formed."""
        ports = [free_port() for _ in range(3)]
        args: list[list[str]] = []
        for i, rid in enumerate("ABC"):
            opts = ["--id", rid, "--inter-router-listen", f"{HOST}:{ports[i]}"]
            if i:
                opts += ["--inter-router-connect", ",".join(f"{HOST}:{p}" for p in ports[:i])]
            opts += ["--address", f"bench.t={spec}"]
            if store:
                folder = re.sub(r"[^\w.-]+", "-", f"{name}-{rid}")  # a name may hold "/"
                opts += ["--store", store, "--store-path", str(self.cfg.logs / folder)]
            args.append(opts)
        with (
            Router(self.cfg.logs, name + " A", *args[0]) as a,
            Router(self.cfg.logs, name + " B", *args[1]) as b,
            Router(self.cfg.logs, name + " C", *args[2]) as c,
        ):
            time.sleep(MESH_FORM_S * 2)
            yield a, b, c

    def triangle_round(
        self,
        routers: tuple[Router, Router, Router],
        addr: str,
        count: int,
        *,
        rate: int = 0,
        client: str | None = None,
    ) -> Run:
        """One run on the triangle: the sender on A, one receiver on each router (amqp_load,
        or client_load.py with `client`'s kind of links), as fast as it goes or at `rate`."""
        a, b, c = routers
        each0 = [r.run_ns() for r in routers]
        cpu0 = a.cpu_s() + b.cpu_s() + c.cpu_s()
        wait0 = a.wait_ns() + b.wait_ns() + c.wait_ns()
        run = run_load(
            self.cfg,
            a.port,
            addr,
            count=count,
            rate=rate,
            receivers=3,
            recv_ports=[a.port, b.port, c.port],
            attach_wait=MESH_FORM_S * 1.5,  # subscribers known everywhere first
            client=client,
        )
        for r in routers:
            r.check()
        run.router_cpu_each = [
            (r.run_ns() - c0) / 1e9 for r, c0 in zip(routers, each0, strict=True)
        ]
        run.router_cpu_s = a.cpu_s() + b.cpu_s() + c.cpu_s() - cpu0
        run.router_wait_s = (a.wait_ns() + b.wait_ns() + c.wait_ns() - wait0) / 1e9
        return run

    def triangle(
        self,
        name: str,
        spec: str,
        *,
        count: int,
        store: str | None = None,
        client: str | None = None,
        runs: list[Run] | None = None,
    ) -> Row:
        """The triangle's rate: `repeat` runs, each on an address of its own (appended to
        `runs` when given)."""
        base = self.direct(False)
        runs = [] if runs is None else runs
        try:
            with self.triangle_routers(name, spec, store) as routers:
                for i in range(self.cfg.repeat):
                    runs.append(self.triangle_round(routers, f"bench.t.{i}", count, client=client))
                row = self.median(name, runs, base, receivers=3)
                row.router_rss_mib = sum(r.rss_kib() for r in routers) / 1024
        except BenchError as e:
            return Row(name, note=str(e))
        return row

    def idle(
        self, name: str, warm: tuple[int, int], load: tuple[int, int]
    ) -> tuple[Row, dict[str, Any]]:
        """RSS of the router before and after opening load=(connections, links each) idle.
        The connections all come from one host and user, and may be more than the default
        limits allow (docs/configuration.md, [limits]): those limits are off here."""
        unlimited = [
            "--limit=max_connections=0",
            "--limit=max_connections_per_host=0",
            "--limit=max_connections_per_user=0",
            "--limit=max_links_per_connection=0",
            "--limit=max_connection_rate_per_host=0",
        ]
        with Router(self.cfg.logs, name, *unlimited) as router, IdleClient(router.port) as client:
            client.open(*warm)  # the first connections import and allocate once-only things
            time.sleep(0.5)
            rss0 = router.rss_kib()
            answer = client.open(*load)
            time.sleep(0.5)
            router.check()
            rss1 = router.rss_kib()
        answer["delta_kib"] = rss1 - rss0
        return Row(name, router_rss_mib=rss1 / 1024), answer


class IdleClient:
    """idle_client.py in a subprocess, driven over its stdin/stdout."""

    def __init__(self, port: int) -> None:
        self.args = [sys.executable, str(HERE / "idle_client.py"), HOST, str(port), "--hold", "300"]
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> IdleClient:
        self.proc = subprocess.Popen(
            self.args, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        with suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def open(self, conns: int, links: int, timeout: float = 180.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"open {conns} {links}\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise BenchError(f"idle client: no answer in {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError(f"idle client exited ({self.proc.wait(5)})")
        answer: dict[str, Any] = json.loads(line)
        if answer["failed"]:
            raise BenchError(f"{answer['failed']}/{conns} connections failed: {answer['error']}")
        return answer


def pending(name: str, issue: int) -> Callable[[Bench], Row]:
    """A scenario of issue 8 that needs router features still to come: listed, not faked."""
    return lambda b: Row(name, note=f"n/a (needs issue {issue})")


def one_hop(presettled: bool) -> Callable[[Bench], Row]:
    def scenario(b: Bench) -> Row:
        name = f"one-hop {'presettled' if presettled else 'unsettled'}"
        row = b.through_router(name, presettled=presettled)
        row.note = row.note or f"target ≥ 0.30{' with zero loss' if presettled else ''}"
        return row

    return scenario


def journal_on() -> Callable[[Bench], Row]:
    """One hop, unsettled, with the delivery journal on at full rate (issue 7: it may cost at
    most 15% of the journal-off one-hop rate, measured in the same invocation).

    Two routers run side by side, one with the journal, and the runs alternate between them
    (off, on, off, on ...), so a slower stretch of a shared VM weighs on both figures alike.
    Each run moves 5 × --count messages: the journal's batches (65,536 rows) and segment
    files are then many per run, as in a steady stream, not one or two."""

    def scenario(b: Bench) -> Row:
        base = b.direct()
        count = b.cfg.count * 5
        names = ("one-hop unsettled, journal off", "one-hop unsettled, journal on")
        runs: dict[str, list[Run]] = {name: [] for name in names}
        drain: dict[str, list[float]] = {name: [] for name in names}
        try:
            with (
                Router(b.cfg.logs, names[0]) as off,
                Router(b.cfg.logs, names[1], "--journal", str(b.cfg.logs / "journal")) as on,
            ):
                for i in range(b.cfg.repeat):
                    for name, router in zip(names, (off, on), strict=True):
                        cpu0 = router.cpu_s()
                        run = run_load(b.cfg, router.port, f"bench.journal.{i}", count=count)
                        router.check()
                        # the writer thread may still be encoding when the clients are
                        # done: the run lasts until the router is idle, and its CPU counts
                        tail_s = router.settle_s()
                        if run.rate:
                            run.rate = count / (count / run.rate + tail_s)
                        run.router_cpu_s = router.cpu_s() - cpu0
                        runs[name].append(run)
                        drain[name].append(tail_s)
                rss = {name: r.rss_kib() / 1024 for name, r in zip(names, (off, on), strict=True)}
        except BenchError as e:
            return Row(names[1], note=str(e))
        rows = []
        for name in names:
            row = b.median(name, runs[name], base)
            row.router_rss_mib = rss[name]
            rows.append(row)
        off_row, row = rows
        b.rows.append(off_row)  # its router CPU µs/msg is the other half of the comparison
        if row.msgs_per_s and off_row.msgs_per_s:
            cost = 1 - row.msgs_per_s / off_row.msgs_per_s
            row.note = row.note or (
                f"{cost:+.0%} vs journal off ({off_row.msgs_per_s:,.0f}); ≤ 15%; "
                f"{count:,} msgs a run, alternating; the router busy "
                f"{1e3 * statistics.median(drain[names[1]]):.0f} ms after a run "
                f"({1e3 * statistics.median(drain[names[0]]):.0f} without the journal), "
                "counted in the rate"
            )
        return row

    return scenario


def durable_links(store: str) -> Callable[[Bench], Row]:
    """One hop, unsettled, both links asking for terminus durability 2 (issue 3): the router
    records every delivery in the store (group commit per loop iteration, batched sync). The
    memory store grants durability 0, so its row is the baseline the others are held to."""

    def scenario(b: Bench) -> Row:
        name = f"one-hop durable links, {store} store"
        args: tuple[str, ...] = ()
        if store != "memory":
            args = ("--store", store, "--store-path", str(b.cfg.logs / f"{store}-store"))
        row = b.through_router(name, router_args=args, durable=True)
        if store == "memory":
            b.durable_base = row.msgs_per_s
        elif row.msgs_per_s and b.durable_base:
            row.note = row.note or f"{row.msgs_per_s / b.durable_base:.2f} of memory; target ≥ 0.5"
        return row

    return scenario


def two_hop(presettled: bool) -> Callable[[Bench], Row]:
    def scenario(b: Bench) -> Row:
        name = f"two-hop {'presettled' if presettled else 'unsettled'}"
        row = b.two_hop(name, presettled=presettled)
        row.note = row.note or "chain A→B; CPU and RSS of both routers; target ≥ 0.10"
        return row

    return scenario


def dead_letter_set(b: Bench) -> Row:
    """One hop, unsettled, to an address whose entry has a `dead_letter` (docs/brokers.md):
    every message is accepted, so this is the price of the setting itself, the router keeping
    each message's bytes until its outcome, against the one-hop-unsettled row."""
    conf = b.cfg.logs / "dead-letter.toml"
    conf.write_text(
        '[[address]]\nprefix = "bench.dl"\ndistribution = "balanced"\ndead_letter = "bench.dlq"\n'
    )
    row = b.through_router(
        "one-hop unsettled, dead_letter set",
        addr="bench.dl.q",
        router_args=("--config", str(conf)),
    )
    row.note = row.note or "vs one-hop unsettled: the copy kept per message"
    return row


def multicast(b: Bench) -> Row:
    row = b.through_router(
        "multicast 1→3",
        receivers=3,
        addr="bench.multicast",
        router_args=("--address", "bench.multicast=multicast"),
    )
    row.note = row.note or "msg/s in; each message delivered 3 times"
    return row


def pubsub(guarantee: str | None, store: str | None = None) -> Callable[[Bench], Row]:
    """Issue 5: 1 publisher -> 3 subscribers on 3 routers (a triangle), plain multicast or a
    topic with a guarantee. The guaranteed rows run `--guaranteed-count` messages (20,000 by
    default, as in earlier sessions' tables); a longer run also pays for the record log's
    checkpoints and reads steadier (docs/exactly-once.md)."""

    def scenario(b: Bench) -> Row:
        what = guarantee or "plain multicast"
        name = f"1→3 on 3 routers, {what}" + (f", {store} store" if store else "")
        spec = "multicast" + (f",{guarantee}" if guarantee else "")
        count = b.cfg.count if guarantee is None else min(b.cfg.count, b.cfg.guaranteed_count)
        runs: list[Run] = []
        row = b.triangle(name, spec, count=count, store=store, runs=runs)
        row.note = row.note or (
            f"msg/s in ({count:,} msgs); CPU and RSS of the 3 routers; receivers settle first"
            + _cpu_split(runs)
        )
        return row

    return scenario


def _cpu_split(runs: list[Run]) -> str:
    """Each router's CPU µs per message (A, the sender's; B; C; from schedstat, to the ns),
    the median over the runs of each, for a note: the row's figure (clock ticks) splits so."""
    done = [r for r in runs if r.sent and len(r.router_cpu_each) == 3]
    if not done:
        return ""
    per = [statistics.median(r.router_cpu_each[i] * 1e6 / r.sent for r in done) for i in range(3)]
    return "; A / B / C " + " / ".join(f"{x:.1f}" for x in per) + " µs/msg"


def pubsub_client(guarantee: str | None, store: str | None = None) -> Callable[[Bench], Row]:
    """Issue 15, item 2: the pubsub rows with qrouter.client at both ends (client_load.py,
    one process per client as amqp_load): the links an application of that kind uses —
    plain: durability 0; at-least-once: durable links, resumed on reconnect; exactly-once:
    durable links with receiver-settle-mode second. The publisher keeps `--credit`
    deliveries unsettled at most."""

    def scenario(b: Bench) -> Row:
        what = guarantee or "plain multicast"
        name = f"1→3 on 3 routers, {what}" + (f", {store} store" if store else "")
        name += ", qrouter.client"
        spec = "multicast" + (f",{guarantee}" if guarantee else "")
        count = b.cfg.count if guarantee is None else min(b.cfg.count, b.cfg.guaranteed_count)
        runs: list[Run] = []
        row = b.triangle(
            name, spec, count=count, store=store, client=guarantee or "plain", runs=runs
        )
        if guarantee is None:
            b.client_plain = row.msgs_per_s
        of_plain = ""
        if guarantee and row.msgs_per_s and b.client_plain:
            of_plain = f"; {row.msgs_per_s / b.client_plain:.3f} of plain multicast (client)"
        # the publisher's own CPU per message: a Python client may be what limits the rate
        pub = (
            statistics.median(r.sender_cpu_s * 1e6 / r.sent for r in runs if r.sent) if runs else 0
        )
        # a slow run with long waits was short of CPU (other processes), not stalled
        waits = " / ".join(f"{w:.1f}" for w in row.runs_router_wait_s)
        row.note = row.note or (
            f"msg/s in ({count:,} msgs){of_plain}; CPU and RSS of the 3 routers; "
            f"publisher CPU {pub:.0f} µs/msg; runs {' / '.join(f'{r:.0f}' for r in row.runs)}"
            f" msg/s, routers waited for a CPU {waits} s"
        )
        return row

    return scenario


# the rows of the accept-latency scenarios: (guarantee, store)
ACCEPT_ROWS: tuple[tuple[str | None, str | None], ...] = (
    (None, None),
    ("at-least-once", None),
    ("exactly-once", None),
    ("exactly-once", "lmdb"),
)
ACCEPT_P99_TARGET_US = 5_000  # issue 15, item 2: at 2,000 msg/s


def accept_latency(client: bool) -> Callable[[Bench], None]:
    """Issue 15, item 2: the publisher's accept latency (its transfer → the outcome arriving,
    timed by the sender) on the triangle at a fixed `--rate` (10 s of messages), plain
    multicast, at-least-once and exactly-once (memory, LMDB), beside the direct run at that
    rate; amqp_load (settle-first publisher) or, with `client`, client_load.py. The median of
    the runs by accept p99; the p50–p99 columns are the subscribers' one-way latency."""

    def scenario(b: Bench) -> None:
        rate = b.cfg.rate
        direct = b.direct(False, rate)
        if direct.accept_p99_us and not direct.note:
            direct.note = f"accept p50 / p99 {direct.accept_p50_us} / {direct.accept_p99_us} µs"
        for guarantee, store in ACCEPT_ROWS:
            b.rows.append(_accept_row(b, guarantee, store, rate, client))

    return scenario


def _accept_row(b: Bench, guarantee: str | None, store: str | None, rate: int, client: bool) -> Row:
    name = f"1→3 on 3 routers, {guarantee or 'plain multicast'}"
    name += (f", {store} store" if store else "") + f" @{rate}/s"
    name += ", qrouter.client" if client else ""
    spec = "multicast" + (f",{guarantee}" if guarantee else "")
    mode = (guarantee or "plain") if client else None
    try:
        with b.triangle_routers(name, spec, store) as routers:
            runs = [
                b.triangle_round(routers, f"bench.t.{i}", b.count(rate), rate=rate, client=mode)
                for i in range(b.cfg.repeat)
            ]
            rss = sum(r.rss_kib() for r in routers) / 1024
    except BenchError as e:
        return Row(name, note=str(e))
    median = sorted(runs, key=lambda r: r.acc_p99)[len(runs) // 2]
    row = b.median(name, [median], None, receivers=3, rate=rate)
    row.runs = [round(r.rate) for r in runs]
    row.router_rss_mib = rss
    row.note = row.note or (
        f"accept p50 / p90 / p99 {median.acc_p50} / {median.acc_p90} / {median.acc_p99} µs"
        f" (target p99 ≤ {ACCEPT_P99_TARGET_US:,}); accept p99 of each run "
        + " / ".join(str(r.acc_p99) for r in runs)
    )
    return row


EO_RSS_TOTAL = 1_000_000  # guaranteed messages over the whole run (issue 15, item 3)
EO_RSS_ROUND = 100_000  # messages per round; the RSS of each router is read after each
# a second reading this long after each round's routers went idle, once the round's last
# records are freed (the subscribers' routers free a local record only when the origin's
# forget arrives, a PING barrier later: 1 to 3 ticks of 0.25 s) and a heap trim passed (every
# second, heap_trim.py): what the router keeps, not what it holds in flight; the row's growth
# is computed from these. A fixed delay after the clients ended was not enough on a loaded
# machine: a router still working through its backlog read as much as at once.
EO_RSS_DRAIN_S = 3.0
EO_RSS_QUIET_MS = 100  # idle: under 2% of a core over this long (Router.settle_s) ...
EO_RSS_SETTLE_LIMIT_S = 30.0  # ... waited for this long at most
EO_RSS_WARM_ROUNDS = 1  # rounds of warm-up, left out of the growth


def rss_growth(readings: list[list[float]], warm: int = EO_RSS_WARM_ROUNDS) -> list[float]:
    """Each router's growth over the rounds after the `warm` first: the rise of a line fitted
    to its RSS readings over those rounds, relative to where the line starts. The line is
    Theil-Sen's: its slope the median of the slopes between every two rounds, its start the
    median of the readings less the slope's part. `readings`: one list a round, one RSS a
    router.

    Why a fitted line, not the largest distance from the first round: a reading taken at once
    after a round holds the records still in flight, a few MiB that vary with the round's
    backlog, and the allocator's high-water (CPython's small-object arenas, 1 MiB each, are
    given back only when empty) steps up with the largest burst so far, bounded by it, not by
    the messages; one reading off either way moved the old figure by its whole size, and
    moves the medians here by little. Why not the medians of the two halves: they are half
    the span apart, so a steady rise counted for about half of itself (2 MiB a round on
    100 MiB read +9.5% against +15.7% from the first round after the warm-up to the last)."""
    after = readings[warm:]
    n = len(after)
    if n < 2:
        raise ValueError("rss_growth: at least two rounds after the warm-up")
    growth = []
    for i in range(len(readings[0])):
        ys = [r[i] for r in after]
        slope = statistics.median(
            (ys[k] - ys[j]) / (k - j) for j in range(n) for k in range(j + 1, n)
        )
        start = statistics.median(y - slope * x for x, y in enumerate(ys))
        growth.append(slope * (n - 1) / start)
    return growth


def rss_spread(readings: list[list[float]], warm: int = EO_RSS_WARM_ROUNDS) -> list[float]:
    """Each router's (largest − smallest) / smallest RSS over the rounds after the warm-up."""
    after = readings[warm:]
    return [
        (max(r[i] for r in after) - min(r[i] for r in after)) / min(r[i] for r in after)
        for i in range(len(readings[0]))
    ]


def rss_drift_from_first(readings: list[list[float]]) -> list[float]:
    """Each router's largest |RSS − round 1's| / round 1's: the row's figure before the
    growth above (kept in the note, so that the two can be compared)."""
    first = readings[0]
    return [max(abs(r[i] - first[i]) / first[i] for r in readings[1:]) for i in range(len(first))]


def eo_rss(store: str | None = None) -> Callable[[Bench], Row]:
    """Issue 15, item 3: the routers' RSS stays flat (±10%) over 1,000,000 exactly-once
    messages on one topic of the triangle after a first round of warm-up. Rounds of
    EO_RSS_ROUND messages (`--count` when smaller), fresh clients each round. The row's
    figure is `rss_growth` of the readings EO_RSS_DRAIN_S after the routers went idle, the
    largest of A/B/C; the note also gives it for the readings at once, the spread, and the
    older largest drift from round 1 (`rss_drift_from_first`)."""

    def scenario(b: Bench) -> Row:
        return _eo_rss(b, store)

    return scenario


def _eo_rss(b: Bench, store: str | None) -> Row:
    name = "1→3 on 3 routers, exactly-once, " + (f"{store} store, " if store else "") + "RSS"
    per_round = min(b.cfg.count, EO_RSS_ROUND)
    rounds = max(2, -(-EO_RSS_TOTAL // per_round)) if per_round == EO_RSS_ROUND else 3
    samples: list[list[float]] = []
    drained: list[list[float]] = []
    splits: list[list[tuple[int, int]]] = []  # (RssAnon, RssFile) KiB of A/B/C per round
    runs: list[Run] = []
    try:
        with b.triangle_routers(name, "multicast,exactly-once", store) as routers:
            for _ in range(rounds):
                runs.append(b.triangle_round(routers, "bench.t.rss", per_round))
                samples.append([r.rss_kib() / 1024 for r in routers])
                splits.append([r.rss_split_kib() for r in routers])
                busy = max(r.settle_s(EO_RSS_QUIET_MS, EO_RSS_SETTLE_LIMIT_S) for r in routers)
                time.sleep(EO_RSS_DRAIN_S)
                drained.append([r.rss_kib() / 1024 for r in routers])
                print(
                    f"  round {len(samples)}/{rounds}: RSS A/B/C "
                    + " / ".join(f"{x:.1f}" for x in samples[-1])
                    + f" MiB; busy up to {busy:.1f} s more, {EO_RSS_DRAIN_S:.0f} s after idle "
                    + " / ".join(f"{x:.1f}" for x in drained[-1])
                    + "; anon+file "
                    + " / ".join(f"{a / 1024:.1f}+{f / 1024:.1f}" for a, f in splits[-1]),
                    file=sys.stderr,
                    flush=True,
                )
    except BenchError as e:
        return Row(name, note=str(e))
    warm = samples[0]
    growth, spread = rss_growth(drained), rss_spread(drained)
    drift, ddrift = rss_drift_from_first(samples), rss_drift_from_first(drained)
    rates = [r.rate for r in runs if r.rate]
    row = Row(name, msgs_per_s=statistics.median(rates) if rates else None)
    row.loss = sum(r.sent * 3 - r.received for r in runs)
    row.router_rss_mib = sum(samples[-1])
    row.note = (
        f"{rounds} rounds × {per_round:,} msgs; RSS A/B/C after round 1 "
        + " / ".join(f"{x:.1f}" for x in warm)
        + ", after the last "
        + " / ".join(f"{x:.1f}" for x in samples[-1])
        + f" MiB; growth after {EO_RSS_WARM_ROUNDS} round(s) of warm-up, read "
        + f"{EO_RSS_DRAIN_S:.0f} s after the routers went idle (the rise of a Theil-Sen line"
        + " over the rounds, over its start) A/B/C "
        + " / ".join(f"{g:+.1%}" for g in growth)
        + f", largest {max(growth, key=abs):+.1%} (target within ±10%); spread "
        + " / ".join(f"{x:.1%}" for x in spread)
        + f"; read at once: growth {max(rss_growth(samples), key=abs):+.1%}, spread "
        + f"{max(rss_spread(samples)):.1%}; largest drift from round 1 (the older figure) "
        + f"{max(drift):.1%} at once, {max(ddrift):.1%} idle"
        + _rss_split_note(splits)
    )
    return row


def _rss_split_note(splits: list[list[tuple[int, int]]]) -> str:
    """RssAnon (the router's own memory) and RssFile (mapped file pages: an LMDB store's
    map) of A/B/C after round 1 and after the last, and the anon part's largest drift."""
    if len(splits) < 2:
        return ""
    warm, last = splits[0], splits[-1]
    adrift = max(abs(s[i][0] - warm[i][0]) / warm[i][0] for s in splits[1:] for i in range(3))

    def mib(row: list[tuple[int, int]]) -> str:
        return " / ".join(f"{a / 1024:.1f}+{f / 1024:.1f}" for a, f in row)

    return (
        f"; RssAnon+RssFile A/B/C after round 1 {mib(warm)}, after the last {mib(last)} MiB"
        f" (RssAnon's largest drift {adrift:.1%})"
    )


def latency(b: Bench) -> None:
    """One-way latency at --rate: direct, byte relays and qrouter, one hop and two hops,
    alternating (latency.py)."""
    import importlib

    importlib.import_module(f"{__package__}.latency" if __package__ else "latency").latency(
        b, sys.modules[__name__]
    )


def sweep(b: Bench) -> None:
    """Latency across the load range, one hop and two hops beside direct (sweep.py)."""
    import importlib

    importlib.import_module(f"{__package__}.sweep" if __package__ else "sweep").sweep(
        b, sys.modules[__name__]
    )


def broker(b: Bench) -> Row | None:
    """Issue 17: producer → router → RabbitMQ queue → router → consumer beside the same
    clients on the broker directly (broker.py); skipped when RabbitMQ is not installed."""
    import importlib

    module = importlib.import_module(f"{__package__}.broker" if __package__ else "broker")
    row: Row | None = module.broker(b, sys.modules[__name__])
    return row


def idle_connections(b: Bench) -> Row:
    n = b.cfg.idle_n
    try:
        row, answer = b.idle("idle connections", (50, 0), (n, 0))
    except BenchError as e:
        return Row("idle connections", note=str(e))
    row.note = f"{answer['delta_kib'] / n:.1f} KiB per idle connection (N={n}; target ≤ 20)"
    return row


def idle_links(b: Bench) -> Row:
    n = b.cfg.idle_n
    try:
        row, answer = b.idle("idle links", (1, 50), (1, n))
    except BenchError as e:
        return Row("idle links", note=str(e))
    row.note = (
        f"{answer['delta_kib'] / n:.2f} KiB per idle link (N={n} on 1 connection; target ≤ 2)"
    )
    return row


def idle10k(b: Bench) -> Row:
    name = f"{IDLE10K} idle connections"
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE10K + 200:
        return Row(name, note=f"n/a: RLIMIT_NOFILE hard limit {hard} < {IDLE10K + 200}")
    try:
        row, answer = b.idle(name, (10, 0), (IDLE10K, 0))
    except BenchError as e:
        return Row(name, note=str(e))
    row.note = (
        f"all open in {answer['secs']:.1f} s; "
        f"{answer['delta_kib'] / IDLE10K:.1f} KiB per connection"
    )
    return row


ABUSE_RSS_MIB = 256  # the stated bound on the router's RSS while it is being abused
ABUSE_EACH = 4  # clients of each of abusers.py's five kinds: 20 in all
ABUSE_KINDS = "nest,storm,loris,stall,password"  # --abuse-kinds: which of them run
# The abusers connect from another host than the stream: 127.0.0.2, still loopback. Per-host
# bounds (connection rate, connections per host, login backoff) then meet them and not the
# stream; from one shared address they would refuse the stream's connections as well.
ABUSE_SOURCE = "127.0.0.2"


def _start_abusers(port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "abusers.py"), HOST, str(port)]
        + ["--seconds", "600", "--each", str(ABUSE_EACH), "--kinds", ABUSE_KINDS]
        + ["--source", ABUSE_SOURCE],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _stop_abusers(abusers: subprocess.Popen[str]) -> dict[str, int]:
    """Stop the abusers (bounded waits) and return their report: what each kind did."""
    abusers.send_signal(signal.SIGTERM)
    try:
        out = abusers.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        abusers.kill()
        out = abusers.communicate(timeout=5)[0]
    lines = out.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else {}
    except ValueError:
        report = {}
    return {k: v for k, v in report.items() if isinstance(v, int)}


def abuse(b: Bench) -> Row:
    """Issue 13: one well-behaved one-hop stream (unsettled, 5 × --count messages a run) on a
    router, alone and beside 20 abusive clients in turns (tools/bench/abusers.py: deep
    nesting, attach storms, slow-loris, stalled consumers fed at full speed, wrong passwords).
    The stream should keep ≥ 0.8 of its calm rate and lose nothing; the router's RSS, sampled
    every 50 ms all along, stays under ABUSE_RSS_MIB."""
    if CHECKOUT and str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))  # the checkout's router package, as its routers use
    from qrouter.auth import hash_password

    name = "one-hop unsettled, 20 abusers"
    calm_name = "one-hop unsettled, calm (abuse baseline)"
    base = b.direct()
    count = b.cfg.count * 5
    users = b.cfg.logs / "abuse-users"
    users.write_text(f"bench:{hash_password('bench-secret')}\n")
    calm: list[Run] = []
    abused: list[Run] = []
    rss_max = 0
    stats: dict[str, int] = {}
    try:
        with Router(b.cfg.logs, name, "--users-file", str(users)) as router:
            stop_sampling = False

            def sample() -> None:
                nonlocal rss_max
                while not stop_sampling and router.proc and router.proc.poll() is None:
                    with suppress(BenchError, OSError):
                        rss_max = max(rss_max, router.rss_kib())
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                # calm and abused runs take turns, so that a change in what else the machine
                # runs moves both alike; the abusers start afresh before each abused run
                for i in range(b.cfg.repeat):
                    cpu0 = router.cpu_s()
                    calm.append(run_load(b.cfg, router.port, f"bench.calm.{i}", count=count))
                    calm[-1].router_cpu_s = router.cpu_s() - cpu0
                    abusers = _start_abusers(router.port)
                    try:
                        time.sleep(3.0)  # every abuser connected and at work
                        router.check()  # an abuser may have killed it
                        cpu0 = router.cpu_s()
                        run = run_load(b.cfg, router.port, f"bench.abused.{i}", count=count)
                        abused.append(run)
                        router.check()
                        abused[-1].router_cpu_s = router.cpu_s() - cpu0
                    finally:
                        for kind, n in _stop_abusers(abusers).items():
                            stats[kind] = stats.get(kind, 0) + n
            finally:
                stop_sampling = True
                sampler.join(5)
            router.check()
    except BenchError as e:
        return Row(name, note=str(e))
    calm_row = b.median(calm_name, calm, base)
    b.rows.append(calm_row)
    row = b.median(name, abused, base)
    row.router_rss_mib = rss_max / 1024
    if row.msgs_per_s and calm_row.msgs_per_s:
        kept = row.msgs_per_s / calm_row.msgs_per_s
        row.note = row.note or (
            f"{kept:.2f} of calm (target ≥ 0.8); RSS max {rss_max / 1024:.0f} MiB "
            f"(bound {ABUSE_RSS_MIB}); abusers: {json.dumps(stats) if stats else 'no report'}"
        )
    return row


def direct(b: Bench) -> None:
    b.direct(False)
    b.direct(True)


SCENARIOS: dict[str, Callable[[Bench], Row | None]] = {
    "direct": direct,
    "one-hop-unsettled": one_hop(False),
    "one-hop-presettled": one_hop(True),
    "two-hop-unsettled": two_hop(False),
    "two-hop-presettled": two_hop(True),
    "multicast": multicast,
    "dead-letter": dead_letter_set,
    "journal": journal_on(),
    "memory-durable": durable_links("memory"),
    "lmdb-durable": durable_links("lmdb"),
    "leveldb-durable": durable_links("leveldb"),
    "mesh-multicast": pubsub(None),
    "mesh-at-least-once": pubsub("at-least-once"),
    "mesh-exactly-once": pubsub("exactly-once"),
    "mesh-exactly-once-lmdb": pubsub("exactly-once", "lmdb"),
    "mesh-multicast-client": pubsub_client(None),
    "mesh-at-least-once-client": pubsub_client("at-least-once"),
    "mesh-exactly-once-client": pubsub_client("exactly-once"),
    "mesh-exactly-once-lmdb-client": pubsub_client("exactly-once", "lmdb"),
    "mesh-accept-latency": accept_latency(client=False),
    "mesh-accept-latency-client": accept_latency(client=True),
    "mesh-exactly-once-rss": eo_rss(),
    "mesh-exactly-once-lmdb-rss": eo_rss("lmdb"),
    "latency": latency,
    "sweep": sweep,
    "broker": broker,
    "idle-conn": idle_connections,
    "idle-link": idle_links,
    "idle10k": idle10k,
    "abuse": abuse,
}


# ---------------------------------------------------------------- output

COLUMNS = [
    "scenario",
    "msg/s",
    "µs/msg",
    "× direct",
    "p50 µs",
    "p90 µs",
    "p99 µs",
    "loss",
    "router CPU µs/msg",
    "router RSS MiB",
    "notes",
]


def cells(row: Row) -> list[str]:
    def fmt(v: float | None, spec: str) -> str:
        return "" if v is None else format(v, spec)

    return [
        row.scenario,
        fmt(row.msgs_per_s, ",.0f"),
        fmt(row.us_per_msg, ".2f"),
        fmt(row.ratio, ".2f" if (row.ratio or 1) >= 0.1 else ".3f"),
        fmt(row.p50_us, "d"),
        fmt(row.p90_us, "d"),
        fmt(row.p99_us, "d"),
        fmt(row.loss, ",d"),
        fmt(row.router_cpu_us_per_msg, ".2f"),
        fmt(row.router_rss_mib, ".1f"),
        row.note,
    ]


def print_table(rows: list[Row], title: str, markdown: bool) -> None:
    table = [cells(r) for r in rows]
    if markdown:
        print(f"{title}\n")
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "|".join([":---"] + ["---:"] * (len(COLUMNS) - 2) + [":---"]) + "|")
        for r in table:
            print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
        return
    try:  # rich when it is installed and the output is a terminal (piped: plain, unwrapped)
        if not sys.stdout.isatty():
            raise ImportError
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(c) for c in col) for col in zip(COLUMNS, *table, strict=True)]
        print(title)
        for r in [COLUMNS, ["-" * w for w in widths], *table]:
            line = [
                c.ljust(w) if i in (0, len(r) - 1) else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ]
            print("  ".join(line).rstrip())
        return
    t = Table(title=title)
    for i, c in enumerate(COLUMNS):
        t.add_column(c, justify="left" if i in (0, len(COLUMNS) - 1) else "right")
    for r in table:
        t.add_row(*r)
    Console().print(t)


def describe(cfg: Config) -> str:
    info = Path("/proc/cpuinfo").read_text().splitlines()
    models = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    cpu = models[0] if models else platform.machine()
    return (
        f"qrouter bench {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} × {cpu}, "
        f"Python {platform.python_version()}; {cfg.count:,} msgs × {cfg.body} B, "
        f"credit {cfg.credit}, median of {cfg.repeat}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument(
        "--scenarios",
        default="all",
        help=f"comma-separated, or all (but sweep, broker): {', '.join(SCENARIOS)}",
    )
    p.add_argument("--count", type=int, default=200_000, help="messages per run")
    p.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    p.add_argument(
        "--guaranteed-count",
        type=int,
        default=20_000,
        help="messages per run of the guaranteed mesh-* rows (at most --count)",
    )
    p.add_argument("--body", type=int, default=100, help="body size, bytes (≥ 8)")
    p.add_argument("--credit", type=int, default=1000, help="receiver credit window")
    p.add_argument(
        "--rate", type=int, default=2000, help="msg/s of latency and mesh-accept-latency*"
    )
    p.add_argument("--idle-n", type=int, default=1000, help="idle connections / links measured")
    p.add_argument("--abuse-kinds", default=None, help="the abuse scenario's abusers")
    p.add_argument("--amqp-load", type=Path, help="a prebuilt amqp_load binary")
    p.add_argument(
        "--relay-spin",
        default="0",
        help="latency: comma-separated spins of the byte relay rows, µs (0: no spin)",
    )
    p.add_argument("--json", type=Path, help="also write the rows to this file")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args(argv)
    if args.abuse_kinds:
        global ABUSE_KINDS
        ABUSE_KINDS = args.abuse_kinds
    # the sweep and the broker scenario take minutes (the broker one a RabbitMQ): only when named
    every = [n for n in SCENARIOS if n not in ("sweep", "broker")]
    names = every if args.scenarios == "all" else args.scenarios.split(",")
    if unknown := [n for n in names if n not in SCENARIOS]:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    # 10,000 connections need 10,000 descriptors in the router, which inherits this limit
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        load = find_load_client(args.amqp_load)
    except (BenchError, OSError, subprocess.SubprocessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="qrouter-bench-"))  # kept: logs explain failed rows
    try:
        spins = tuple(int(x) for x in args.relay_spin.split(","))
    except ValueError:
        p.error(f"--relay-spin: integers, comma-separated, not {args.relay_spin!r}")
    cfg = Config(
        load,
        args.count,
        args.repeat,
        args.body,
        args.credit,
        args.rate,
        args.idle_n,
        logs,
        spins,
        args.guaranteed_count,
    )
    bench = Bench(cfg)
    for name in names:
        print(f"… {name}", file=sys.stderr, flush=True)
        try:
            row = SCENARIOS[name](bench)
        except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
            row = Row(name, note=f"bench error: {e!r}")  # keep going: the table still prints
        if row:
            bench.rows.append(row)
    title = describe(cfg)
    if bench.rows or names != ["sweep"]:  # the sweep prints its own table
        print_table(bench.rows, title, args.markdown)
    print(f"router logs: {logs}", file=sys.stderr)
    if args.json:
        rows = [asdict(r) | {"us_per_msg": r.us_per_msg} for r in bench.rows]
        config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
        doc = {"title": title, "config": config, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
