"""The `latency` scenario (`run.py --scenarios latency --rate R`, issue 18): one-way latency at
a fixed rate through qrouter, one hop and two hops, beside a direct connection and beside the
same connection through one and two byte relays (byte_relay.c): the least work any
intermediary process can do, i.e. the floor of a router on this machine.

The kinds alternate (direct, relay, qrouter, relay × 2, qrouter × 2, then again `--repeat`
times) so that load from elsewhere on the machine falls on all alike; each row is the median
run by p99. The routers stay up for the whole scenario; a relay is started for each run
(it relays to that run's receiver) and its CPU is read, as a router's, from schedstat, and its
wake-ups (voluntary context switches, /proc/PID/task/*/status) as a router's: a row's note
gives them per message, so that a change in the wake-ups per message shows apart from a change
in the work per wake-up.

Each round of the alternation also measures what one process waking another costs on this
machine (wakeup.c: a pipe round trip between two processes pinned to two CPUs, halved, and
on one CPU): a message through any intermediary that sleeps between reads pays at least one
such wake-up more than direct, so the row beside direct says how much of the p50 target's
budget (0.3 × direct's p50 for one hop) the machine itself takes.
"""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from run import Bench, Row, Run  # type: ignore[import-not-found]

TARGET = "target p50 ≤ 1.3 × direct, p99 ≤ 2 × direct"
WAKE_ROUNDS = 20_000  # round trips per wake-up measurement: about 1.6 s across two CPUs
WAKE_TIMEOUT_S = 60.0


@dataclass
class Wake:
    """One measurement of wakeup.c: one-way µs across two CPUs, and p50 on one CPU."""

    cpus: tuple[int, int]
    p50: float
    p90: float
    p99: float
    same_p50: float


def measure_wake(m: ModuleType) -> Wake:
    """A wake-up across the first two CPUs this process may run on, and a switch on the first
    (wakeup.c). Raises BenchError (one CPU, no compiler, the tool failed)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise m.BenchError("one CPU: there is no wake-up across CPUs to measure")
    binary = str(m.find_wakeup())

    def once(a: int, b: int) -> dict[str, str]:
        args = [binary, str(WAKE_ROUNDS), str(a), str(b)]
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=WAKE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise m.BenchError(f"wakeup took over {WAKE_TIMEOUT_S:.0f} s") from None
        if done.returncode:
            raise m.BenchError(f"wakeup failed: {(done.stdout + done.stderr).strip()[-200:]}")
        return dict(m._report("WAKEUP", done.stdout))

    cross, same = once(cpus[0], cpus[1]), once(cpus[0], cpus[0])
    return Wake(
        (cpus[0], cpus[1]),
        float(cross["p50_us"]),
        float(cross["p90_us"]),
        float(cross["p99_us"]),
        float(same["p50_us"]),
    )


def wake_row(m: ModuleType, wakes: list[Wake], failed: str, direct: Run | None) -> Row:
    """The row beside direct: the median wake-up by p50, the p50 target's budget for a hop."""
    if not wakes:
        return m.Row("wake-up across CPUs (one way)", note=f"failed: {failed or 'no run'}")
    w = sorted(wakes, key=lambda x: x.p50)[len(wakes) // 2]
    name = f"wake-up across CPUs {w.cpus[0]} and {w.cpus[1]} (one way)"
    row = m.Row(name, p50_us=round(w.p50), p90_us=round(w.p90), p99_us=round(w.p99))
    notes = ["a pipe round trip between two pinned processes, halved (wakeup.c)"]
    notes.append(f"on one CPU {w.same_p50:.1f}")
    if len(wakes) > 1:
        notes.append("p50s " + "/".join(f"{x.p50:.1f}" for x in wakes))
    if direct is not None and direct.p50:
        budget = 0.3 * direct.p50
        notes.append(f"the p50 target leaves a hop 0.3 × direct p50 = {budget:.0f} µs")
    row.note = "; ".join(notes)
    return row


def kinds(spins: tuple[int, ...]) -> list[str]:
    """The rows' names in the order they alternate: relays of each spin before qrouter."""
    out = ["direct"]
    for hops in ("1 hop", "2 hops"):
        out += [relay_name(hops, s) for s in spins]
        out.append(f"qrouter ({hops})")
    return out


def median_run(rs: list[Run]) -> Run | None:
    """The run with the median p99 (a row's run), None without runs."""
    return sorted(rs, key=lambda r: r.p99)[len(rs) // 2] if rs else None


def relay_name(hops: str, spin: int) -> str:
    return f"relay ({hops})" + (f", spin {spin} µs" if spin else "")


def ratios(row: Run, base: Run | None, what: str) -> str:
    """'× direct p50 2.10 / p99 3.00' (empty without a base)."""
    if base is None or not base.p50 or not base.p99:
        return ""
    return f"× {what} p50 {row.p50 / base.p50:.2f} / p99 {row.p99 / base.p99:.2f}"


def latency(b: Bench, m: ModuleType) -> None:
    """`m` is run.py's module (a script's __main__ or the package's)."""
    cfg = b.cfg
    rate = cfg.rate
    count = b.count(rate)
    names = kinds(cfg.relay_spins)
    runs: dict[str, list[Run]] = {k: [] for k in names}
    failed: dict[str, str] = {}
    wakes: list[Wake] = []
    wake_failed = ""
    tag = iter(range(1_000_000))
    with ExitStack() as stack:
        routers = start_routers(m, cfg.logs, stack, failed)

        def once(kind: str) -> Run:
            addr = f"latency.{next(tag)}"
            if kind == "direct":
                return m.run_load(cfg, m.free_port(), addr, count=count, rate=rate, listen=True)
            if kind in routers:
                rs = routers[kind]
                ns0 = sum(r.run_ns() for r in rs)
                w0 = sum(r.wakeups() for r in rs)
                send = rs[0].port
                run = m.run_load(cfg, rs[-1].port, addr, count=count, rate=rate, send_port=send)
                for r in rs:
                    r.check()
                run.router_cpu_s = (sum(r.run_ns() for r in rs) - ns0) / 1e9
                run.router_wakeups = sum(r.wakeups() for r in rs) - w0
                return run
            return through_relays(b, m, kind, addr, count)

        for _ in range(cfg.repeat):
            if not wake_failed:
                try:
                    wakes.append(measure_wake(m))
                except m.BenchError as e:
                    wake_failed = str(e)
            for kind in names:
                if kind in failed:
                    continue
                try:
                    runs[kind].append(once(kind))
                except m.BenchError as e:
                    failed[kind] = str(e)
    rows = rows_of(m, rate, names, runs, failed)
    rows.insert(1, wake_row(m, wakes, wake_failed, median_run(runs["direct"])))
    b.baselines.setdefault((False, rate), rows[0])
    b.rows.extend(rows)


def start_routers(
    m: ModuleType, logs: Any, stack: ExitStack, failed: dict[str, str]
) -> dict[str, list[Any]]:
    """qrouter one hop, and A → B for two hops, kept up by `stack`; a router that does not
    start fails its kind's row (`failed`), not the others'."""
    routers: dict[str, list[Any]] = {}
    try:
        routers["qrouter (1 hop)"] = [stack.enter_context(m.Router(logs, "latency one hop"))]
    except m.BenchError as e:
        failed["qrouter (1 hop)"] = str(e)
    ir = f"{m.HOST}:{m.free_port()}"
    try:
        a = stack.enter_context(
            m.Router(logs, "latency A", "--id", "A", "--inter-router-listen", ir)
        )
        b = stack.enter_context(
            m.Router(logs, "latency B", "--id", "B", "--inter-router-connect", ir)
        )
        routers["qrouter (2 hops)"] = [a, b]
        time.sleep(m.MESH_FORM_S)  # let B connect to A and the two exchange hellos
    except m.BenchError as e:
        failed["qrouter (2 hops)"] = str(e)
    return routers


def through_relays(b: Bench, m: ModuleType, kind: str, addr: str, count: int) -> Run:
    """One run of a relay kind of this scenario (relay_name)."""
    hops = 2 if kind.startswith("relay (2") else 1
    return relay_run(m, b.cfg, hops, spin_of(kind, b.cfg.relay_spins), addr, count, b.cfg.rate)


def relay_run(
    m: ModuleType, cfg: Any, hops: int, spin: int, addr: str, count: int, rate: int
) -> Run:
    """One run through `hops` byte relays in series: sender → relay → (relay →) receiver, the
    relays started for it; their CPU (schedstat, as a router's) over the run in router_cpu_s."""
    recv_port = m.free_port()
    with ExitStack() as stack:
        target = recv_port
        relays: list[Any] = []
        for i in range(hops):  # the last relay first: each connects onward only when accepted
            relay = stack.enter_context(m.Relay(cfg.logs, f"relay {hops}.{i} {spin}", target, spin))
            relays.insert(0, relay)
            target = relay.port
        ns0 = sum(r.run_ns() for r in relays)
        w0 = sum(r.wakeups() for r in relays)
        run = m.run_load(
            cfg, recv_port, addr, count=count, rate=rate, listen=True, send_port=target
        )
        for r in relays:
            r.check()
        run.router_cpu_s = (sum(r.run_ns() for r in relays) - ns0) / 1e9
        run.router_wakeups = sum(r.wakeups() for r in relays) - w0
    return run


def spin_of(kind: str, spins: tuple[int, ...]) -> int:
    for hops in ("1 hop", "2 hops"):
        for s in spins:
            if relay_name(hops, s) == kind:
                return s
    return 0


def rows_of(
    m: ModuleType,
    rate: int,
    names: list[str],
    runs: dict[str, list[Run]],
    failed: dict[str, str],
) -> list[Row]:
    """One row per kind: the median run by p99; the note has p99.9, the ratios to direct and,
    for qrouter, to the relay without spin of the same number of hops."""
    median: dict[str, Run] = {}
    for k, rs in runs.items():
        if rs:
            median[k] = median_run(rs)
    rows = []
    for k in names:
        name = f"{k} unsettled @{rate:,}/s" if k == "direct" else f"{k} @{rate:,}/s"
        run = median.get(k)
        if run is None:
            rows.append(m.Row(name, note=f"failed: {failed.get(k, 'no run')}"))
            continue
        row = m.Row(name, run.rate, p50_us=run.p50, p90_us=run.p90, p99_us=run.p99)
        row.loss = run.sent - run.received
        row.runs = [round(r.rate) for r in runs[k]]
        if run.router_cpu_s is not None and run.sent:
            row.router_cpu_us_per_msg = run.router_cpu_s * 1e6 / run.sent
        notes: list[str] = [f"p99.9 {run.p999}"]
        if len(runs[k]) > 1:  # the row is the median run by p99: the other runs' p50s too
            notes.append("p50s " + "/".join(str(r.p50) for r in runs[k]))
        if k != "direct":
            notes.append(ratios(run, median.get("direct"), "direct"))
        if k.startswith("qrouter"):
            relay = median.get(relay_name(k[9:-1], 0))
            notes.append(ratios(run, relay, "relay"))
            if relay and relay.router_cpu_s and run.router_cpu_s:
                notes.append(f"CPU × relay {run.router_cpu_s / relay.router_cpu_s:.2f}")
            notes.append(TARGET if k == "qrouter (1 hop)" else "")
        if run.router_wakeups is not None and run.sent:
            # the intermediaries' (all hops') sleeps per message: the wake-ups they paid
            notes.append(f"wake-ups/msg {run.router_wakeups / run.sent:.2f}")
        if run.other:
            notes.append(f"{run.other} not ACCEPTED")
        row.note = "; ".join(n for n in notes if n)
        rows.append(row)
    return rows
